"""Running one compiler command, reporting progress while it runs."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ..cachedir import TICK_SECONDS, Stopwatch


@dataclass(frozen=True)
class StepResult:
    """What one compiler command did."""

    command: tuple[str, ...]
    returncode: int
    output: str  # stdout and stderr, interleaved as the compiler wrote them
    seconds: float

    @property
    def command_line(self) -> str:
        """The command as a shell line (for logs and ``verbose``)."""
        return shlex.join(self.command)


def run_step(
    command: list[str],
    *,
    cwd: Path,
    stopwatch: Stopwatch | None = None,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
) -> StepResult:
    """Run ``command`` in ``cwd``, ticking ``stopwatch`` until it exits.

    The output goes to an in-memory file (``memfd``), not a pipe, so a compiler that writes a
    lot never blocks on it, and a full disk cannot swallow the message that says so. The
    command runs in a process group of its own: interrupting (Ctrl-C, a notebook's stop
    button) kills the whole group, the driver and the ``cc1plus``, ``as``, ``ld`` or
    ``ccache`` it started. So does this process's death (a kernel killed with SIGKILL): the
    group's leader is a small shell (:data:`_GUARD`) that the kernel signals when its parent
    dies (``PR_SET_PDEATHSIG``), and that kills its group then.
    """
    started = time.perf_counter()
    descriptor = os.memfd_create("opmagic-output", os.MFD_CLOEXEC)
    with os.fdopen(descriptor, "w+", errors="replace") as log:
        process = subprocess.Popen(
            ["sh", "-c", _GUARD, "opmagic-step", *command],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group (and no terminal's Ctrl-C)
            preexec_fn=functools.partial(_die_with, os.getpid()),
        )
        try:
            if stdin is not None and process.stdin is not None:
                process.stdin.write(stdin)
                process.stdin.close()
            while True:
                try:
                    process.wait(timeout=TICK_SECONDS)
                    break
                except subprocess.TimeoutExpired:
                    if stopwatch is not None:
                        stopwatch.report()
        except BaseException:
            _kill_group(process)
            raise
        log.seek(0)
        output = log.read()
    return StepResult(tuple(command), process.returncode, output, time.perf_counter() - started)


# The leader of a step's process group: runs the command, and kills the group (the compiler
# and what it started) when it is sent SIGTERM, which it is when the process that started it
# dies (_die_with). A command in the background reads its stdin only when it is redirected.
_GUARD = 'trap "kill -KILL 0" TERM; exec 3<&0; "$@" <&3 3<&- & wait $!'
_PR_SET_PDEATHSIG = 1


def _die_with(parent: int) -> None:
    """In the forked child, before it runs the guard: SIGTERM when ``parent`` dies (or now,
    when it died already)."""
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


def _kill_group(process: subprocess.Popen) -> None:
    """Kill ``process`` and every process it started (its group), and reap it."""
    with contextlib.suppress(ProcessLookupError):  # the group is gone already
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
