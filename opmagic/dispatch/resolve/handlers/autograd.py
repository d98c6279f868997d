"""Autograd, ADInplaceOrView and autocast: the kernels that record, guard or cast, then
redispatch or call the op again."""

from __future__ import annotations

import torch

from ...._torch import dispatcher
from ...table import TableEntry
from ..binding import DispatchValue
from ..call import KernelOutcome, OperatorCall
from ..messages import must_override_setup_context_message
from .registry import handles, redispatch, runs_then_redispatches_below


@handles("AutogradFunctionality", "AutogradOther", "AutogradNestedTensor")
def autograd(call: OperatorCall, key: str, entry: TableEntry, keyset: int) -> KernelOutcome:
    """Autograd kernels (or the autograd fallback) redispatch below autograd, guarded.

    custom_op's autograd kernel runs an autograd.Function when grad mode is on and an input
    requires grad; inside a torch.func transform that Function raises.
    """
    if (
        call.custom_op_kernel(entry) is not None
        and call.state.layers
        and torch.is_grad_enabled()
        and any(value.tensor.requires_grad for value in call.state.values)
    ):
        return KernelOutcome("error", must_override_setup_context_message(str(call.ref)))
    if entry.kind == "fallback":
        note = (
            "no autograd kernel for this op: the autograd fallback (mode "
            f"'{dispatcher.autograd_fallback_mode()}') runs the op below autograd; backward "
            "through its outputs warns or raises"
        )
    elif (parts := call.custom_op_kernel(entry)) is not None and parts["backward"] is None:
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
    """Autocast wrappers cast their inputs and call the op again with their key off.

    A ``register_autocast`` rule (custom_op's or ``torch.library``'s) casts every
    floating-point input on its device (but float64) to its dtype; the copies are fresh
    tensors, so the next dispatch reads their keys (no math bits; no autograd or
    ADInplaceOrView keys under inference_mode).
    For aten's wrappers the cast inputs keep the keys of the originals.
    """
    if "autocast_mode.cpp" in (entry.site or ""):
        return KernelOutcome(
            "call",
            f"the autocast wrapper {entry.source}: casts floating-point inputs, then calls the "
            f"op again with {key} off",
            exclude=call.catalogue.functionality_raw(key),
        )
    device = key.removeprefix("Autocast").lower()
    parts = call.custom_op_kernel(entry)
    if parts is not None:
        dtype = parts["autocast"].get(device)
    else:
        dtype = dispatcher.library_autocast_dtype(call.ref.op_overload(), key)
        if dtype is None:
            return runs_then_redispatches_below(call, key, entry, keyset)
    cast = {value.name for value in call.state.values if _autocast_casts(value, device, dtype)}
    copies = _fresh_copy_keys(call)
    what = entry.impl or f"the autocast rule {entry.source} (casts floating inputs to {dtype})"
    note = f"{what}: casts, then calls the op again with {key} off"
    if cast:
        note += f"; the cast copies of {', '.join(sorted(cast))} carry their own keys"
    return KernelOutcome(
        "call",
        note,
        exclude=call.catalogue.functionality_raw(key),
        values=[
            value.with_keyset(value.keyset & copies) if value.name in cast else value
            for value in call.state.values
        ],
    )


def _autocast_casts(value: DispatchValue, device: str, dtype: torch.dtype | None) -> bool:
    """Whether custom_op's autocast rule copies this input (``value.to(dtype)`` is a copy)."""
    tensor = value.tensor
    return (
        dtype is not None
        and tensor.is_floating_point()
        and tensor.device.type == device
        and tensor.dtype not in (torch.float64, dtype)
    )


def _fresh_copy_keys(call: OperatorCall) -> int:
    """The mask of keys a fresh copy of a tensor keeps: no math bits, and under
    inference_mode (an inference tensor) no autograd or ADInplaceOrView keys."""
    catalogue = call.catalogue
    dropped = (
        catalogue.functionality_raw("Conjugate")
        | catalogue.functionality_raw("Negative")
        | catalogue.functionality_raw("ZeroTensor")
    )
    if torch.is_inference_mode_enabled():
        dropped |= catalogue.category_raw("autograd") | catalogue.functionality_raw(
            "ADInplaceOrView"
        )
    return ~dropped
