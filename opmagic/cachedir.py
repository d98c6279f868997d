"""The one cache service: where every compiled artefact lives, and why it can be trusted.

``$XDG_CACHE_HOME/opmagic`` (``~/.cache/opmagic``), mode 0700 and owned by the user: every
directory in it is checked before anything in it is loaded, because loading a library runs
its code, and every artefact is checked against the size and SHA-256 recorded when it was
published (:func:`artifact_record`, :func:`artifact_problem`); a library is loaded from a
checked private copy (:func:`private_copy`). Keys are hashes of everything a build reads
(:func:`digest`, :func:`compiler_environment`). Work on one key is serialised by
an ``flock`` on a lock file, which the kernel releases when the holder dies (a SIGKILLed build
never leaves a stale lock); results are published atomically (:meth:`BuildCache.publishing`:
one rename of a finished directory), so no reader ever sees half a library. A read-only cache
still serves the builds it holds.

Builds report their steps as :class:`BuildProgress` events (:class:`Stopwatch`; a line on
stderr by default), with what the same build took here last time
(:meth:`BuildCache.last_seconds`). :class:`BackgroundBuild` makes something once per
process, ahead of its first use on a daemon thread, and makes its first users wait for that
build, saying so.

Users: ``native/`` (libraries, precompiled headers) and ``_torch/op_observer.py`` (trace's
observer). This module imports no other opmagic module but :mod:`opmagic.errors`.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import itertools
import json
import os
import re
import shutil
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from .display import format_duration
from .errors import CacheDirectoryError, CacheFullError, LoadError, OpmagicError

T = TypeVar("T")

LAYOUT_VERSION = "v1"  # bump when the layout or the meaning of a key changes
LOCK_POLL_SECONDS = 0.1
TICK_SECONDS = 0.25  # how often a running build reports its progress
# libs: published libraries; prefix: prefix headers and their precompiled forms; observer:
# trace's operator observer; locks: one lock file per key; tmp: scratch directories of builds
SUBDIRECTORIES = ("libs", "prefix", "observer", "locks", "tmp")
SECONDS_FILE = "seconds.json"  # what the last build of each kind took on this machine
READ_ONLY_ERRORS = (errno.EROFS, errno.EACCES, errno.EPERM)
NO_SPACE_ERRORS = (errno.ENOSPC, errno.EDQUOT)
NO_SPACE = re.compile(r"No space left on device|Disk quota exceeded")
# environment variables that change which files the compiler, nvcc or the linker read
COMPILER_ENVIRONMENT = (
    "CPATH",
    "C_INCLUDE_PATH",
    "CPLUS_INCLUDE_PATH",
    "LIBRARY_PATH",
    "GCC_EXEC_PREFIX",
    "COMPILER_PATH",
    "NVCC_PREPEND_FLAGS",
    "NVCC_APPEND_FLAGS",
)


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/opmagic`` (default ``~/.cache/opmagic``); not created here."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "opmagic"


def digest(parts: Any) -> str:
    """A short stable hash of JSON-able parts (the cache key of whatever they describe)."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def compiler_environment() -> dict[str, str]:
    """The variables of :data:`COMPILER_ENVIRONMENT` that are set: part of every build's key."""
    return {name: os.environ[name] for name in COMPILER_ENVIRONMENT if name in os.environ}


class BuildCache:
    """The cache directory of this user, checked to be private to them."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = (root or cache_root()).absolute()
        self.home = self.root / LAYOUT_VERSION
        try:
            for directory in (self.root, self.home, *(self.home / s for s in SUBDIRECTORIES)):
                _make_private_dir(directory)
                check_private(directory)
        except OSError as error:
            raise self.unwritable(error, "create its directories") from None

    def unwritable(self, error: OSError, doing: str) -> Exception:
        """The error to raise for an ``OSError`` the cache gave while trying to ``doing``."""
        if error.errno in NO_SPACE_ERRORS:
            return disk_full(str(error))
        if error.errno == errno.EROFS:
            return CacheDirectoryError(
                f"The opmagic cache {self.root} is read-only ({error.strerror}), so it cannot "
                f"{doing}: it serves the builds it holds, and nothing else. Set XDG_CACHE_HOME "
                "to a directory you can write to."
            )
        if error.errno in READ_ONLY_ERRORS:
            where = error.filename2 or error.filename or self.root  # a rename: its destination
            return CacheDirectoryError(
                f"The opmagic cache {self.root} is read-only for you at {where} "
                f"({error.strerror}), so it cannot {doing}: it serves the builds it holds, and "
                f"nothing else. Give yourself access again (chmod -R u+rwX {self.root}), or set "
                "XDG_CACHE_HOME to a directory you can write to."
            )
        return error

    def lib_dir(self, key: str) -> Path:
        """Where the published library of a key lives."""
        return self.home / "libs" / key

    def prefix_dir(self, key: str) -> Path:
        """Where a prefix header (and its precompiled form) of a key lives."""
        return self.home / "prefix" / key

    def observer_dir(self, key: str) -> Path:
        """Where the published build of trace's operator observer of a key lives."""
        return self.home / "observer" / key

    @contextlib.contextmanager
    def locked(self, name: str, on_wait: Callable[[str], None] | None = None) -> Iterator[bool]:
        """Hold the lock ``name`` (a cache key); ``on_wait(holder pid)`` is called while
        blocked. Yields whether it had to wait (the holder may have published the key).

        ``flock`` locks belong to the open file: the kernel drops them when the process dies,
        so a killed build never blocks the next one.
        """
        fd, waited = self._open_lock(self.home / "locks" / f"{name}.lock", on_wait)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            yield waited
        finally:
            os.close(fd)  # releases the lock

    def _open_lock(
        self, path: Path, on_wait: Callable[[str], None] | None
    ) -> tuple[int, bool]:
        """An open, ``flock``-ed lock file at ``path`` (never following a symlink there, not
        inherited by child processes), and whether it had to wait for it.

        Whatever else sits at ``path`` (a symlink, a directory) is removed first, never what
        it points to; a lock file replaced while we waited for it is opened again.
        """
        waited = False
        while True:
            flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
            try:
                fd = os.open(path, flags, 0o600)
            except OSError as error:
                if error.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.EOPNOTSUPP):
                    remove_path(path)  # not a lock file: a symlink, a directory, a socket
                    continue
                raise self.unwritable(error, "lock a build") from None
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # a fifo or a device
                os.close(fd)
                remove_path(path)
                continue
            try:
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        waited = True
                        if on_wait is not None:
                            on_wait(_lock_holder(fd))
                        time.sleep(LOCK_POLL_SECONDS)
                if _same_file(fd, path):
                    return fd, waited
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)  # the file was replaced while we waited: lock the one there now

    def scratch_dir(self, key: str) -> Path:
        """A fresh private directory to build ``key`` in (call with the key's lock held).

        Scratch directories of the same key left by killed builds are removed first: nobody
        else can be using them while we hold the key's lock.
        """
        for stale in (self.home / "tmp").glob(f"{key}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        return Path(tempfile.mkdtemp(prefix=f"{key}-", dir=self.home / "tmp"))

    @contextlib.contextmanager
    def publishing(self, key: str, directory: Path) -> Iterator[Path]:
        """A scratch directory to build ``key`` in (call with the key's lock held); when the
        block ends without an error it replaces ``directory`` in one rename, so readers see
        the old build, none, or the whole new one. On an error nothing is published."""
        scratch = self.scratch_dir(key)
        try:
            yield scratch
            remove_path(directory)  # a forced rebuild, a changed input, a damaged build
            os.rename(scratch, directory)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def last_seconds(self, kind: str) -> float | None:
        """How long the last build of ``kind`` took in this cache (measured), if known."""
        try:
            seconds = json.loads((self.home / SECONDS_FILE).read_text()).get(kind)
        except (OSError, ValueError, AttributeError):  # none yet, unreadable or damaged
            return None
        return float(seconds) if isinstance(seconds, (int, float)) and seconds > 0 else None

    def record_seconds(self, kind: str, seconds: float) -> None:
        """Remember that a build of ``kind`` took ``seconds`` here (for the next estimate)."""
        path = self.home / SECONDS_FILE
        with self.locked("seconds"):
            try:
                known = json.loads(path.read_text())
            except (OSError, ValueError):
                known = {}
            if not isinstance(known, dict):
                known = {}
            write_atomic(path, json.dumps({**known, kind: round(seconds, 1)}))


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the regular file open as ``fd``."""
    try:
        named = os.lstat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return stat.S_ISREG(named.st_mode) and (named.st_dev, named.st_ino) == (
        opened.st_dev,
        opened.st_ino,
    )


def remove_path(path: Path) -> None:
    """Remove whatever ``path`` is (a symlink itself, never its target); gone already is fine.
    A directory of ours that we cannot list or write to (mode 000) is made ours again first."""
    with contextlib.suppress(FileNotFoundError):
        try:
            _remove(path)
        except PermissionError:
            _restore_access(path)
            _remove(path)


def _remove(path: Path) -> None:
    """Remove ``path``: a directory with what it holds, anything else by its name."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def _restore_access(directory: Path) -> None:
    """Make ``directory`` and every directory below it ``rwx`` for us (never following a
    symlink: each is changed through a descriptor of the directory itself)."""
    pending = [directory]
    while pending:
        current = pending.pop()
        try:
            fd = os.open(current, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if not stat.S_ISDIR(os.fstat(fd).st_mode):
                continue
            os.chmod(f"/proc/self/fd/{fd}", 0o700)  # the inode open as fd, not a path
        except OSError:
            continue
        finally:
            os.close(fd)
        with contextlib.suppress(OSError), os.scandir(current) as entries:
            pending += [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False)]


def _lock_holder(fd: int) -> str:
    """The pid the holder of a lock wrote into the lock file."""
    try:
        return os.pread(fd, 32, 0).decode().strip() or "?"
    except OSError:
        return "?"


def _make_private_dir(path: Path) -> None:
    """Create ``path`` (and missing parents) with mode 0700 unless it exists."""
    if not os.path.lexists(path):
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.mkdir(mode=0o700, exist_ok=True)


def private_problem(path: Path) -> str | None:
    """Why ``path`` is not a real directory owned by this user that others cannot write, or
    None when it is. A directory of ours that others can only read is made private (0700)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return "it does not exist"
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        return "it is not a plain directory (a symlink or a file)"
    if info.st_uid != os.getuid():
        return (
            f"it belongs to uid {info.st_uid}, not to you (uid {os.getuid()}): libraries from "
            "it could run someone else's code"
        )
    if info.st_mode & 0o022:
        return (
            f"it is writable by other users (mode {stat.S_IMODE(info.st_mode):o}): they could "
            "replace the libraries it loads"
        )
    if info.st_mode & 0o077:
        with contextlib.suppress(OSError):  # a read-only cache: readable by others is safe
            os.chmod(path, 0o700)  # only readable by others: nobody else could have written it
    return None


def check_private(path: Path) -> None:
    """Raise unless ``path`` is a real directory owned by this user that others cannot write
    (see :func:`private_problem`)."""
    problem = private_problem(path)
    if problem is None:
        return
    if "writable by other users" in problem:
        fix = f"Check its contents, then run: chmod 700 {path}"
    elif "not a plain directory" in problem:
        fix = "Remove it, or set XDG_CACHE_HOME to a directory of your own."
    else:
        fix = "Set XDG_CACHE_HOME to a directory of your own."
    raise CacheDirectoryError(f"The opmagic cache {path} is unsafe: {problem}. {fix}")


def read_record(directory: Path, name: str) -> tuple[dict[str, Any] | None, str]:
    """The JSON object a build recorded in ``directory/name``, or ``(None, why not)``: the
    reason is "" when there is no record, else what makes it untrustworthy (the directory is
    not private to the user, the record is unreadable or not a JSON object)."""
    try:
        text = (directory / name).read_text()
    except FileNotFoundError:
        return None, ""
    except (OSError, UnicodeDecodeError) as error:
        return None, f"its record {name} cannot be read ({getattr(error, 'strerror', error)})"
    problem = private_problem(directory)
    if problem is not None:
        return None, f"its directory {directory} is not private: {problem}"
    try:
        record = json.loads(text)
    except ValueError:
        record = None
    if not isinstance(record, dict):
        return None, f"its record {name} is damaged"
    return record, ""


def read_json_file(path: Path, kind: type[T]) -> T | None:
    """The JSON value of the file at ``path`` when it is a ``kind`` (``dict``, ``list``), else
    None: missing, unreadable, not JSON or another shape (callers treat it as missing)."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, kind) else None


def file_digest(path: Path) -> str:
    """The SHA-256 of a file's content, hex."""
    sha256 = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            sha256.update(chunk)
    return sha256.hexdigest()


def artifact_record(path: Path) -> dict[str, Any]:
    """What :func:`artifact_problem` checks a published file against: its size and SHA-256,
    and its stat fingerprint (a file whose fingerprint is unchanged need not be hashed)."""
    info = os.stat(path)
    return {"size": info.st_size, "sha256": file_digest(path), "stat": fingerprint(path)}


def artifact_problem(path: Path, record: Any, *, rehash: bool) -> str | None:
    """Why the file at ``path`` is not the artefact ``record`` (:func:`artifact_record`)
    describes, or None; a record without a size and a SHA-256 describes nothing.

    The size is always checked, the SHA-256 when ``rehash`` or when the file's stat
    fingerprint (inode, mtime, ctime) changed: any write or replacement changes the ctime.
    """
    if not (
        isinstance(record, dict)
        and isinstance(record.get("size"), int)
        and isinstance(record.get("sha256"), str)
    ):
        return f"the record of {path.name}'s size and SHA-256 is damaged"
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return f"{path.name} is missing"
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
        return f"{path.name} is not a regular file of yours"
    if info.st_size != record["size"]:
        return f"{path.name} is {info.st_size} bytes, {record['size']} when it was built"
    if not rehash and record.get("stat") == stat_fingerprint(info):
        return None
    try:
        sha256 = file_digest(path)
    except OSError as error:  # mode 000, say
        return f"{path.name} cannot be read ({error.strerror})"
    if sha256 != record["sha256"]:
        return f"{path.name} is not the file that was built (its SHA-256 differs)"
    return None


_OPENED_NAMES: set[str] = set()  # every name a library was opened under in this process


@contextlib.contextmanager
def private_copy(path: Path, sha256: str | None = None) -> Iterator[str]:
    """A name to load the file at ``path`` from, inside the block: a private in-memory copy
    (``memfd``) of it, checked against ``sha256`` when given, so what is loaded is what was
    checked, under a name no library was opened under in this process (the dynamic loader
    matches libraries by that name: a rebuilt file at the same path would be taken for the
    one loaded before). The copy is closed after the block; what was mapped stays."""
    with open(path, "rb") as built:
        data = built.read()
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise LoadError(
            f"{path} changed after it was checked (its SHA-256 is not the recorded one): "
            "another process is writing to the cache. Run the build again."
        )
    fd = os.memfd_create(f"opmagic-{path.name}"[:200], os.MFD_CLOEXEC)
    try:
        os.write(fd, data)
        yield _fresh_name(fd)
    finally:
        os.close(fd)  # a mapping keeps the memory; the name is never opened again


def opened_names() -> frozenset[str]:
    """Every name a library was opened under in this process so far (a later load's name is
    none of them: a crash handler tells the newest library's frames apart by it)."""
    return frozenset(_OPENED_NAMES)


def _fresh_name(fd: int) -> str:
    """A path to the open file ``fd`` that no library was opened under before.

    ``/proc/self/fd/N``, then, once N was used, the same path with more slashes between its
    parts (the kernel reads ``//`` as ``/``; the dynamic loader compares the strings). The
    number of spellings grows with the cube of the extra slashes, so the path stays short.
    """
    for extra in itertools.count():
        for before_self in range(extra + 1):
            for before_fd in range(extra + 1 - before_self):
                before_number = extra - before_self - before_fd
                name = (
                    f"/proc{'/' * (1 + before_self)}self{'/' * (1 + before_fd)}fd"
                    f"{'/' * (1 + before_number)}{fd}"
                )
                if name not in _OPENED_NAMES:
                    _OPENED_NAMES.add(name)
                    return name
    raise AssertionError("unreachable")


def fingerprint(path: Path) -> list[int]:
    """What changes whenever a file is written or replaced (its content, not its name)."""
    return stat_fingerprint(os.stat(path))


def stat_fingerprint(info: os.stat_result) -> list[int]:
    """:func:`fingerprint` of a stat result: device, inode, mtime and ctime (which nobody but
    root can set back: ``cp -p`` or ``touch -d`` restore the mtime, never the ctime)."""
    return [info.st_dev, info.st_ino, info.st_mtime_ns, info.st_ctime_ns]


_DIGESTS: dict[tuple[int, ...], str] = {}  # (size, *fingerprint) -> SHA-256, this process


def content_digest(path: str | Path, info: os.stat_result) -> str:
    """The SHA-256 of the file at ``path``, whose stat is ``info``: hashed once per process
    per file identity (size and fingerprint; any write changes them)."""
    identity = (info.st_size, *stat_fingerprint(info))
    digest_ = _DIGESTS.get(identity)
    if digest_ is None:
        digest_ = _DIGESTS[identity] = file_digest(Path(path))
    return digest_


def disk_full(detail: str) -> CacheFullError:
    """The error for a build that ran out of disk space (``detail``: what said so)."""
    return CacheFullError(
        f"No space left on device: {detail.strip()}. Free some space: the opmagic cache "
        f"{cache_root()} can be deleted whenever no build runs, and the compiler also writes "
        "temporary files to $TMPDIR (/tmp); or set XDG_CACHE_HOME to a disk with room. "
        "Nothing was disabled: the next build tries again."
    )


def write_atomic(path: Path, data: bytes | str) -> None:
    """Write a file so that readers see the old content or the new one, never a part."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@dataclass(frozen=True)
class BuildProgress:
    """One progress report: the current step of building ``library`` and the time so far.

    ``library`` is what is built as the user knows it (``"libmyops.so"``, ``"the operator
    observer"``). A step that names it reads as a sentence of its own ("waiting for the
    operator observer (12 s so far)"); other steps follow its name ("libmyops.so: linking").
    """

    library: str
    step: str  # "waiting for pid 123", "precompiling headers (...)", "compiling", "linking"
    elapsed: float  # seconds since the build started
    finished: bool = False
    failed: bool = False
    expected: float | None = None  # what the last such build took on this machine, measured

    @property
    def started(self) -> str:
        """The step as it starts, without times (a log's line; the step's end gives its
        duration): ``opmagic: libx.so: linking …``."""
        last = (
            f" (the last build on this machine took {format_duration(round(self.expected))})"
            if self.expected is not None
            else ""
        )
        if self.library in self.step:
            return f"opmagic: {self.step}{last}"
        return f"opmagic: {self.library}: {self.step} …{last}"

    def __str__(self) -> str:
        elapsed = format_duration(self.elapsed, 2)
        if self.failed:
            return f"opmagic: building {self.library} failed after {elapsed}"
        if self.finished:
            return f"opmagic: built {self.library} in {elapsed}"
        last = (
            f"the last build on this machine took {format_duration(round(self.expected))}"
            if self.expected is not None
            else ""
        )
        if self.library in self.step:
            so_far = f"{format_duration(round(self.elapsed))} so far" if self.elapsed >= 1 else ""
            times = "; ".join(part for part in (so_far, last) if part)
            return f"opmagic: {self.step}" + (f" ({times})" if times else "")
        return f"opmagic: {self.library}: {self.step} … {elapsed}" + (
            f" ({last})" if last else ""
        )


ProgressCallback = Callable[[BuildProgress], None]


class StderrProgress:
    """Progress on stderr: one line rewritten in place on a terminal. Elsewhere (a log, a
    pipe, a notebook's stderr) a line when a step starts and one when it ends, with its own
    duration: ``libx.so: compiling …``, ``libx.so: compiling took 63.2 s``."""

    def __init__(self) -> None:
        self._last_step: str | None = None
        self._step_started = 0.0  # the build's elapsed seconds when the last step started

    def __call__(self, event: BuildProgress) -> None:
        """Show ``event`` (called by the build a few times a second)."""
        stream = sys.stderr
        if stream.isatty():
            end = "\n" if event.finished else ""
            stream.write(f"\r\x1b[2K{event}{end}")
        elif event.finished or event.step != self._last_step:
            if self._last_step:  # the step that ended, with its own duration
                took = event.elapsed - self._step_started
                took_text = format_duration(took)
                stream.write(f"opmagic: {event.library}: {self._last_step} took {took_text}\n")
                event = dataclasses.replace(event, expected=None)  # said at the first step
            stream.write(f"{event if event.finished else event.started}\n")
            self._step_started = event.elapsed
        stream.flush()
        self._last_step = None if event.finished else event.step


# The default progress callback of builds: a line on stderr.
stderr_progress: ProgressCallback = StderrProgress()


class Stopwatch:
    """Reports steps of one build to a callback, each tick with the time since the start."""

    def __init__(
        self, library: str, callback: ProgressCallback | None, expected: float | None = None
    ) -> None:
        self.library = library
        self.callback = callback
        self.expected = expected  # what the last such build took here (see BuildProgress)
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
            event = BuildProgress(self.library, self.step, self.elapsed, expected=self.expected)
            self.callback(event)

    def finish(self, failed: bool = False) -> None:
        """Report that the build is done (or failed)."""
        if self.callback is not None:
            self.callback(
                BuildProgress(self.library, self.step, self.elapsed, finished=True, failed=failed)
            )

    @contextlib.contextmanager
    def ticking(self) -> Iterator[None]:
        """Report the current step every :data:`TICK_SECONDS` (from a daemon thread) while the
        block runs: for work that blocks without reporting, e.g. a build tool's run."""
        done = threading.Event()

        def tick() -> None:
            while not done.wait(TICK_SECONDS):
                self.report()

        ticker = threading.Thread(target=tick, name="opmagic build progress", daemon=True)
        ticker.start()
        try:
            yield
        finally:
            done.set()
            ticker.join()


class BackgroundBuild(abc.ABC, Generic[T]):
    """Something this process makes once (builds into the cache, or loads from it): by the
    first caller of :meth:`get`, or ahead of it on a daemon thread (:meth:`start`), which
    callers then wait for, saying so with the time so far and what the last build took.

    A subclass names it (:attr:`library`, as progress shows it) and says how to make it
    (:meth:`make`), whether the cache holds it already (:meth:`published`: nothing to start)
    and how long its last build here took (:meth:`expected_seconds`). A failure of the
    background build is raised to every caller that waited for it and to the first caller
    after it; the caller after that tries again.
    """

    library = ""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # held while a thread makes it
        self.value: T | None = None
        self._failure: BaseException | None = None  # what the background build raised
        self._failure_reported = False  # a caller raised it: the next one tries again

    @abc.abstractmethod
    def make(self, stopwatch: Stopwatch) -> T:
        """Build (or load) it, reporting the steps to ``stopwatch`` (silent in the background)."""

    @abc.abstractmethod
    def published(self) -> bool:
        """Whether the cache holds it already (then :meth:`start` leaves it to :meth:`get`)."""

    @abc.abstractmethod
    def expected_seconds(self) -> float | None:
        """What its last build took on this machine (measured), if known."""

    def start(self) -> threading.Thread | None:
        """Start making it on a daemon thread unless it is made, failed, published or being
        made: returns the thread, or ``None`` when there is nothing to do. Never raises for
        the build: the first :meth:`get` reports a failure."""
        if not self._lock.acquire(blocking=False):
            return None  # another thread makes it now
        try:
            if self.value is not None or self._failure is not None or self._published():
                self._lock.release()
                return None
            thread = threading.Thread(
                target=self._make_holding_lock, name=f"opmagic build: {self.library}", daemon=True
            )
            thread.start()  # from here the thread holds the lock; it releases it when done
        except BaseException:
            self._lock.release()
            raise
        return thread

    def get(self, progress: ProgressCallback | None = stderr_progress) -> T:
        """It: made now (steps reported to ``progress``), or the background build waited for
        (reported as "waiting for ..." with the time so far), or the one made before."""
        value = self.value
        if value is not None:
            return value
        waited = not self._lock.acquire(blocking=False)
        if waited:
            self._wait(progress)
        try:
            if self.value is None:
                failure = self._failure
                if failure is not None and (waited or not self._failure_reported):
                    self._failure_reported = True  # to every caller that waited for the build
                    raise failure.with_traceback(None)
                self._failure = None
                self.value = self.make(Stopwatch(self.library, progress, self._expected()))
            return self.value
        finally:
            self._lock.release()

    def _wait(self, progress: ProgressCallback | None) -> None:
        """Acquire the lock the background build holds, reporting the wait meanwhile."""
        stopwatch = Stopwatch(self.library, progress, self._expected())
        stopwatch.report(f"waiting for {self.library}")
        while not self._lock.acquire(timeout=TICK_SECONDS):
            stopwatch.report()
        stopwatch.finish(failed=self.value is None)

    def _published(self) -> bool:
        """:meth:`published`, false when the cache cannot tell (the build will say why)."""
        try:
            return self.published()
        except (OSError, OpmagicError):
            return False

    def _expected(self) -> float | None:
        """:meth:`expected_seconds`, None when the cache cannot tell (the build will say why)."""
        try:
            return self.expected_seconds()
        except (OSError, OpmagicError):
            return None

    def _make_holding_lock(self) -> None:
        """The background build: keeps the value, or the failure for :meth:`get` to raise."""
        try:
            self.value = self.make(Stopwatch(self.library, None))
        except Exception as exc:  # reported by the caller that needs it, not here
            self._failure = exc
            self._failure_reported = False
        finally:
            self._lock.release()
