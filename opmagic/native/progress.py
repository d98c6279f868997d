"""Build progress: what the build is doing and for how long, for whoever shows it.

The build reports :class:`BuildProgress` events to a callback a few times a second; the
notebook front updates a display in place, scripts get :func:`stderr_progress`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

TICK_SECONDS = 0.25


@dataclass(frozen=True)
class BuildProgress:
    """One progress report: the current step of building ``library`` and the time so far."""

    library: str  # file name of the library being built, e.g. "libmyops.so"
    step: str  # "waiting for pid 123", "precompiling headers (...)", "compiling", "linking"
    elapsed: float  # seconds since the build started
    finished: bool = False
    failed: bool = False

    def __str__(self) -> str:
        if self.failed:
            return f"opmagic: building {self.library} failed after {self.elapsed:.1f} s"
        if self.finished:
            return f"opmagic: built {self.library} in {self.elapsed:.1f} s"
        return f"opmagic: {self.library}: {self.step} … {self.elapsed:.1f} s"


ProgressCallback = Callable[[BuildProgress], None]


class StderrProgress:
    """Progress on stderr: one line rewritten in place on a terminal, one line per step else."""

    def __init__(self) -> None:
        self._last_step: str | None = None

    def __call__(self, event: BuildProgress) -> None:
        """Show ``event`` (called by the build a few times a second)."""
        stream = sys.stderr
        if stream.isatty():
            end = "\n" if event.finished else ""
            stream.write(f"\r\x1b[2K{event}{end}")
        elif event.finished or event.step != self._last_step:
            stream.write(f"{event}\n")
        stream.flush()
        self._last_step = event.step


# The default progress callback of ``compile_library``: a line on stderr.
stderr_progress: ProgressCallback = StderrProgress()


class Stopwatch:
    """Reports steps of one build to a callback, each tick with the time since the start."""

    def __init__(self, library: str, callback: ProgressCallback | None) -> None:
        self.library = library
        self.callback = callback
        self.started = time.perf_counter()
        self.step = ""

    @property
    def elapsed(self) -> float:
        """Seconds since the build started."""
        return time.perf_counter() - self.started

    def report(self, step: str | None = None) -> None:
        """Report the current (or a new) step with the elapsed time."""
        if step is not None:
            self.step = step
        if self.callback is not None:
            self.callback(BuildProgress(self.library, self.step, self.elapsed))

    def finish(self, failed: bool = False) -> None:
        """Report that the build is done (or failed)."""
        if self.callback is not None:
            self.callback(
                BuildProgress(self.library, self.step, self.elapsed, finished=True, failed=failed)
            )
