"""The handler registry and the moves handlers share.

A handler gets the call (:class:`~..call.OperatorCall`, whose ``state`` is the dispatcher
state the walk has reached), the key, the table entry that serves it and the keyset it was
picked from, and returns a :class:`~..call.KernelOutcome`. :func:`kernel_outcome` picks the
handler by the key's functionality (or category); keys with no handler run the user's
kernel and redispatch below it (:func:`runs_then_redispatches_below`).
"""

from __future__ import annotations

from collections.abc import Callable

from ...table import TableEntry
from ..call import KernelOutcome, OperatorCall
from ..messages import (
    ambiguous_kernel_message,
    fallthrough_reached_message,
    missing_kernel_message,
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
    if entry.kind == "fallthrough":  # a keyset built without the op's fallthrough mask
        return KernelOutcome("error", fallthrough_reached_message(str(call.ref), key))
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
