"""Loading a built library into this process, and driving its registration entry points.

Each load maps a private in-memory copy (``memfd``) of the file with ``RTLD_LOCAL``: two
versions of a library never resolve symbols to each other, a rebuilt file at the same path
is never mistaken for the one already loaded, and the cache may delete files that are in
use. The copy is checked against the SHA-256 the build recorded before it is mapped. The
memfd is closed once mapped; as the dynamic loader matches libraries by the name they were
opened under, each load opens ``/proc/self/fd/N`` under a spelling never used before
(:func:`_fresh_name`). Loaded code is never unmapped: tensors, autograd graphs or other
libraries may still point into it after its registrations are gone.
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import os
import re
import shutil
import subprocess
from pathlib import Path

from ..errors import LoadError
from .blocks import Block

ABI_VERSION = 2  # opmagic_abi_version() of libraries built with this preamble
_UNDEFINED = re.compile(r"undefined symbol: (\S+)")


class NativeLibrary:
    """A built library mapped into this process; it registers nothing until :meth:`init`."""

    def __init__(self, path: Path, sha256: str | None = None) -> None:
        self.path = path
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
            self._lib = ctypes.CDLL(_fresh_name(fd), mode=os.RTLD_LOCAL | os.RTLD_NOW)
        except OSError as error:
            raise LoadError(_load_failure(path, str(error))) from None
        finally:
            os.close(fd)  # the mapping keeps the memory; the name is never opened again
        _MAPPED.append(self)  # the code stays mapped from here on
        try:
            version = self._lib.opmagic_abi_version()
        except AttributeError:
            raise LoadError(
                f"{path} was not built by opmagic (it has no opmagic_abi_version)."
            ) from None
        if version != ABI_VERSION:
            raise LoadError(
                f"{path} was built by another opmagic version (protocol {version}, this one "
                f"speaks {ABI_VERSION}): rebuild it with force=True."
            )
        self._lib.opmagic_block.restype = ctypes.c_char_p
        self._lib.opmagic_block.argtypes = [ctypes.c_int]
        self._lib.opmagic_init.restype = ctypes.c_char_p
        self._lib.opmagic_init.argtypes = [ctypes.c_char_p, ctypes.c_int]
        self.blocks = tuple(self._block(i) for i in range(self._lib.opmagic_block_count()))

    def _block(self, index: int) -> Block:
        """Block ``index`` as the preamble describes it."""
        macro, namespace, key, line = self._lib.opmagic_block(index).decode().split("\t")
        return Block(macro, namespace, key or None, int(line))

    def init(self, site_file: str, count: int = -1) -> tuple[str, int] | None:
        """Register every block, or the first ``count`` (``site_file`` names the registration
        site); the error if any.

        On an error nothing of this library stays registered; returns ``(message, line of
        the failing block)``.
        """
        error = self._lib.opmagic_init(site_file.encode(), count)
        if error is None:
            return None
        return error.decode(errors="replace"), self._lib.opmagic_error_line()

    def fini(self) -> None:
        """Remove every registration :meth:`init` made."""
        self._lib.opmagic_fini()


_MAPPED: list[NativeLibrary] = []  # every library ever loaded: never unmapped
_OPENED_NAMES: set[str] = set()  # every name a library was opened under in this process


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


def _load_failure(path: Path, error: str) -> str:
    """Why a library does not load, with C++ names for undefined symbols."""
    match = _UNDEFINED.search(error)
    if match is None:
        return f"{path.name} cannot be loaded: {error}"
    symbol = _demangle(match[1])
    return (
        f"{path.name} cannot be loaded: undefined symbol {symbol}. A function or variable is "
        "declared but never defined in the source, or it lives in a library that is not linked "
        "(add it with extra_ldflags / --ldflags, e.g. -lmylib)."
    )


def _demangle(symbol: str) -> str:
    """The C++ name of a mangled symbol (c++filt), or the symbol when c++filt is missing."""
    tool = shutil.which("c++filt")
    if tool is None:
        return symbol
    result = subprocess.run([tool, symbol], capture_output=True, text=True, check=False)
    return result.stdout.strip() or symbol
