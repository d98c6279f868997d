"""Autograd, ADInplaceOrView and autocast: the kernels that record, guard or cast, then
redispatch or call the op again."""

from __future__ import annotations

from ...._torch import dispatcher
from ...table import TableEntry
from ..call import KernelOutcome, OperatorCall
from .registry import handles, redispatch, runs_then_redispatches_below


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
