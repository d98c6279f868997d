"""``%compare CANDIDATE REFERENCE --inputs EXPR [options]``: a thin front on
:func:`opmagic.compare`, and ``--compare SPEC`` of the cell magics, which runs it on the op the
cell just registered (so an edited and re-run kernel shows its new numbers at once).

Expressions are evaluated in the user's namespace; ``ns::name`` is an operator name.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments
from IPython.display import display

from ..cells.cuda_kernel import CudaKernelResult
from ..cells.custom_op import CustomOpResult
from ..dispatch.ops import is_operator_name
from ..errors import OpmagicError
from ..native import LoadedLibrary
from ..verify.compare import DEFAULT_MIN_RUN_TIME, Comparison, compare
from .arguments import evaluate, names, parse_options
from .context import ShellMagics, magic_context

_EXAMPLE = "%compare my_add torch.add --inputs make_inputs --sizes 1024 65536"
_CELL_EXAMPLE = '--compare "torch.add --inputs make_inputs --sizes 1024 65536"'

@magics_class
class CompareMagics(ShellMagics):
    """The ``%compare`` line magic."""

    @magic_arguments()
    @argument(
        "functions",
        nargs="+",
        metavar="FUNCTION",
        help="the candidate, then the reference: Python expressions in your namespace "
        "(my_add, torch.add, torch.ops.mylib.myadd, a quoted lambda) or operator names "
        "(mylib::myadd)",
    )
    @argument(
        "--inputs",
        required=True,
        metavar="EXPR",
        help="builds one case's arguments: a function inputs(size, dtype, device) returning "
        "the argument tuple, or a list of argument tuples",
    )
    @argument(
        "--sizes",
        nargs="+",
        metavar="N",
        help="sizes to pass to inputs: numbers or expressions giving one or a list (2**20, "
        '"[2**k for k in range(10, 21, 2)]"); default 2**10, 2**14, 2**18, 2**22',
    )
    @argument(
        "--dtypes",
        nargs="+",
        metavar="DTYPE",
        help="dtype names to pass to inputs (float32 float16 bfloat16); default float32",
    )
    @argument(
        "--devices",
        nargs="+",
        metavar="DEVICE",
        help="devices to pass to inputs (cpu, cuda); default cuda when a GPU is here, else cpu",
    )
    @argument("--rtol", type=float, help="relative tolerance (with --atol); default: torch's")
    @argument("--atol", type=float, help="absolute tolerance (with --rtol); default: torch's")
    @argument(
        "--backward",
        action="store_true",
        help="also compare the gradients of the floating-point tensor arguments, and time "
        "forward + backward",
    )
    @argument(
        "--min-run-time",
        type=float,
        default=DEFAULT_MIN_RUN_TIME,
        metavar="SECONDS",
        help=f"how long to measure each function per case (default {DEFAULT_MIN_RUN_TIME})",
    )
    @line_magic
    def compare(self, line: str) -> Comparison:
        """Check a candidate kernel against a reference and time both across a sweep.

        For every device x dtype x size, inputs(size, dtype, device) builds the arguments;
        the outputs (and gradients, with --backward) are compared with torch's default
        tolerances for the dtype, naming NaN, shape, dtype and stride mismatches, and both
        are timed with torch.utils.benchmark (CUDA synchronised). Shows a table (failures
        highlighted) and the plot; returns the Comparison (.frame(), .plot()). Example::

            def make_inputs(n, dtype, device):
                a = torch.randn(n, dtype=dtype, device=device)
                return a, torch.randn_like(a)

            %compare my_add torch.add --inputs make_inputs --sizes 1024 65536 --dtypes float16

        Ctrl-C stops the sweep and keeps the cases measured so far.
        """
        with magic_context("%compare"):
            return run_compare(self.shell, line)


def run_compare(shell: Any, line: str, cell_result: Any = None) -> Comparison:
    """Parse %compare's arguments, evaluate them in the user namespace and compare.

    ``cell_result`` is what a cell magic made: its op is the candidate unless ``line`` names
    two functions.
    """
    example = _EXAMPLE if cell_result is None else _CELL_EXAMPLE
    try:
        args = parse_options(CompareMagics.compare, line)
    except UsageError as error:  # argparse's message: say how the line is written
        raise UsageError(f"{error}. Write e.g. {example}") from None
    functions = list(args.functions)
    if cell_result is not None and len(functions) == 1:
        candidate, candidate_name = _cell_candidate(cell_result, functions[0])
        functions = [candidate_name, *functions]
    elif len(functions) != 2:
        raise UsageError(
            f"takes the candidate and the reference, got {len(functions)} "
            f"expression(s): {' '.join(functions)}. Write e.g. {example}"
        )
    else:
        candidate = _evaluate(shell, functions[0], "the candidate")
    reference = _evaluate(shell, functions[1], "the reference")
    inputs = _evaluate(shell, args.inputs, "--inputs")
    sizes = None
    if args.sizes:
        sizes = list(_flatten(_evaluate(shell, s, "--sizes") for s in args.sizes))
    return compare(
        candidate,
        reference,
        inputs,
        sizes=sizes,
        dtypes=names(args.dtypes) or None,
        devices=names(args.devices) or None,
        rtol=args.rtol,
        atol=args.atol,
        backward=args.backward,
        min_run_time=args.min_run_time,
        names=(functions[0], functions[1]),
    )


def compare_cell(shell: Any, spec: str | None, result: Any, magic: str) -> Any:
    """``--compare SPEC`` of a cell magic: compare the op the cell made (when ``spec`` is
    given), display the comparison, and hand back ``result`` unchanged.

    The cell has already succeeded: a SPEC that cannot run prints its error (its class and
    message, once) and leaves the op in place (failing the cell would unload what it just
    loaded).
    """
    if spec is not None:
        try:
            with magic_context(f"{magic} --compare"):
                display(run_compare(shell, spec, result))
        except (UsageError, OpmagicError) as error:
            print(f"{type(error).__name__}: {error}", file=sys.stderr)
    return result


def _cell_candidate(result: Any, reference: str) -> tuple[Any, str]:
    """The operator a cell made, and its name, as the candidate of ``--compare``."""
    if isinstance(result, CustomOpResult):
        return result.op, result.qualname
    if isinstance(result, CudaKernelResult) and result.op is not None:
        return result.op.qualname, result.op.qualname
    names: list[str] = []
    if isinstance(result, LoadedLibrary):
        names = [op.name for op in result.operators] or list(
            dict.fromkeys(kernel.op for kernel in result.kernels)
        )
    if len(names) == 1:
        return names[0], names[0]
    made = (
        f"the cell made {len(names)} operators ({', '.join(names)})"
        if names
        else ("the cell made no operator")
    )
    quoted = f"'{reference}'" if " " in reference else reference
    raise UsageError(
        f"{made}, so name the candidate before the reference: --compare "
        f'"CANDIDATE {quoted} --inputs ..." (CANDIDATE: ns::name or an expression).'
    )


def _evaluate(shell: Any, text: str, what: str) -> Any:
    """An expression's value in the user namespace (``ns::name`` stays an operator name)."""
    if is_operator_name(text.strip()):
        return text.strip()
    return evaluate(text, shell.user_ns, what)


def _flatten(values: Iterable[Any]) -> Iterable[Any]:
    """Each value, or the items of a value that is a list, tuple or range."""
    for value in values:
        if isinstance(value, (list, tuple, range)):
            yield from value
        else:
            yield value
