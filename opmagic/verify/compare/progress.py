"""A sweep's progress (compare's cases, the doctor's rungs): sent to a callback, or shown as
a bar once the sweep takes a moment."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ...errors import CompareError
from .result import SweepProgress

PROGRESS_DELAY_S = 0.5  # a sweep shows its progress bar once it has run this long

ProgressCallback = Callable[[SweepProgress], None]


class Reporter:
    """Sends a sweep's progress to a callback, or shows it once the sweep has taken
    :data:`PROGRESS_DELAY_S` (through the ``"live"`` view of :class:`SweepProgress`)."""

    def __init__(
        self,
        progress: bool | ProgressCallback,
        total: int,
        task: str = "compare",
        unit: str = "cases",
    ) -> None:
        if not (isinstance(progress, bool) or callable(progress)):
            raise CompareError(
                f"progress must be True (a bar), False (none) or a callable taking a "
                f"SweepProgress; got {progress!r:.60}."
            )
        self.callback = progress if callable(progress) else None
        self.show = progress is True
        self.total = total
        self.task = task
        self.unit = unit
        self.started = time.perf_counter()
        self.live: Any = None  # what shows the bar, once it is shown

    def report(self, done: int, case: str) -> None:
        """Case ``done + 1`` is starting."""
        self._send(
            SweepProgress(done, self.total, case, self._elapsed(), task=self.task, unit=self.unit)
        )

    def finish(self, done: int) -> None:
        """The sweep ended, after ``done`` cases (fewer than planned: it was stopped)."""
        stopped = done < self.total
        self._send(
            SweepProgress(
                done, self.total, "", self._elapsed(), True, stopped, self.task, self.unit
            )
        )

    def _elapsed(self) -> float:
        return time.perf_counter() - self.started

    def _send(self, event: SweepProgress) -> None:
        if self.callback is not None:
            try:
                self.callback(event)
            except Exception as error:  # the caller's callback: say so, not where in compare
                name = getattr(self.callback, "__qualname__", repr(self.callback))
                raise CompareError(
                    f"The progress callback {name} raised {type(error).__name__}: {error}. "
                    "It is called with a SweepProgress; pass progress=True, False or such a "
                    "callable."
                ) from error
        elif self.live is not None:
            self.live.update(event)
        elif self.show and event.elapsed >= PROGRESS_DELAY_S:
            self.live = event.view("live")
