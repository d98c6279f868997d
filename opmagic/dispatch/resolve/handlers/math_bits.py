"""The Conjugate, Negative and ZeroTensor fallbacks: materialise flagged inputs, or refuse.

Both fallbacks read the schema first: aliased arguments that mix writes and views are
refused, view ops pass through untouched. Otherwise the flagged inputs are materialised;
ZeroTensors are immutable, so a written one is refused, and a written conjugate or negative
view is copied back from the op's first return after the op ran, which fails when the op
does not return that input first (``(Tensor(a!) x) -> ()``).
"""

from __future__ import annotations

from ...table import TableEntry
from ..binding import DispatchValue
from ..call import KernelOutcome, OperatorCall
from ..messages import (
    math_bit_mixed_aliasing_message,
    math_bit_not_returned_message,
    math_bit_too_many_written_message,
    math_bit_written_list_message,
    zero_tensor_written_message,
)
from ..schema import is_view, mixes_writes_and_views, returns_first, writes
from .registry import handles, redispatch, runs_then_redispatches_below


@handles("Conjugate", "Negative", "ZeroTensor")
def math_bit(call: OperatorCall, key: str, entry: TableEntry, keyset: int) -> KernelOutcome:
    """Conjugate/Negative/ZeroTensor fallbacks materialise flagged inputs, then redispatch."""
    if entry.kind != "fallback":
        return runs_then_redispatches_below(call, key, entry, keyset)
    op, schema = str(call.ref), call.schema
    if mixes_writes_and_views(schema):
        return KernelOutcome("error", math_bit_mixed_aliasing_message(op, key))
    bit = call.catalogue.functionality_raw(key)
    below = call.catalogue.full_after(key)
    if is_view(schema):
        return redispatch(
            call, key, keyset, below, f"a view op: the {key} fallback redispatches untouched"
        )
    written = {a.name for a in schema.arguments if writes(a)}
    flagged = [value for value in call.state.values if value.keyset & bit]
    flagged_written = [value for value in flagged if _argument(value) in written]
    fails_after = None
    if key == "ZeroTensor":
        if flagged_written:
            return KernelOutcome("error", zero_tensor_written_message(op, flagged_written[0].name))
    elif flagged_written:
        if any(value.name != _argument(value) for value in flagged_written):
            return KernelOutcome("error", math_bit_written_list_message(op, key))
        if len(flagged_written) > 1:
            return KernelOutcome("error", math_bit_too_many_written_message(op, key))
        if not returns_first(schema, flagged_written[0].name):
            fails_after = math_bit_not_returned_message(op, key, flagged_written[0].name)
    outcome = redispatch(
        call,
        key,
        keyset,
        below,
        f"the {key} fallback materialises the flagged inputs, then redispatches"
        + (
            "; it then copies the result back into the written input, which fails"
            if fails_after
            else ""
        ),
    )
    outcome.values = [value.with_keyset(value.keyset & ~bit) for value in call.state.values]
    outcome.fails_after = fails_after
    return outcome


def _argument(value: DispatchValue) -> str:
    """The schema argument a dispatch value came from (``xs`` for ``xs[1]``)."""
    return value.name.split("[", 1)[0]
