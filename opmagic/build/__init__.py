"""Turning C++ source into a loaded library: cache, compiler, precompiled headers, loading.

Usable without IPython: :func:`compile_library` is the whole API; the ``%%torch_library``
magic is a front on it.
"""

from .cache import cache_root
from .diagnostics import Diagnostic
from .headers import HEADER_SETS, HeaderSet
from .library import DEFAULT_OPT_LEVEL, BuildInfo, LoadedLibrary, compile_library
from .loader import Block
from .progress import BuildProgress, StderrProgress, stderr_progress
from .registrations import NewKernel, NewOperator

__all__ = [
    "DEFAULT_OPT_LEVEL",
    "HEADER_SETS",
    "Block",
    "BuildInfo",
    "BuildProgress",
    "Diagnostic",
    "HeaderSet",
    "LoadedLibrary",
    "NewKernel",
    "NewOperator",
    "StderrProgress",
    "cache_root",
    "compile_library",
    "stderr_progress",
]
