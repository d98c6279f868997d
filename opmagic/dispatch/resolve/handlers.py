"""What each kernel does next: one handler per dispatch-key functionality (or category).

A handler gets the call (:class:`~.call.OperatorCall`, whose ``state`` is the dispatcher
state the walk has reached), the key, the table entry that serves it and the keyset it was
picked from, and returns a :class:`~.call.KernelOutcome`: the kernel ends the call,
redispatches below its key, calls the op again under new thread-local state, hands over to
Python code opmagic does not follow, or fails. Each handler models what torch's own kernel
or fallback for that key does; keys with no handler run the user's kernel and redispatch
below it (:func:`runs_then_redispatches_below`).

To model a new key, write a handler and register it with :func:`handles`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..._torch import custom_op_state, dispatcher
from ..keys import KeyCatalogue
from ..sites import label_callable
from ..table import TableEntry
from .binding import DispatchValue
from .call import KernelOutcome, OperatorCall
from .messages import (
    ambiguous_kernel_message,
    missing_kernel_message,
    no_device_kernel_message,
    no_fake_message,
)

Handler = Callable[[OperatorCall, str, TableEntry, int], KernelOutcome]
"""``handler(call, key, entry, keyset) -> KernelOutcome``."""

HANDLERS_BY_FUNCTIONALITY: dict[str, Handler] = {}
"""Handlers by ``KeyInfo.functionality`` (filled by :func:`handles`)."""
HANDLERS_BY_CATEGORY: dict[str, Handler] = {}
"""Handlers by ``KeyInfo.category``, for keys whose functionality has none."""


def handles(*functionalities: str, category: str | None = None) -> Callable[[Handler], Handler]:
    """Register a handler for keys of these functionalities (``KeyInfo.functionality``:
    "AutogradFunctionality" covers AutogradCPU, AutogradCUDA, ...), or of a whole category.

    A functionality's handler wins over its category's.
    """

    def register(handler: Handler) -> Handler:
        for functionality in functionalities:
            HANDLERS_BY_FUNCTIONALITY[functionality] = handler
        if category is not None:
            HANDLERS_BY_CATEGORY[category] = handler
        return handler

    return register


def kernel_outcome(call: OperatorCall, key: str, entry: TableEntry, keyset: int) -> KernelOutcome:
    """What the kernel serving ``key`` does next, from the entry's kind and the key's handler."""
    catalogue = call.catalogue
    if entry.kind == "missing":
        return KernelOutcome("error", missing_kernel_message(str(call.ref), key))
    if entry.kind == "ambiguous":
        return KernelOutcome("error", ambiguous_kernel_message(str(call.ref)))
    if entry.kind == "fallthrough":  # reachable only through a keyset built without the mask
        return redispatch(
            call,
            key,
            keyset,
            catalogue.minus(keyset, catalogue.functionality_raw(key)),
            "fallthrough: skipped",
        )
    if entry.alias in ("CompositeImplicitAutograd", "CompositeImplicitAutogradNestedTensor"):
        return KernelOutcome(
            "ends", f"decomposes into other operators ({entry.alias}); each dispatches on its own"
        )
    if key == "Undefined":
        return KernelOutcome("ends", f"runs {entry.source} (the Undefined slot: no backend key)")
    info = catalogue.by_name[key]
    handler = HANDLERS_BY_FUNCTIONALITY.get(info.functionality) or HANDLERS_BY_CATEGORY.get(
        info.category
    )
    if handler is None:
        return runs_then_redispatches_below(call, key, entry, keyset)
    return handler(call, key, entry, keyset)


# ------------------------------------------------------------------ shared moves


def redispatch(
    call: OperatorCall, key: str, keyset: int, mask: int, note: str, exclude: int = 0
) -> KernelOutcome:
    """The kernel redispatches with ``keyset & mask``; keys below it the mask drops are noted."""
    masked = keyset & call.catalogue.full_after(key) & ~mask
    return KernelOutcome("redispatch", note, keyset=keyset & mask, masked=masked, exclude=exclude)


def runs_then_redispatches_below(
    call: OperatorCall, key: str, entry: TableEntry, keyset: int
) -> KernelOutcome:
    """The default: the kernel runs and redispatches to the keys below its own."""
    return redispatch(
        call,
        key,
        keyset,
        call.catalogue.full_after(key),
        f"runs {entry.source}, then redispatches below",
    )


# ------------------------------------------------------------------ backends


@handles(category="backend")
def backend(call: OperatorCall, key: str, entry: TableEntry, keyset: int) -> KernelOutcome:
    """A backend kernel ends the call; Meta without a fake impl raises."""
    if key == "Meta" and entry.kind == "fallback":
        return KernelOutcome("error", no_fake_message(str(call.ref)))
    if (
        key == "Meta"
        and call.is_custom_op_kernel(entry)
        and call.custom_op["fake"] is None
        and not custom_op_state.custom_op_can_fake_trivially(call.ref.op_overload())
    ):
        return KernelOutcome("error", no_fake_message(str(call.ref)))
    if entry.kind == "fallback":
        return KernelOutcome("ends", f"runs the {key} backend fallback {entry.source}")
    return KernelOutcome("ends", f"runs {entry.source}")


@handles("BackendSelect")
def backend_select(call: OperatorCall, key: str, entry: TableEntry, keyset: int) -> KernelOutcome:
    """Factory ops: torch's generated kernels and custom_op's router pick the backend."""
    catalogue = call.catalogue
    generated = "RegisterBackendSelect.cpp" in (entry.site or "")
    if entry.kind != "kernel" or not (generated or call.is_custom_op_kernel(entry)):
        return runs_then_redispatches_below(call, key, entry, keyset)
    options = {argument.name: argument.value for argument in call.arguments}
    device = options.get("device")
    device = torch.device(device) if device is not None else torch.get_default_device()
    if not generated:
        if device.type not in call.custom_op["device_kernels"]:
            return KernelOutcome("error", no_device_kernel_message(call.ref, device.type))
        target = dispatcher.dispatch_key_for_device(device.type)
        return KernelOutcome(
            "redispatch",
            f"custom_op's device router picks {target} from device={device}",
            keyset=catalogue.raw(target),
        )
    target = _factory_backend_key(catalogue, device, options.get("layout"), options.get("dtype"))
    state = call.state
    chosen = catalogue.minus(catalogue.raw(target) | state.included, state.excluded)
    return KernelOutcome(
        "redispatch",
        f"picks {target} from the device, layout and dtype arguments and redispatches there",
        keyset=chosen & catalogue.full_after(key),
    )


def _factory_backend_key(
    catalogue: KeyCatalogue, device: torch.device, layout: Any, dtype: Any
) -> str:
    """``computeDispatchKey(dtype, layout, device)``: the backend a factory op runs on."""
    dense = dispatcher.dispatch_key_for_device(device.type)
    prefix = ""
    if layout == torch.sparse_coo:
        prefix = "Sparse"
    elif layout in (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc):
        prefix = "SparseCsr"
    elif isinstance(dtype, torch.dtype) and dtype in (
        torch.qint8,
        torch.quint8,
        torch.qint32,
        torch.quint4x2,
        torch.quint2x4,
    ):
        prefix = "Quantized"
    return prefix + dense if prefix + dense in catalogue.by_name else dense


# ------------------------------------------------------------------ autograd, autocast, math bits


@handles("AutogradFunctionality", "AutogradOther", "AutogradNestedTensor")
def autograd(call: OperatorCall, key: str, entry: TableEntry, keyset: int) -> KernelOutcome:
    """Autograd kernels (or the autograd fallback) redispatch below autograd, guarded."""
    if entry.kind == "fallback":
        note = (
            "no autograd kernel for this op: the autograd fallback (mode "
            f"'{dispatcher.autograd_fallback_mode()}') runs the op below autograd; backward "
            "through its outputs warns or raises"
        )
    elif call.is_custom_op_kernel(entry) and call.custom_op["backward"] is None:
        note = (
            "custom_op's autograd kernel runs the op below autograd; it has no backward "
            "formula, so backward through the output raises (add one with register_autograd)"
        )
    else:
        what = entry.impl or f"the autograd kernel {entry.source}"
        note = f"{what}: records the backward node if an input requires grad, then redispatches"
    return redispatch(
        call,
        key,
        keyset,
        dispatcher.after_autograd_raw(),
        note,
        exclude=call.catalogue.category_raw("autograd"),
    )


@handles("ADInplaceOrView")
def ad_inplace_or_view(
    call: OperatorCall, key: str, entry: TableEntry, keyset: int
) -> KernelOutcome:
    """ADInplaceOrView kernels bump version counters or set up views, then redispatch."""
    return redispatch(
        call,
        key,
        keyset,
        dispatcher.after_ad_inplace_or_view_raw(),
        f"runs {entry.source}: bumps version counters of mutated inputs or sets up the "
        "view, then redispatches",
        exclude=call.catalogue.raw("ADInplaceOrView"),
    )


@handles(category="autocast")
def autocast(call: OperatorCall, key: str, entry: TableEntry, keyset: int) -> KernelOutcome:
    """Autocast wrappers cast their inputs and call the op again with their key off."""
    if "autocast_mode.cpp" in (entry.site or "") or call.is_custom_op_kernel(entry):
        what = entry.impl or f"the autocast wrapper {entry.source}"
        return KernelOutcome(
            "call",
            f"{what}: casts floating-point inputs, then calls the op again with {key} off",
            exclude=call.catalogue.functionality_raw(key),
        )
    return runs_then_redispatches_below(call, key, entry, keyset)


@handles("Conjugate", "Negative", "ZeroTensor")
def math_bit(call: OperatorCall, key: str, entry: TableEntry, keyset: int) -> KernelOutcome:
    """Conjugate/Negative/ZeroTensor fallbacks materialise flagged inputs, then redispatch."""
    if entry.kind != "fallback":
        return runs_then_redispatches_below(call, key, entry, keyset)
    outcome = redispatch(
        call,
        key,
        keyset,
        call.catalogue.full_after(key),
        f"the {key} fallback materialises the flagged inputs, then redispatches",
    )
    bit = call.catalogue.functionality_raw(key)
    outcome.values = [value.with_keyset(value.keyset & ~bit) for value in call.state.values]
    return outcome


# ------------------------------------------------------------------ functionalization, fake


@handles("Functionalize")
def functionalize(call: OperatorCall, key: str, entry: TableEntry, keyset: int) -> KernelOutcome:
    """Functionalization unwraps its wrappers and calls the op again with its key off."""
    values = [
        value.unwrapped(dispatcher.unwrap_functional(value.tensor))
        if dispatcher.is_functional_tensor(value.tensor)
        else value
        for value in call.state.values
    ]
    return KernelOutcome(
        "call",
        "functionalization unwraps FunctionalTensorWrappers and calls the op again "
        "with Functionalize off",
        exclude=call.catalogue.raw("Functionalize"),
        values=values,
    )


@handles("Fake")
def fake(call: OperatorCall, key: str, entry: TableEntry, keyset: int) -> KernelOutcome:
    """The Fake fallback calls the op again on meta tensors in place of fake ones."""
    fake_bit = call.catalogue.functionality_raw("Fake")
    meta = dispatcher.tensor_keyset_raw(torch.empty(0, device="meta"))
    return KernelOutcome(
        "call",
        "the Fake fallback swaps fake inputs for meta tensors and calls the op again",
        exclude=fake_bit,
        values=[
            value.with_keyset(meta) if value.keyset & fake_bit else value
            for value in call.state.values
        ],
    )


# ------------------------------------------------------------------ Python, modes, subclasses


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


# ------------------------------------------------------------------ torch.func (functorch)


@handles("FuncTorchDynamicLayerFrontMode")
def functorch_front(call: OperatorCall, key: str, entry: TableEntry, keyset: int) -> KernelOutcome:
    """Entering the innermost transform: only its own keys stay on (setup_dispatch_key_tls)."""
    state = call.state
    if entry.kind != "fallback" or not state.layers:
        return runs_then_redispatches_below(call, key, entry, keyset)
    catalogue = call.catalogue
    transform, level = state.layers[-1]
    own = _transform_keys(catalogue, transform)
    front = catalogue.functionality_raw("FuncTorchDynamicLayerFrontMode")
    back = catalogue.functionality_raw("FuncTorchDynamicLayerBackMode")
    dynamic_layer_keys = (
        catalogue.minus(
            catalogue.full_after("FuncTorchDynamicLayerFrontMode"),
            catalogue.full_after("FuncTorchDynamicLayerBackMode"),
        )
        | front
    )
    dynamic_layer_keys = catalogue.minus(
        dynamic_layer_keys,
        catalogue.category_raw("autocast")
        | catalogue.functionality_raw("FuncTorchVmapMode")
        | back,
    )
    state.saved_tls.append((state.included, state.excluded))
    include = catalogue.functionality_raw("FuncTorchVmapMode") if transform == "Vmap" else 0
    values = None
    if transform in ("Grad", "Jvp"):  # materializeGradWrappers: every input gets wrapped
        values = [
            value
            if dispatcher.grad_wrapper_level(value.tensor) == level
            else DispatchValue.of(value.name, dispatcher.wrap_for_grad(value.tensor, level))
            for value in state.values
        ]
    return KernelOutcome(
        "call",
        f"enters the innermost torch.func transform ({transform.lower()}, level {level}): "
        "only its keys stay on, then it calls the op again",
        tls=(state.included | include, catalogue.minus(state.excluded | dynamic_layer_keys, own)),
        values=values,
    )


def _transform_keys(catalogue: KeyCatalogue, transform: str) -> int:
    """``keysForEnteringDynamicLayer``: the keys a torch.func transform keeps on."""
    if transform == "Vmap":
        return catalogue.functionality_raw("FuncTorchBatched") | catalogue.functionality_raw(
            "BatchedNestedTensor"
        )
    if transform in ("Grad", "Jvp"):
        return catalogue.category_raw("autograd") | catalogue.functionality_raw("ADInplaceOrView")
    if transform == "Functionalize":
        return catalogue.functionality_raw("Functionalize")
    return 0


@handles("FuncTorchBatched")
def functorch_batched(
    call: OperatorCall, key: str, entry: TableEntry, keyset: int
) -> KernelOutcome:
    """vmap's batching rule (or its per-sample fallback) calls the op on unbatched tensors."""
    state = call.state
    if not state.layers:
        return runs_then_redispatches_below(call, key, entry, keyset)
    if call.is_custom_op_kernel(entry) and call.custom_op["vmap"] is not None:
        return KernelOutcome(
            "python",
            f"continues in Python: the vmap rule {label_callable(call.custom_op['vmap'])}",
        )
    level = state.layers[-1][1]
    values = [
        value.unwrapped(dispatcher.unwrap_functorch(value.tensor))
        if dispatcher.batched_level(value.tensor) == level
        else value
        for value in state.values
    ]
    if entry.kind == "fallback":
        what = (
            "no batching rule: vmap's fallback runs the op once per batch element "
            "(a slow for-loop) on the unbatched tensors"
        )
    else:
        what = f"the batching rule {entry.source} calls the op again on unbatched tensors"
    return KernelOutcome("call", what, values=values, exclude=call.catalogue.functionality_raw(key))


@handles("FuncTorchDynamicLayerBackMode")
def functorch_back(call: OperatorCall, key: str, entry: TableEntry, keyset: int) -> KernelOutcome:
    """Leaving a transform: restore the TLS its front saw, pop it, call the next one."""
    state = call.state
    if entry.kind != "fallback" or not state.layers:
        return runs_then_redispatches_below(call, key, entry, keyset)
    catalogue = call.catalogue
    transform, level = state.layers[-1]
    included, excluded = (
        state.saved_tls.pop() if state.saved_tls else (state.included, state.excluded)
    )
    if len(state.layers) == 1:  # the last layer: the dynamic-layer keys go off
        included = catalogue.minus(
            included,
            catalogue.functionality_raw("FuncTorchDynamicLayerFrontMode")
            | catalogue.functionality_raw("FuncTorchDynamicLayerBackMode"),
        )
    values = state.values
    if transform in ("Grad", "Jvp"):
        values = [
            value.unwrapped(dispatcher.unwrap_functorch(value.tensor))
            if dispatcher.is_grad_wrapper(value.tensor)
            else value
            for value in values
        ]
    outer = "the next outer transform" if len(state.layers) > 1 else "the plain dispatcher"
    return KernelOutcome(
        "call",
        f"leaves the {transform.lower()} layer (level {level}): restores the thread-local "
        f"state and calls the op again for {outer}",
        tls=(included, excluded),
        values=values,
        pop_layer=True,
    )


@handles("Batched")
def legacy_batched(call: OperatorCall, key: str, entry: TableEntry, keyset: int) -> KernelOutcome:
    """The legacy ``torch._vmap_internals`` fallback: a per-sample loop, not followed."""
    if entry.kind != "fallback":
        return runs_then_redispatches_below(call, key, entry, keyset)
    return KernelOutcome(
        "ends",
        "legacy torch._vmap_internals batching fallback: a per-sample loop that opmagic "
        "does not follow",
    )
