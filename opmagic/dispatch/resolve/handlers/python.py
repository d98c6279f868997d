"""The Python key: dispatch modes, tensor subclasses, FakeTensor and Python functionalization;
and the Python dispatcher.

pythonFallback hands the call to the innermost TorchDispatchMode, else to the first
tensor-subclass argument's ``__torch_dispatch__``, with every key above Python off while
that Python code runs. What torch's own Python code does is followed exactly (FakeTensorMode
and FakeTensor, FunctionalTensorMode, the jagged NestedTensor); a user's mode or subclass is
assumed to do what such code usually does, and its steps are marked ``assumed``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from ...._torch import custom_op_state, dispatcher
from ...sites import label_callable
from ...table import TableEntry
from ..binding import DispatchValue
from ..call import KernelOutcome, OperatorCall
from ..messages import (
    fake_mode_real_tensor_message,
    functional_tensor_alone_message,
    jagged_refuses_message,
    no_fake_message,
    no_jagged_rule_message,
)
from .registry import handles, runs_then_redispatches_below


@dataclass(frozen=True)
class PythonGuard:
    """The keys around a Python handler: those its guard turns off, and the Python keys."""

    handler_exclude: int  # pythonFallback's guard: every key above Python is off
    python_keys: int  # Python and PythonTLSSnapshot

    @classmethod
    def of(cls, call: OperatorCall) -> PythonGuard:
        """The guard for this call's key catalogue."""
        catalogue = call.catalogue
        above_python = dispatcher.full_keyset_raw() & ~catalogue.full_after("Python")
        return cls(
            above_python & ~catalogue.raw("Python") & ~catalogue.backend_mask,
            catalogue.functionality_raw("Python")
            | catalogue.functionality_raw("PythonTLSSnapshot"),
        )


@handles("Python")
def python(call: OperatorCall, key: str, entry: TableEntry, keyset: int) -> KernelOutcome:
    """The Python fallback hands the call to the innermost mode, else to a subclass.

    A ``register_torch_dispatch`` rule for the mode or subclass runs instead of it.
    """
    if entry.kind != "fallback":
        return runs_then_redispatches_below(call, key, entry, keyset)
    guard = PythonGuard.of(call)
    if call.state.modes:
        return _mode(call, call.state.modes[-1], guard)
    python_bit = call.catalogue.functionality_raw("Python")
    handed_to = [  # what pythonFallback hands the call to: the first subclass argument
        value
        for value in call.state.values
        if value.keyset & python_bit and type(value.tensor) is not torch.Tensor
    ]
    if not handed_to:
        return KernelOutcome(
            "python",
            "continues in Python, but no mode or tensor subclass is there to handle it",
        )
    return _subclass(call, handed_to[0].tensor, guard)


def _mode(call: OperatorCall, mode: Any, guard: PythonGuard) -> KernelOutcome:
    """The innermost TorchDispatchMode's ``__torch_dispatch__``."""
    name = type(mode).__name__
    rule = custom_op_state.registered_torch_dispatch_rule(call.ref.qualname, type(mode))
    if rule is not None:
        return KernelOutcome(
            "python",
            f"continues in Python: the register_torch_dispatch rule for {name} "
            f"({label_callable(rule)})",
        )
    if dispatcher.is_fake_mode(mode):
        return _fake(call, mode, name, guard)
    if dispatcher.is_functional_tensor_mode(mode):
        return _functional_mode(call, mode, guard)
    return KernelOutcome(
        "call",
        f"continues in Python: {name}.__torch_dispatch__ (the innermost TorchDispatchMode); "
        "when it calls func(*args, **kwargs), as modes usually do, dispatch starts again "
        "with the mode popped and every key above Python off",
        exclude=guard.handler_exclude,
        uninclude=_python_keys_left(call, guard),
        pop_mode=True,
        assumed=True,
    )


def _python_keys_left(call: OperatorCall, guard: PythonGuard) -> int:
    """The Python keys leave the TLS include set when the last mode is popped."""
    return guard.python_keys if len(call.state.modes) == 1 else 0


def _subclass(call: OperatorCall, tensor: torch.Tensor, guard: PythonGuard) -> KernelOutcome:
    """The first tensor-subclass argument's ``__torch_dispatch__``."""
    subclass = type(tensor)
    rule = custom_op_state.registered_torch_dispatch_rule(call.ref.qualname, subclass)
    if rule is not None:
        return KernelOutcome(
            "python",
            f"continues in Python: the register_torch_dispatch rule for {subclass.__name__} "
            f"({label_callable(rule)}); what runs next is up to it",
        )
    if dispatcher.is_fake_tensor_type(subclass):
        return _fake(call, dispatcher.fake_mode_of(tensor), "FakeTensor", guard)
    if dispatcher.is_functional_tensor_subclass(subclass):
        return KernelOutcome("error", functional_tensor_alone_message(str(call.ref)))
    if tensor.is_nested and tensor.layout == torch.jagged:
        return _jagged(call)
    if dispatcher.is_traceable_wrapper_subclass(tensor):
        inner = dispatcher.inner_tensor_names(tensor)
        if inner:
            return KernelOutcome(
                "call",
                f"continues in Python: {subclass.__qualname__}.__torch_dispatch__; a traceable "
                f"wrapper subclass is assumed to call func on its inner tensors "
                f"({', '.join(inner)}: __tensor_flatten__), once per inner tensor; the path "
                f"below is the call on .{inner[0]}, with every key above Python off",
                exclude=guard.handler_exclude,
                values=[_inner(value, subclass, inner[0]) for value in call.state.values],
                assumed=True,
            )
    if dispatcher.has_own_storage(tensor):
        return KernelOutcome(
            "call",
            f"continues in Python: {subclass.__qualname__}.__torch_dispatch__; a subclass made "
            "with _make_subclass is assumed to call func again on the same tensors with "
            "Python dispatch off (no_dispatch()), as such subclasses usually do",
            exclude=guard.handler_exclude | guard.python_keys,
            assumed=True,
        )
    return KernelOutcome(
        "python",
        f"continues in Python: {subclass.__qualname__}.__torch_dispatch__; a wrapper subclass "
        "that does not say what it wraps (no __tensor_flatten__): what runs next is up to it",
    )


def _inner(value: DispatchValue, subclass: type, name: str) -> DispatchValue:
    """The argument as a wrapper subclass passes it on: its inner tensor ``name``."""
    if isinstance(value.tensor, subclass):
        return value.unwrapped(getattr(value.tensor, name))
    return value


# ------------------------------------------------------------------ torch's own Python code


def _fake(call: OperatorCall, mode: Any, mode_name: str, guard: PythonGuard) -> KernelOutcome:
    """FakeTensorMode or a FakeTensor's handler. Given a tensor subclass it does not know (a
    wrapper holding fake tensors), it returns NotImplemented and that subclass's handler runs,
    the mode still active for the calls the handler makes."""
    other = next(
        (value for value in call.state.values if dispatcher.fake_tensor_passes_on(value.tensor)),
        None,
    )
    if other is None:
        return _fake_mode(call, mode, mode_name, guard.handler_exclude | guard.python_keys)
    outcome = _subclass(call, other.tensor, guard)
    if outcome.action == "error":
        return outcome
    passed_on = (
        f"{mode_name} returns NotImplemented (argument {other.name} is a "
        f"{type(other.tensor).__qualname__}, a tensor subclass it does not know), so the call "
    )
    return replace(outcome, note=passed_on + outcome.note)


def _fake_mode(call: OperatorCall, mode: Any, mode_name: str, exclude: int) -> KernelOutcome:
    """What FakeTensorMode does with the op: refuse real tensors, then its fake impl, its
    decomposition, or the Meta kernel."""
    for value in call.state.values:
        if dispatcher.fake_mode_refuses(mode, value.tensor):
            return KernelOutcome("error", fake_mode_real_tensor_message(str(call.ref), value.name))
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


def _functional_mode(call: OperatorCall, mode: Any, guard: PythonGuard) -> KernelOutcome:
    """FunctionalTensorMode (``dispatch_functionalize``, AOTAutograd): decompose, hand a
    mutable op to auto_functionalize, thread effect tokens, or run C++ functionalization on
    the FunctionalTensorWrappers its FunctionalTensors hold, from the Functionalize kernel."""
    op = call.ref.op_overload()
    args, kwargs = call.python_arguments()
    if (
        op not in dispatcher.functional_tensor_metadata_ops()
        and call.table.has_alias_kernel("CompositeImplicitAutograd")
        and dispatcher.functional_mode_can_decompose(mode, op, args, kwargs)
    ):
        return KernelOutcome(
            "python",
            "continues in Python: FunctionalTensorMode decomposes the op through its "
            "CompositeImplicitAutograd kernel (OpOverload.decompose), functionalizing each "
            "op it calls",
        )
    if dispatcher.can_auto_functionalize(op) and call.table.entry("Functionalize").kind != "kernel":
        return KernelOutcome(
            "python",
            "continues in Python: FunctionalTensorMode hands the mutable op to "
            "auto_functionalize, which runs it on clones of the mutated inputs",
        )
    if dispatcher.has_effects(op):
        return KernelOutcome(
            "python",
            "continues in Python: FunctionalTensorMode threads effect tokens through the "
            "side-effectful op (handle_effects)",
        )
    catalogue, state = call.catalogue, call.state
    functionalize = catalogue.functionality_raw("Functionalize")
    restored = functionalize | catalogue.functionality_raw("Conjugate")
    restored |= catalogue.functionality_raw("Negative") | catalogue.functionality_raw("ZeroTensor")
    included = (state.included & ~_python_keys_left(call, guard)) | functionalize
    excluded = catalogue.minus(state.excluded | guard.handler_exclude, restored)
    return KernelOutcome(
        "call",
        "continues in Python: FunctionalTensorMode unwraps its FunctionalTensors and runs "
        "the Functionalize kernel on the FunctionalTensorWrappers they hold "
        "(func._op_dk(Functionalize, ...)), with Functionalize on",
        tls=(included, excluded),
        values=[
            value.unwrapped(dispatcher.functional_tensor_elem(value.tensor))
            if dispatcher.is_functional_tensor_subclass(type(value.tensor))
            else value
            for value in state.values
        ],
        pop_mode=True,
        start_at="Functionalize",
    )


def _jagged(call: OperatorCall) -> KernelOutcome:
    """The jagged NestedTensor: its rule for the op, else a composite kernel, else it raises."""
    op = call.ref.op_overload()
    args, kwargs = call.python_arguments()
    try:
        rule = dispatcher.jagged_rule(op, args, kwargs)
    except Exception as exc:  # its pointwise rule checks the arguments and raises
        return KernelOutcome("error", jagged_refuses_message(str(call.ref), exc))
    if rule is not None:
        return KernelOutcome(
            "python",
            f"continues in Python: the jagged NestedTensor's rule {label_callable(rule)}",
        )
    for alias in ("CompositeImplicitAutogradNestedTensor", "CompositeImplicitAutograd"):
        if call.table.has_alias_kernel(alias):
            return KernelOutcome(
                "python",
                f"continues in Python: the jagged NestedTensor has no rule for this op and "
                f"runs its {alias} kernel (func._op_dk), which decomposes it",
            )
    return KernelOutcome("error", no_jagged_rule_message(str(call.ref)))


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
