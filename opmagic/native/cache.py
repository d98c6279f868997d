"""The per-user build cache: where built libraries and precompiled headers live.

``$XDG_CACHE_HOME/opmagic`` (``~/.cache/opmagic``), mode 0700 and owned by the user: checked
before anything in it is loaded, because loading a library runs its code. Work on one cache
key is serialised by an ``flock`` on a lock file, which the kernel releases when the holder
dies (a SIGKILLed build never leaves a stale lock); results are published atomically
(``os.replace`` of a finished file), so no reader ever sees half a library.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..errors import CacheDirectoryError

LAYOUT_VERSION = "v1"  # bump when the layout or the meaning of a key changes
LOCK_POLL_SECONDS = 0.1


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
        _make_private_dir(self.root)
        check_private(self.root)
        for sub in ("libs", "prefix", "locks", "tmp"):
            (self.home / sub).mkdir(mode=0o700, parents=True, exist_ok=True)

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
        path = self.home / "locks" / f"{name}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if on_wait is not None:
                        on_wait(_lock_holder(fd))
                    time.sleep(LOCK_POLL_SECONDS)
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            yield
        finally:
            os.close(fd)  # releases the lock

    def scratch_dir(self, key: str) -> Path:
        """A fresh private directory to build ``key`` in (call with the key's lock held).

        Scratch directories of the same key left by killed builds are removed first: nobody
        else can be using them while we hold the key's lock.
        """
        for stale in (self.home / "tmp").glob(f"{key}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        return Path(tempfile.mkdtemp(prefix=f"{key}-", dir=self.home / "tmp"))


def _lock_holder(fd: int) -> str:
    """The pid the holder of a lock wrote into the lock file."""
    try:
        return os.pread(fd, 32, 0).decode().strip() or "?"
    except OSError:
        return "?"


def _make_private_dir(path: Path) -> None:
    """Create ``path`` (and missing parents) with mode 0700 unless it exists."""
    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.mkdir(mode=0o700, exist_ok=True)


def check_private(path: Path) -> None:
    """Raise unless ``path`` is a real directory owned by this user that others cannot write.

    A directory of ours that others can only read is made private (0700) on the spot.
    """
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise CacheDirectoryError(
            f"The opmagic cache {path} is not a plain directory (a symlink or a file). "
            "Remove it, or set XDG_CACHE_HOME to a directory of your own."
        )
    if info.st_uid != os.getuid():
        raise CacheDirectoryError(
            f"The opmagic cache {path} belongs to uid {info.st_uid}, not to you "
            f"(uid {os.getuid()}): libraries from it could run someone else's code. Set "
            "XDG_CACHE_HOME to a directory of your own."
        )
    if info.st_mode & 0o022:
        raise CacheDirectoryError(
            f"The opmagic cache {path} is writable by other users (mode "
            f"{stat.S_IMODE(info.st_mode):o}): they could replace the libraries it loads. "
            f"Check its contents, then run: chmod 700 {path}"
        )
    if info.st_mode & 0o077:
        os.chmod(path, 0o700)  # only readable by others: nobody else could have written to it


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
