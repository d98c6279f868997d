"""Every operator call on this thread, logged without changing how it dispatches.

``start(describe, check, owner)`` logs each operator call the dispatcher makes on this
thread, as an enter and an exit event, until ``stop()`` hands the log over. Each enter event
names a segment id that ``describe(op, name, overload, inputs, python_decides)`` returned for
the call (``inputs``: its arguments in schema order as Python values). The observer asks only
when it has not seen the operator called in the same dispatch state, and keeps the answers
across logs of the same ``owner`` (segment ids mean something to their owner only); the
first time a log sees an operator it asks ``check(op, name, overload)`` whether they still
hold (``False`` drops them). It always asks when Python code decides the path
(``python_decides``: a dispatch mode, a tensor subclass, a torch.func transform,
functionalization); then ``describe`` returns ``(segment, argument summaries)``, otherwise
``(segment, None)`` and the observer summarises the arguments itself.

The hook is a thread-local RecordFunction callback, the one torch.profiler uses: it adds no
dispatch key and leaves the thread-local dispatch state alone. torch has no Python API to add
one, so it is C++ (``op_observer.cpp``), compiled once per torch, Python and compiler into the
per-user cache (``$XDG_CACHE_HOME/opmagic``, private to the user): by the first call that
needs it, or ahead of it on a daemon thread (:func:`build_in_background`), which that call
then waits for.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import stat
import sys
import sysconfig
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from ..errors import BuildError, CacheDirectoryError

SOURCE = Path(__file__).with_name("op_observer.cpp")
# -O1: a third less compile time than -O2 and the same per-call cost (benchmarks/trace.py);
# NDEBUG: torch's release headers assert otherwise
FLAGS = ("-O1", "-DNDEBUG")

# describe(op index, name, overload, inputs, python_decides) -> (segment, summaries or None)
Describe = Callable[[int, str, str, tuple[Any, ...], bool], tuple[int, Any]]
# check(op index, name, overload) -> whether the answers about the operator still hold
Check = Callable[[int, str, str], bool]
# (ops, events, error): ops as (name, overload) by index; events (op, segment, time_ns,
# overhead_ns, arguments) for enters and (-1, unwinding, time_ns, overhead_ns, None) for exits
Log = tuple[list[tuple[str, str]], list[tuple[Any, ...]], BaseException | None]


def start(describe: Describe, check: Check, owner: str) -> None:
    """Log every operator call on this thread until :func:`stop`; see the module docstring."""
    _module().start(describe, check, owner)


def stop() -> Log:
    """Stop logging this thread: ``(ops, events, error)``, ``error`` being the exception
    ``describe`` raised (the log stops there) or ``None``."""
    ops, events, error = _module().stop()
    return ops, events, error


def running() -> bool:
    """Whether this thread is being observed."""
    return _module().running()


def position() -> int:
    """How many events this thread's log holds so far: something that happens now comes after
    that many enters and exits (the trace places notes among its calls by it)."""
    return _module().position()


@functools.cache
def enum_tables() -> dict[str, tuple[Any, ...]]:
    """``torch.dtype``, ``torch.layout`` and ``torch.memory_format`` objects by enum value,
    keyed ``"ScalarType"``, ``"Layout"``, ``"MemoryFormat"``: reported inputs hold them as ints."""
    return {name: tuple(objects) for name, objects in _module().enum_tables().items()}


def build_directory() -> Path:
    """Where this torch's, Python's and compiler's build of the observer lives."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    identity = "\0".join(
        (
            SOURCE.read_text(),
            torch.__version__,
            sys.version,
            sysconfig.get_config_var("CXX") or "",
            os.environ.get("CXX", ""),
            " ".join(FLAGS),
        )
    )
    key = hashlib.sha256(identity.encode()).hexdigest()[:16]
    return Path(base) / "opmagic" / "op_observer" / key


def build_in_background() -> threading.Thread | None:
    """Start compiling the observer on a daemon thread when it is neither loaded nor built
    (``%load_ext opmagic`` calls this, so that the first trace need not wait for the compiler).

    Returns the thread, or ``None`` when there is nothing to do. A failed build never raises
    here: the first trace that needs the observer reports it.
    """
    if not _observer.lock.acquire(blocking=False):
        return None  # another thread is building or loading it now
    try:
        if _observer.module is not None or _observer.failure is not None or _built():
            _observer.lock.release()
            return None
        thread = threading.Thread(
            target=_build_holding_lock, name="opmagic operator observer build", daemon=True
        )
        thread.start()  # from here the thread holds the lock; it releases it when done
    except BaseException:
        _observer.lock.release()
        raise
    return thread


class _Observer:
    """The compiled observer of this process, built or loaded by the first thread needing it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # held while a thread builds or loads the module
        self.module: ModuleType | None = None
        self.failure: BaseException | None = None  # what the background build raised
        self.failure_reported = False  # a trace raised it: the next one builds again
        self.announce_lock = threading.Lock()
        self.announced = False  # the line saying a trace waits for the build was printed


_observer = _Observer()


def _module() -> ModuleType:
    """The compiled observer: built on first use, or the background build waited for."""
    module = _observer.module
    if module is not None:
        return module
    waited = False
    if not _observer.lock.acquire(blocking=False):
        _announce_wait()
        _observer.lock.acquire()
        waited = True
    try:
        if _observer.module is None:
            failure = _observer.failure
            if failure is not None and (waited or not _observer.failure_reported):
                _observer.failure_reported = True  # to every trace that waited for the build
                raise failure.with_traceback(None)
            _observer.failure = None
            _observer.module = _build(announce=True)
        return _observer.module
    finally:
        _observer.lock.release()


def _build_holding_lock() -> None:
    """The background build: keeps the module, or the failure for the first trace to report."""
    try:
        _observer.module = _build(announce=False)
    except Exception as exc:  # reported by the trace that needs the observer, not here
        _observer.failure = exc
        _observer.failure_reported = False
    finally:
        _observer.lock.release()


def _announce_wait() -> None:
    """Say once per process that a trace waits for the observer's build (one line)."""
    with _observer.announce_lock:
        if _observer.announced:
            return
        _observer.announced = True
    print(
        "opmagic: waiting for the operator observer that trace uses to finish compiling "
        "(started by %load_ext opmagic; once per torch version)...",
        file=sys.stderr,
        flush=True,
    )


def _library_name(directory: Path) -> str:
    return f"opmagic_op_observer_{directory.name}"


def _built() -> bool:
    """Whether this torch's build of the observer is in the cache already."""
    try:
        directory = build_directory()
        return (directory / f"{_library_name(directory)}.so").exists()
    except OSError:  # an unreadable cache: the build says what is wrong
        return False


def _build(announce: bool) -> ModuleType:
    """Compile the observer into the cache (a no-op when built) and load it.

    Builds of one directory are serialised across processes by an flock the kernel drops
    when its holder dies, so a baton torch's builder left behind (its process died while
    building, e.g. a background build at interpreter exit) is stale and removed.
    """
    from torch.utils import cpp_extension

    directory = build_directory()
    _make_private(directory)
    name = _library_name(directory)
    with _exclusive(directory / "opmagic.lock"):
        (directory / "lock").unlink(missing_ok=True)  # cpp_extension's baton, left by the dead
        if announce and not (directory / f"{name}.so").exists():
            print(
                "opmagic: compiling the operator observer that trace uses (once per torch "
                "version, about 15 s)...",
                file=sys.stderr,
                flush=True,
            )
        try:
            return cpp_extension.load(
                name=name,
                sources=[str(SOURCE)],
                build_directory=str(directory),
                extra_cflags=list(FLAGS),
                verbose=False,
            )
        except Exception as exc:  # the compiler's, ninja's or the loader's error, in words
            _forget_build(cpp_extension, name)
            output = getattr(exc, "output", None)  # a compiler check that failed says why here
            if isinstance(output, bytes):
                output = output.decode(errors="replace")
            detail = "\n".join(
                line  # ninja echoes each long compiler command twice: the errors are what matter
                for part in (exc, output)
                if part
                for line in str(part).strip().splitlines()
                if "-DTORCH_EXTENSION_NAME=" not in line
            )[-3000:]
            raise BuildError(
                f"opmagic could not build its operator observer (C++, built once into "
                f"{directory}): {detail}\nTracing needs a C++ compiler that can build torch "
                "extensions (g++ and the Python headers); fix the error above and trace again."
            ) from exc


def _forget_build(cpp_extension: ModuleType, name: str) -> None:
    """Make the next ``cpp_extension.load`` of ``name`` in this process build again: torch
    remembers each name's sources once asked, and skips the build of a failed one."""
    cpp_extension.JIT_EXTENSION_VERSIONER.entries.pop(name, None)


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on ``path`` (created 0600): released even if the process dies."""
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # closing drops the lock


def _make_private(directory: Path) -> None:
    """Create ``directory`` (mode 0700) and refuse a cache another user could write to."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    for path in (directory, directory.parent, directory.parent.parent):
        info = path.stat()
        if info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise CacheDirectoryError(
                f"{path} is not private to you (owned by uid {info.st_uid}, mode "
                f"{stat.filemode(info.st_mode)}): opmagic will not load code from it. Make it "
                f"yours with mode 0700 (chmod 700 {path}) or set XDG_CACHE_HOME elsewhere."
            )
