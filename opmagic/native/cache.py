"""The per-user build cache: where built libraries and precompiled headers live.

``$XDG_CACHE_HOME/opmagic`` (``~/.cache/opmagic``), mode 0700 and owned by the user: every
directory in it is checked before anything in it is loaded, because loading a library runs
its code, and every artefact is checked against the size and SHA-256 recorded when it was
published (:func:`artifact_record`, :func:`artifact_problem`). Work on one cache key is
serialised by an ``flock`` on a lock file, which the kernel releases when the holder dies (a
SIGKILLed build never leaves a stale lock); results are published atomically (``os.replace``
of a finished file), so no reader ever sees half a library. A read-only cache still serves
the builds it holds.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..errors import CacheDirectoryError, CacheFullError

LAYOUT_VERSION = "v1"  # bump when the layout or the meaning of a key changes
LOCK_POLL_SECONDS = 0.1
SUBDIRECTORIES = ("libs", "prefix", "locks", "tmp")
READ_ONLY_ERRORS = (errno.EROFS, errno.EACCES, errno.EPERM)
NO_SPACE_ERRORS = (errno.ENOSPC, errno.EDQUOT)
NO_SPACE = re.compile(r"No space left on device|Disk quota exceeded")


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/opmagic`` (default ``~/.cache/opmagic``); not created here."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "opmagic"


def digest(parts: Any) -> str:
    """A short stable hash of JSON-able parts (the cache key of whatever they describe)."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class BuildCache:
    """The cache directory of this user, checked to be private to them."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = (root or cache_root()).absolute()
        self.home = self.root / LAYOUT_VERSION
        try:
            _make_private_dir(self.root)
            check_private(self.root)
            _make_private_dir(self.home)
            check_private(self.home)
            for sub in SUBDIRECTORIES:
                _make_private_dir(self.home / sub)
                check_private(self.home / sub)
        except OSError as error:
            raise self.unwritable(error, "create its directories") from None

    def unwritable(self, error: OSError, doing: str) -> Exception:
        """The error to raise for an ``OSError`` the cache gave while trying to ``doing``."""
        if error.errno in NO_SPACE_ERRORS:
            return disk_full(str(error))
        if error.errno in READ_ONLY_ERRORS:
            return CacheDirectoryError(
                f"The opmagic cache {self.root} is read-only ({error.strerror}), so it cannot "
                f"{doing}: it serves the builds it holds, and nothing else. Set XDG_CACHE_HOME "
                "to a directory you can write to."
            )
        return error

    def lib_dir(self, key: str) -> Path:
        """Where the published library of a key lives."""
        return self.home / "libs" / key

    def prefix_dir(self, key: str) -> Path:
        """Where a prefix header (and its precompiled form) of a key lives."""
        return self.home / "prefix" / key

    @contextlib.contextmanager
    def locked(self, name: str, on_wait: Callable[[str], None] | None = None) -> Iterator[None]:
        """Hold the lock ``name`` (a cache key); ``on_wait(holder)`` is called while blocked.

        ``flock`` locks belong to the open file: the kernel drops them when the process dies,
        so a killed build never blocks the next one.
        """
        fd = self._open_lock(self.home / "locks" / f"{name}.lock", on_wait)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _open_lock(self, path: Path, on_wait: Callable[[str], None] | None) -> int:
        """An open, ``flock``-ed lock file at ``path``, never following a symlink there.

        Whatever else sits at ``path`` (a symlink, a directory) is removed first, never what
        it points to; a lock file replaced while we waited for it is opened again.
        """
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
                        if on_wait is not None:
                            on_wait(_lock_holder(fd))
                        time.sleep(LOCK_POLL_SECONDS)
                if _same_file(fd, path):
                    return fd
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
    """Remove whatever ``path`` is (a symlink itself, never its target); gone already is fine."""
    with contextlib.suppress(FileNotFoundError):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


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


def artifact_problem(path: Path, record: dict[str, Any], *, rehash: bool) -> str | None:
    """Why the file at ``path`` is not the artefact ``record`` describes, or None.

    The size is always checked, the SHA-256 when ``rehash`` or when the file's stat
    fingerprint (inode, mtime, ctime) changed: any write or replacement changes the ctime.
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return f"{path.name} is missing"
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
        return f"{path.name} is not a regular file of yours"
    if info.st_size != record.get("size"):
        return f"{path.name} is {info.st_size} bytes, {record.get('size')} when it was built"
    if not rehash and record.get("stat") == _fingerprint(info):
        return None
    if file_digest(path) != record.get("sha256"):
        return f"{path.name} is not the file that was built (its SHA-256 differs)"
    return None


def fingerprint(path: Path) -> list[int]:
    """What changes whenever a file is written or replaced (its content, not its name)."""
    return _fingerprint(os.stat(path))


def _fingerprint(info: os.stat_result) -> list[int]:
    """:func:`fingerprint` of a stat result."""
    return [info.st_dev, info.st_ino, info.st_mtime_ns, info.st_ctime_ns]


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
