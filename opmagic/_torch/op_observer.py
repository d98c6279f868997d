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
per-user cache (``$XDG_CACHE_HOME/opmagic``, private to the user).
"""

from __future__ import annotations

import functools
import hashlib
import os
import stat
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from ..errors import BuildError, CacheDirectoryError

SOURCE = Path(__file__).with_name("op_observer.cpp")
FLAGS = ("-O2", "-DNDEBUG")  # NDEBUG: torch's release headers assert otherwise

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


@functools.cache
def _module() -> ModuleType:
    """The compiled observer, built on first use."""
    from torch.utils import cpp_extension

    directory = build_directory()
    _make_private(directory)
    name = f"opmagic_op_observer_{directory.name}"
    if not (directory / f"{name}.so").exists():
        print(
            "opmagic: compiling the operator observer that trace uses (once per torch version, "
            "about a minute)...",
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
    except (RuntimeError, OSError, ImportError) as exc:
        detail = str(exc).strip()[-3000:]
        raise BuildError(
            f"opmagic could not build its operator observer (C++, built once into {directory}): "
            f"{detail}\nTracing needs a C++ compiler that can build torch extensions (g++ and "
            "the Python headers); fix the error above, or delete that directory to rebuild."
        ) from exc


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
