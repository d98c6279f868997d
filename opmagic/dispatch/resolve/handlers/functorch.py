"""torch.func transforms: entering and leaving a layer, and vmap's batching rules or fallback."""

from __future__ import annotations

from ...._torch import dispatcher
from ...keys import KeyCatalogue
from ...sites import label_callable
from ...table import TableEntry
from ..binding import DispatchValue
from ..call import KernelOutcome, OperatorCall
from ..messages import (
    vmap_cannot_generate_message,
    vmap_fallback_disabled_message,
    vmap_inplace_message,
    vmap_refuses_message,
)
from ..schema import has_alias_info, is_inplace, returns_only_tensors, takes_tensor_list
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
    parts = call.custom_op_kernel(entry)
    if parts is not None and parts["vmap"] is not None:
        return KernelOutcome(
            "python", f"continues in Python: the vmap rule {label_callable(parts['vmap'])}"
        )
    level = state.layers[-1][1]
    values = [
        value.unwrapped(dispatcher.unwrap_functorch(value.tensor))
        if dispatcher.batched_level(value.tensor) == level
        else value
        for value in state.values
    ]
    exclude = call.catalogue.functionality_raw(key)
    if entry.kind != "fallback":
        return KernelOutcome(
            "call",
            f"the batching rule {entry.source} calls the op again on unbatched tensors",
            values=values,
            exclude=exclude,
        )
    refusal = _vmap_fallback_refusal(call, level)
    if refusal is not None:
        return KernelOutcome("error", refusal)
    if not any(dispatcher.batched_level(value.tensor) == level for value in state.values):
        what = (
            "no batching rule, but no argument is batched at this level: vmap's fallback "
            "calls the op again with FuncTorchBatched off"
        )
    else:
        what = (
            "no batching rule: vmap's fallback runs the op once per batch element "
            "(a slow for-loop) on the unbatched tensors"
        )
    return KernelOutcome("call", what, values=values, exclude=exclude)


def _vmap_fallback_refusal(call: OperatorCall, level: int) -> str | None:
    """Why vmap's per-sample fallback (``batchedTensorForLoopFallback``) refuses this call,
    in the order it checks: the schema, then in-place levels, mutation, returns, the switch."""
    op, schema, values = str(call.ref), call.schema, call.state.values
    if takes_tensor_list(schema):
        return vmap_cannot_generate_message(op, "it takes a Tensor[] or Tensor?[] argument")
    if not returns_only_tensors(schema):
        return vmap_cannot_generate_message(op, "it returns something other than Tensors")
    if not any(dispatcher.batched_level(value.tensor) == level for value in values):
        return None  # nothing batched here: the op is called again, unbatched
    if is_inplace(schema):
        if not dispatcher.vmap_fallback_enabled():
            return vmap_fallback_disabled_message(op)
        self_name = schema.arguments[0].name
        self_levels = [dispatcher.batched_level(v.tensor) for v in values if v.name == self_name]
        self_level = self_levels[0] if self_levels else None
        for value in values:
            other = dispatcher.batched_level(value.tensor)
            if other is not None and other != self_level:
                return vmap_inplace_message(op, value.name)
        return None
    if schema.is_mutable or has_alias_info(schema):
        return vmap_refuses_message(op, "the fallback does not work on out= or view ops")
    if not list(schema.returns):
        return vmap_refuses_message(op, "the fallback does not support ops with no returns")
    if not dispatcher.vmap_fallback_enabled():
        return vmap_fallback_disabled_message(op)
    return None


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
