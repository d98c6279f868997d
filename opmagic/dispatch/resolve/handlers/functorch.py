"""torch.func transforms: entering and leaving a layer, and vmap's batching rules or fallback."""

from __future__ import annotations

from ...._torch import dispatcher
from ...keys import KeyCatalogue
from ...sites import label_callable
from ...table import TableEntry
from ..binding import DispatchValue
from ..call import KernelOutcome, OperatorCall
from .registry import handles, runs_then_redispatches_below


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
