"""``resolve(op, *args, **kwargs)``: which kernels the dispatcher runs for a call, unrun.

The simulation follows c10's dispatcher step by step:

* a dispatch computes ``((keys of the tensor arguments | TLS include) - TLS exclude)``
  masked by the op's fallthrough keys (per backend, as ``DispatchKeyExtractor`` does);
* the highest-priority key picks a table entry, and what its kernel does next is modelled on
  what torch's own kernels and fallbacks do: redispatch below a key (autograd,
  ADInplaceOrView, math-bit fallbacks, PythonTLSSnapshot, ...), call the op again under new
  thread-local guards (autocast wrappers, functionalization, functorch layers,
  ``__torch_dispatch__`` handlers), end (backend and CompositeImplicitAutograd kernels), or
  fail;
* user kernels at other keys are taken to redispatch below their key, as the dispatcher
  tutorial's kernels and ``Library.impl(..., with_keyset=True)`` kernels do.

The parts: ``binding`` (overload, arguments checked by torch's conversion rules, the
tensors keys are read from), ``call`` (the call and state handlers see), ``schema`` (what
fallbacks read from the schema), ``handlers`` (what each key's kernel does next, a module
per subject), ``simulator`` (the walk), ``messages`` (the words), ``result``
(:class:`Resolution`). tests/dispatch/test_resolve_ground_truth.py and its siblings
(test_resolve_argument_types, _refusals, _subclasses, _custom_ops) check the model against
the real dispatcher.
"""

from __future__ import annotations

from typing import Any

from ..ops import op_ref
from ..table import OperatorTable
from ..torch_functions import unbind
from .binding import argument_type_refusal, bind_arguments, select_overload
from .result import DispatchInput, Resolution, Skip, Step
from .simulator import Simulator

__all__ = ["DispatchInput", "Resolution", "Skip", "Step", "resolve"]


def resolve(op: Any, *args: Any, **kwargs: Any) -> Resolution:
    """Predict which kernels ``op(*args, **kwargs)`` runs under the current thread-local state.

    ``op`` is anything :func:`opmagic.dispatch_table` accepts; for a packet
    (``torch.ops.aten.add``, or the torch function ``torch.add``) the overload is chosen from
    the arguments as torch chooses it; a tensor's method (``x.add``) is called on its tensor.
    A torch function's call is its aten operator's: arguments as the schema names them.
    Nothing runs: no kernel of the op is called and no argument changes (a tensor passed
    for a number is read, as the real call's conversion reads it). The call is taken as
    ``torch.ops`` makes it (boxed: Tensor, Tensor?, Tensor[] and Tensor?[] carry keys).
    Raises ``ArgumentsMismatchError`` for a call of the wrong shape (no overload of a packet
    fits, too many, unknown or missing arguments). A call that fails is a resolution whose
    ``.error`` says why: a value of the wrong type (torch refuses it before any kernel runs,
    so the path is empty), or a failure in dispatch.
    """
    op, args = unbind(op, args)
    ref = op_ref(op)
    if ref.overload is None:
        ref = ref.with_overload(select_overload(ref, args, kwargs))
    table = OperatorTable(ref)
    arguments = bind_arguments(ref, table.schema_obj, args, kwargs)
    simulator = Simulator(ref, table, arguments)
    refusal = argument_type_refusal(ref, table.schema_obj, arguments, args, kwargs)
    return simulator.refused(refusal) if refusal is not None else simulator.run()
