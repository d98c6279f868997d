"""Every operator call of a thread (and of the threads torch hands its work to), logged
without changing how it dispatches.

``start(describe, check, owner, ...)`` logs each operator call the dispatcher makes on this
thread, as an enter and an exit event, until ``stop()`` hands the log over. Each enter event
names a segment id that ``describe(op, name, overload, inputs, python_decides)`` returned for
the call (``inputs``: its arguments in schema order as Python values). The observer asks only
when it has not seen the operator called in the same dispatch state, and keeps the answers
across logs of the same ``owner`` (segment ids mean something to their owner only); the
first time a log sees an operator it asks ``check(op, name, overload)`` whether they still
hold (``False`` drops them). It always asks when Python code decides the path
(``python_decides``: a dispatch mode, a tensor subclass, a torch.func transform,
functionalization). ``describe`` returns ``(segment, argument summaries or None, flags)``:
summaries when Python decides (otherwise the observer summarises the arguments itself),
flags :data:`RUNS_PYTHON` (the call's kernels are Python code), :data:`HIDE` (leave the
call and everything under it out, counting them), :data:`NO_VALUES` and
:data:`MAKES_VALUES` (which outputs ``values`` summarises: those of the calls the traced
code, a node or region, a decomposition or a Python kernel made, views of inputs aside).

Besides operator calls the log holds the autograd nodes that run (torch's BACKWARD_FUNCTION
records, with the sequence number that ties a node to the forward call that made it) and the
named ranges whose names start with one of ``ranges`` (``autograd::engine::evaluate_function:``,
``Torch-Compiled Region:``). Given ``user_code(code) -> bool``, each call the user's Python
code can have made carries its origin: the innermost frame whose code ``user_code`` accepts
and the ``nn.Module`` objects whose ``__call__`` (one of ``module_calls``) runs inside
``stop_frame``. With ``values``, each call's exit carries min/max/mean of its tensor outputs.

The hooks are thread-local RecordFunction callbacks, the ones torch.profiler uses: they add no
dispatch key and leave the thread-local dispatch state alone; torch copies them with its
thread-local state to the threads it hands work to (the autograd engine's device and
re-entrant threads), whose calls go to logs of their own. torch has no Python API to add
one, so it is C++ (``op_observer.cpp``), built through the cache service
(:mod:`opmagic.cachedir`) under a key of everything the build reads (:func:`build_identity`:
the source, flags, compiler, torch's install and Python), and loaded only once its size and
SHA-256 match the record of its build: by the first call that needs it, or ahead of it on a
daemon thread (:func:`build_in_background`), which that call then waits for, saying so.
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from ..cachedir import (
    BackgroundBuild,
    BuildCache,
    Stopwatch,
    artifact_problem,
    artifact_record,
    compiler_environment,
    digest,
    file_digest,
    private_copy,
    read_record,
    remove_path,
    write_atomic,
)
from ..errors import BuildError, LoadError

SOURCE = Path(__file__).with_name("op_observer.cpp")
# -O1: a third less compile time than -O2 and the same per-call cost (benchmarks/trace_overhead.py);
# NDEBUG: torch's release headers assert otherwise
FLAGS = ("-O1", "-DNDEBUG")
MODULE_NAME = "opmagic_op_observer"  # the Python extension module it is built as
LIBRARY = f"{MODULE_NAME}.so"
RECORD = "build.json"  # the library's size and SHA-256, what the build took, its identity
KIND = "operator observer"  # how the cache remembers what its last build took

# describe(op index, name, overload, inputs, python_decides) -> (segment, summaries, flags)
Describe = Callable[[int, str, str, tuple[Any, ...], bool], tuple[int, Any, int]]
# check(op index, name, overload) -> whether the answers about the operator still hold
Check = Callable[[int, str, str], bool]
RUNS_PYTHON = 1  # describe's flag: the call's kernels run Python code
HIDE = 2  # describe's flag: leave the call and the calls under it out of the log
NO_VALUES = 4  # describe's flag: its outputs are views of its inputs (values skips them)
MAKES_VALUES = 8  # describe's flag: a decomposition, whose calls compute values
# Event kinds: an operator call's enter event starts with the operator's index (>= 0)
EXIT, RANGE, NODE, HIDDEN = -1, -2, -3, -4
# Enter events are (kind, detail, time_ns, overhead_ns, arguments, sequence_nr, origin, extra):
#   a call: detail its segment, arguments as logged, extra the number of Python modules
#     loaded when describe was asked (-1 if it was not), less those the observer's own
#     callbacks loaded;
#   RANGE and NODE: detail the name, extra the RecordFunction id of the thread that ran the
#     forward (a node's sequence number and that thread name the call that made it);
#   HIDDEN: detail the segment describe gave it.
#   origin: (code, line, modules) or None (the caller's).
# Exit events are (EXIT, unwinding, time_ns, overhead_ns, outputs, extra): outputs (with
# values) a tuple per output of None, ((dtype, device, shape, requires_grad), (min, max,
# mean) or None) or a list of those (a tensor list); extra the modules loaded (a described
# call), the calls left out (HIDDEN), or -1.
# A thread's log: (native thread id, thread name, RecordFunction thread id, events)
ThreadLog = tuple[int, str, int, list[tuple[Any, ...]]]
Log = tuple[list[tuple[str, str]], list[ThreadLog], BaseException | None]


def start(
    describe: Describe,
    check: Check,
    owner: str,
    *,
    user_code: Callable[[Any], bool] | None = None,
    module_calls: tuple[Any, ...] = (),
    stop_frame: Any = None,
    ranges: tuple[str, ...] = (),
    values: bool = False,
    set_eval_frame: Callable[[Any], Any] | None = None,
) -> None:
    """Log every operator call on this thread (and on the threads torch hands its work to)
    until :func:`stop`; see the module docstring. ``set_eval_frame``: torch.compile's frame
    hook setter, switched off while the observer's Python callbacks run (else a call inside
    a compiled function has dynamo compile them)."""
    _module().start(
        describe,
        check,
        owner,
        user_code,
        tuple(module_calls),
        stop_frame,
        tuple(ranges),
        values,
        set_eval_frame,
    )


def stop() -> Log:
    """Stop logging: ``(ops, threads, error)``, ``threads`` the thread that started first,
    ``error`` the exception a callback raised (the log stops there) or ``None``."""
    ops, threads, error = _module().stop()
    return ops, threads, error


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


def build_identity() -> dict[str, Any]:
    """Everything the observer's build reads, the parts of its cache key: the source (its
    SHA-256) and flags, torch (version and install: its headers and libraries), the compiler
    (the one torch builds extensions with, where it is found and its version), Python, and
    the environment variables that steer the compiler.

    Read without importing ``torch.utils.cpp_extension`` (it imports setuptools: most of
    what ``%load_ext opmagic`` would cost): its compiler is ``$CXX`` or ``c++``, its include
    and library directories lie in torch's install."""
    compiler = os.environ.get("CXX", "c++")
    torch_root = os.path.dirname(torch.__file__)
    return {
        "source": file_digest(SOURCE),
        "flags": FLAGS,
        "torch": torch.__version__,
        "torch_git": torch.version.git_version,
        "torch_install": torch_root,
        "compiler": compiler,
        "compiler_version": _compiler_version(compiler, os.environ.get("PATH", "")),
        "python": sys.version,
        "python_include": sysconfig.get_paths()["include"],
        "environment": compiler_environment(),
    }


def build_directory() -> Path:
    """Where this environment's build of the observer lives in the cache."""
    return BuildCache().observer_dir(digest(build_identity()))


def build_in_background() -> threading.Thread | None:
    """Start building the observer on a daemon thread when it is neither loaded nor in the
    cache (``%load_ext opmagic`` calls this, so that the first trace need not wait for the
    compiler).

    Returns the thread, or ``None`` when there is nothing to do. A failed build never raises
    here: the first trace that needs the observer reports it.
    """
    return _observer.start()


@functools.cache
def _compiler_version(compiler: str, path: str) -> str:
    """Where ``compiler`` is found on ``path`` and what its ``--version`` says (once each)."""
    command = shlex.split(compiler)
    found = shutil.which(command[0], path=path) if command else None
    try:
        version = subprocess.run(
            [*command, "--version"], capture_output=True, text=True, timeout=60, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):  # the build says what is wrong with it
        return f"{found}: does not run"
    return f"{found}: {version.strip()}"


class _ObserverBuild(BackgroundBuild[ModuleType]):
    """The observer of this process: loaded from the cache, or built into it first."""

    library = "the operator observer"

    def published(self) -> bool:
        """Whether this environment's build is in the cache (not hashed: loading checks)."""
        directory = build_directory()
        record, _ = read_record(directory, RECORD)
        return record is not None and not artifact_problem(
            directory / LIBRARY, record.get("library"), rehash=False
        )

    def expected_seconds(self) -> float | None:
        """What the last build of the observer took on this machine."""
        return BuildCache().last_seconds(KIND)

    def make(self, stopwatch: Stopwatch) -> ModuleType:
        """The published build of this environment's key, loaded; built under the key's lock
        when it is missing or damaged (a damaged one is never loaded)."""
        cache = BuildCache()
        identity = build_identity()
        key = digest(identity)
        directory = cache.observer_dir(key)
        module, damage = _load(directory)
        if module is not None:
            return module

        def on_wait(pid: str) -> None:
            stopwatch.report(f"waiting for pid {pid}, which builds the operator observer")

        try:
            with cache.locked(key, on_wait) as waited:
                if waited:  # the process we waited for may have published it
                    module, damage = _load(directory)
                    if module is not None:
                        stopwatch.finish()
                        return module
                _build(cache, key, directory, identity, stopwatch, damage)
        except OSError as error:
            raise cache.unwritable(error, "build the operator observer") from None
        module, problem = _load(directory)
        if module is None:
            raise BuildError(
                f"opmagic built its operator observer into {directory}, but {problem}. "
                "Trace again; if it persists, delete that directory."
            )
        stopwatch.finish()
        return module


_observer = _ObserverBuild()


def _module() -> ModuleType:
    """The compiled observer: loaded or built on first use, or the background build waited
    for (with progress on stderr)."""
    return _observer.get()


def _load(directory: Path) -> tuple[ModuleType | None, str]:
    """``(the observer published in directory, loaded, "")``, or ``(None, why not)``: "" when
    there is none, else what is wrong with it (checked before anything of it is loaded)."""
    record, damage = read_record(directory, RECORD)
    if record is None:
        return None, damage
    library = directory / LIBRARY
    damage = artifact_problem(library, record.get("library"), rehash=True) or ""
    if damage:
        return None, damage
    try:
        with private_copy(library, record["library"]["sha256"]) as name:
            loader = importlib.machinery.ExtensionFileLoader(MODULE_NAME, name)
            spec = importlib.util.spec_from_file_location(MODULE_NAME, name, loader=loader)
            assert spec is not None  # given its loader, a location always makes a spec
            module = importlib.util.module_from_spec(spec)  # maps the library
            loader.exec_module(module)
    except (ImportError, LoadError) as error:  # an undefined symbol, changed meanwhile, ...
        return None, f"it does not load: {error}"
    return module, ""


def _build(
    cache: BuildCache,
    key: str,
    directory: Path,
    identity: dict[str, Any],
    stopwatch: Stopwatch,
    damage: str,
) -> None:
    """Compile the observer and publish it in ``directory`` with its record (call with the
    key's lock held); remember what the build took, for the next estimate."""
    if damage:
        stopwatch.report(f"rebuilding the operator observer: the cached one is damaged ({damage})")
    else:
        stopwatch.report("compiling the operator observer that trace uses")
    try:
        with cache.publishing(key, directory) as scratch, stopwatch.ticking():
            seconds = _compile(scratch, directory)
            record = {"library": artifact_record(scratch / LIBRARY), "seconds": seconds}
            write_atomic(scratch / RECORD, json.dumps({**record, "identity": identity}, indent=1))
    except BaseException:
        stopwatch.finish(failed=True)
        raise
    cache.record_seconds(KIND, seconds)


def _compile(scratch: Path, directory: Path) -> float:
    """Build the extension module into ``scratch`` as torch builds extensions (ninja, its
    flags), without loading it; only the library is kept. Returns the seconds it took."""
    from torch.utils import cpp_extension

    started = time.perf_counter()
    try:
        cpp_extension._write_ninja_file_and_build_library(
            name=MODULE_NAME,
            sources=[str(SOURCE)],
            extra_cflags=list(FLAGS),
            extra_cuda_cflags=[],
            extra_sycl_cflags=[],
            extra_ldflags=[],
            extra_include_paths=[],
            build_directory=str(scratch),
            verbose=False,
            with_cuda=False,
            with_sycl=False,
        )
    except Exception as exc:  # the compiler's, ninja's or torch's check's error, in words
        raise _build_error(exc, directory) from exc
    seconds = time.perf_counter() - started
    for leftover in scratch.iterdir():  # objects, ninja's files
        if leftover.name != LIBRARY:
            remove_path(leftover)
    return seconds


def _build_error(exc: Exception, directory: Path) -> BuildError:
    """The failed build's error: its output, without ninja's echo of every command."""
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
    return BuildError(
        f"opmagic could not build its operator observer (C++, built once into "
        f"{directory}): {detail}\nTracing needs a C++ compiler that can build torch "
        "extensions (g++, ninja and the Python headers); fix the error above and trace again."
    )
