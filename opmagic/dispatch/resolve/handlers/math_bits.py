"""The Conjugate, Negative and ZeroTensor fallbacks: materialise flagged inputs, or refuse."""

from __future__ import annotations

from ...table import TableEntry
from ..call import KernelOutcome, OperatorCall
from .registry import handles, redispatch, runs_then_redispatches_below


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
