"""Notes: what code outside the dispatcher attaches to the operator call running now.

The trace sees operator calls through the dispatcher's observer; some of what a call does
never reaches the dispatcher (a Triton kernel launched by a ``triton_op``'s launcher). Code
that knows such a thing happened calls :func:`note` with a value that describes it (a
:class:`~opmagic.display.Displayable` or anything with a useful ``str``); while a trace
records on this thread, the value is attached to the innermost operator call running at that
moment (``TracedCall.notes``, in order), or to the trace itself when no call is running
(``Trace.notes``). Without a trace, :func:`note` does nothing and costs a thread-local lookup.

This is the trace's one extension point: the recording owns the collecting
(:func:`collecting`), placing each note by the position the observer's log had reached.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

_collector = threading.local()


def note(value: Any) -> bool:
    """Attach ``value`` to the operator call running now, if a trace records on this thread;
    returns whether it was recorded."""
    collected: _Collected | None = getattr(_collector, "current", None)
    if collected is None:
        return False
    collected.notes.append((collected.position(), value))
    return True


def recording() -> bool:
    """Whether a trace records on this thread (a note would be kept): lets a note's maker
    skip describing what nobody records."""
    return getattr(_collector, "current", None) is not None


class _Collected:
    """The notes of one recording, each with the log position it was made at."""

    def __init__(self, position: Callable[[], int]) -> None:
        self.position = position
        self.notes: list[tuple[int, Any]] = []


@contextlib.contextmanager
def collecting(position: Callable[[], int]) -> Iterator[list[tuple[int, Any]]]:
    """Collect the notes made on this thread while inside, as ``(position, value)`` where
    ``position()`` (the observer's log length) says where among the calls each was made."""
    collected = _Collected(position)
    previous = getattr(_collector, "current", None)
    _collector.current = collected
    try:
        yield collected.notes
    finally:
        _collector.current = previous
