"""``%doctor [--until RUNG] <call>``: a thin front on :func:`opmagic.doctor` for a call from
the namespace, and ``--doctor [SAMPLES]`` of the cell magics, which diagnoses the op(s) the
cell just registered."""

from __future__ import annotations

import sys
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments
from IPython.display import display

from ..cells.cuda_kernel import CudaKernelResult
from ..cells.custom_op import CustomOpResult
from ..errors import OpmagicError
from ..native import LoadedLibrary
from ..verify.doctor import Diagnosis, doctor
from .arguments import (
    DOCTOR_LADDER_OPTIONS,
    doctor_keywords,
    evaluate,
    parse_options,
    with_options,
)
from .context import magic_context
from .dispatch import evaluate_call, split_options

_VALUED_OPTIONS = {option.flags[0] for option in DOCTOR_LADDER_OPTIONS}


@magics_class
class DoctorMagics(Magics):
    """The ``%doctor`` line magic."""

    @magic_arguments()
    @with_options(DOCTOR_LADDER_OPTIONS)
    @argument(
        "call",
        nargs="*",
        help="the call, as you would write it: my_op(x, y), torch.ops.ns.op(x)",
    )
    @line_magic
    def doctor(self, line: str) -> Diagnosis:
        """Diagnose the operator of a call: climb the doctor's ladder (schema vs behaviour,
        fake impl, autograd, gradients, opcheck, make_fx, torch.compile, export, AOTInductor,
        vmap) on the call's arguments, and name each root cause with its site and fix.

        Options lead the line, e.g. ``%doctor --until aot_eager my_op(x, y)``; pass tensors
        with requires_grad=True to check autograd. Returns the Diagnosis.
        """
        with magic_context("%doctor"):
            options_text, expression = split_options(line, _VALUED_OPTIONS)
            options = parse_options(self.doctor, options_text)
            op, args, kwargs = evaluate_call(expression, self.shell.user_ns)
            return doctor(op, *args, **doctor_keywords(options), **kwargs)


def doctor_cell(shell: Any, options: Any, result: Any, magic: str) -> Any:
    """``--doctor [SAMPLES]`` of a cell magic: diagnose the op(s) the cell made and display
    each diagnosis; ``result`` is handed back unchanged. The cell has succeeded already: a
    SAMPLES that cannot run prints its error and leaves the op in place."""
    if options.doctor is None:
        return result
    try:
        with magic_context(f"{magic} --doctor"):
            samples = _samples(shell, options.doctor)
            for op in _cell_operators(result):
                display(doctor(op, samples=samples, **doctor_keywords(options)))
    except (UsageError, OpmagicError) as error:
        print(f"{type(error).__name__}: {error}", file=sys.stderr)
    return result


def _samples(shell: Any, text: str) -> list[Any] | None:
    """SAMPLES as a list of argument tuples; ``None`` (built from the schema) when empty."""
    if not text.strip():
        return None
    value = evaluate(text, shell.user_ns, "--doctor")
    if isinstance(value, list) and value and all(isinstance(v, tuple) for v in value):
        return value
    return [value if isinstance(value, tuple) else (value,)]


def _cell_operators(result: Any) -> list[Any]:
    """The operators a cell made: its custom op, its CUDA op, or a library's operators."""
    if isinstance(result, CustomOpResult):
        return [result.op]
    if isinstance(result, CudaKernelResult) and result.op is not None:
        return [result.op.qualname]
    if isinstance(result, LoadedLibrary):
        names = [op.name for op in result.operators]
        if names:
            return names
    raise UsageError("--doctor: the cell made no operator to diagnose.")
