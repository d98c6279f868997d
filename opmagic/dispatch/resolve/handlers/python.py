"""The Python key: dispatch modes, tensor subclasses, FakeTensor and Python functionalization;
and the Python dispatcher."""

from __future__ import annotations

import torch

from ...._torch import custom_op_state, dispatcher
from ...sites import label_callable
from ...table import TableEntry
from ..call import KernelOutcome, OperatorCall
from ..messages import no_fake_message
from .registry import handles, runs_then_redispatches_below


@handles("Python")
def python(call: OperatorCall, key: str, entry: TableEntry, keyset: int) -> KernelOutcome:
    """The Python fallback hands the call to Python: the innermost TorchDispatchMode if one
    is active, else the first tensor-subclass argument's ``__torch_dispatch__``.

    A ``register_torch_dispatch`` rule for the mode or subclass runs instead of it. Fake
    modes and FakeTensors are followed (:func:`_fake_mode`); another mode is assumed to
    call the op again, popped, with every key above Python off (the step is ``assumed``);
    a subclass's code is not followed.
    """
    if entry.kind != "fallback":
        return runs_then_redispatches_below(call, key, entry, keyset)
    catalogue, state = call.catalogue, call.state
    # pythonFallback's guard: every key above Python is off while the handler runs
    handler_exclude = (
        dispatcher.full_keyset_raw() & ~catalogue.full_after("Python") & ~catalogue.raw("Python")
    ) & ~catalogue.backend_mask
    python_keys = catalogue.functionality_raw("Python") | catalogue.functionality_raw(
        "PythonTLSSnapshot"
    )
    if state.modes:
        mode = type(state.modes[-1])
        rule = custom_op_state.registered_torch_dispatch_rule(call.ref.qualname, mode)
        if rule is not None:
            return KernelOutcome(
                "python",
                f"continues in Python: the register_torch_dispatch rule for "
                f"{mode.__name__} ({label_callable(rule)})",
            )
        if dispatcher.is_fake_mode(state.modes[-1]):
            return _fake_mode(call, mode.__name__, handler_exclude | python_keys)
        return KernelOutcome(
            "call",
            f"continues in Python: {mode.__name__}.__torch_dispatch__ (the innermost "
            "TorchDispatchMode); when it calls func(*args, **kwargs), as modes usually do, "
            "dispatch starts again with the mode popped and every key above Python off",
            exclude=handler_exclude,
            uninclude=python_keys if len(state.modes) == 1 else 0,
            pop_mode=True,
            assumed=True,
        )
    python_bit = catalogue.functionality_raw("Python")
    subclasses = [  # what pythonFallback hands the call to: the first subclass argument
        type(value.tensor)
        for value in state.values
        if value.keyset & python_bit and type(value.tensor) is not torch.Tensor
    ]
    if not subclasses:
        return KernelOutcome(
            "python",
            "continues in Python, but no mode or tensor subclass is there to handle it",
        )
    subclass = subclasses[0]
    if dispatcher.is_fake_tensor_type(subclass):
        return _fake_mode(call, "FakeTensor", handler_exclude | python_keys)
    rule = custom_op_state.registered_torch_dispatch_rule(call.ref.qualname, subclass)
    where = (
        f"the register_torch_dispatch rule for {subclass.__name__} ({label_callable(rule)})"
        if rule is not None
        else f"{subclass.__qualname__}.__torch_dispatch__"
    )
    return KernelOutcome("python", f"continues in Python: {where}; what runs next is up to it")


def _fake_mode(call: OperatorCall, mode_name: str, exclude: int) -> KernelOutcome:
    """What FakeTensorMode does with the op: its fake impl, its decomposition, or Meta."""
    if call.custom_op is not None:  # custom_op registers its own fake-impl wrapper
        fake_impl = call.custom_op["fake"]
        if fake_impl is None:
            if custom_op_state.custom_op_can_fake_trivially(call.ref.op_overload()):
                return KernelOutcome(
                    "python",
                    f"continues in Python: {mode_name} runs custom_op's generated fake impl "
                    "(the op returns nothing)",
                )
            return KernelOutcome("error", no_fake_message(str(call.ref)))
    else:
        fake_impl = custom_op_state.registered_fake_impl(call.ref.qualname)
    if fake_impl is not None:
        return KernelOutcome(
            "python",
            f"continues in Python: {mode_name} runs the fake impl {label_callable(fake_impl)}",
        )
    if call.table.has_alias_kernel("CompositeImplicitAutograd"):
        return KernelOutcome(
            "python",
            f"continues in Python: {mode_name} runs the CompositeImplicitAutograd "
            "decomposition, faking each op it calls",
        )
    return KernelOutcome(
        "call",
        f"continues in Python: {mode_name} has no fake impl for this op, so it calls the op "
        "again with Meta in the TLS include set (the Meta kernel runs) and Python off",
        exclude=exclude,
        include=call.catalogue.raw("Meta"),
    )


@handles("PythonDispatcher")
def python_dispatcher(
    call: OperatorCall, key: str, entry: TableEntry, keyset: int
) -> KernelOutcome:
    """The Python dispatcher picks the next key in Python (py_impl kernels replace C++ ones)."""
    if entry.kind != "fallback":
        return runs_then_redispatches_below(call, key, entry, keyset)
    python_kernel_keys = dispatcher.py_kernel_keys(call.ref.op_overload())
    extra = (
        f"; Python kernels (py_impl) for {', '.join(python_kernel_keys)} replace the C++ ones"
        if python_kernel_keys
        else ""
    )
    return KernelOutcome(
        "redispatch",
        f"the Python dispatcher (torch._ops) picks the next key in Python{extra}",
        keyset=call.catalogue.minus(keyset, call.catalogue.functionality_raw(key)),
    )
