"""Loading a built library into this process, and driving its registration entry points.

Each load maps a private in-memory copy of the file, checked against the SHA-256 the build
recorded, under a name never opened before (:func:`opmagic.cachedir.private_copy`), with
``RTLD_LOCAL``: two versions of a library never resolve symbols to each other, a rebuilt
file at the same path is never mistaken for the one already loaded, and the cache may
delete files that are in use. Loaded code is never unmapped: tensors, autograd graphs or
other libraries may still point into it after its registrations are gone.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
from pathlib import Path

from ..cachedir import private_copy
from ..errors import LoadError
from .blocks import Block

ABI_VERSION = 2  # opmagic_abi_version() of libraries built with this preamble
_UNDEFINED = re.compile(r"undefined symbol: (\S+)")


class NativeLibrary:
    """A built library mapped into this process; it registers nothing until :meth:`init`."""

    def __init__(self, path: Path, sha256: str | None = None) -> None:
        self.path = path
        with private_copy(path, sha256) as name:
            try:
                self._lib = ctypes.CDLL(name, mode=os.RTLD_LOCAL | os.RTLD_NOW)
            except OSError as error:
                raise LoadError(_load_failure(path, str(error))) from None
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

    def run_exit_handlers(self) -> None:
        """Run what ``exit()`` runs of the library: its static objects' destructors and the
        ``atexit`` handlers it registered (``__cxa_finalize`` of its handle). Only the probe's
        child does, to see that they neither crash nor hang before this process meets them."""
        self._lib.opmagic_dso_handle.restype = ctypes.c_void_p
        finalize = getattr(ctypes.CDLL(None), "__cxa_finalize")
        finalize.argtypes = (ctypes.c_void_p,)
        finalize(self._lib.opmagic_dso_handle())


_MAPPED: list[NativeLibrary] = []  # every library ever loaded: never unmapped


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
