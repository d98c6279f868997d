"""Turning C++ source into a loaded library: cache, compiler, precompiled headers, loading.

Usable without IPython: :func:`compile_library` (C++), :func:`compile_cuda_library` (CUDA
full path) and :func:`compile_cuda_kernels` (NVRTC quick path) are the API; the
``%%torch_library`` and ``%%cuda_kernel`` magics are fronts on them.
"""

from ..cachedir import BuildProgress, StderrProgress, cache_root, stderr_progress
from .blocks import Block
from .cuda.launcher import CudaKernel, cdiv
from .cuda.library import compile_cuda_library
from .cuda.nvrtc import CudaKernels, compile_cuda_kernels
from .diagnostics import Diagnostic
from .headers import HEADER_SETS, HeaderSet, precompile_headers
from .library import LoadedLibrary, compile_library
from .options import DEFAULT_OPT_LEVEL
from .pipeline import BuildInfo
from .snapshots import NewKernel, NewOperator

__all__ = [
    "DEFAULT_OPT_LEVEL",
    "HEADER_SETS",
    "Block",
    "BuildInfo",
    "BuildProgress",
    "CudaKernel",
    "CudaKernels",
    "Diagnostic",
    "HeaderSet",
    "LoadedLibrary",
    "NewKernel",
    "NewOperator",
    "StderrProgress",
    "cache_root",
    "cdiv",
    "compile_cuda_kernels",
    "compile_cuda_library",
    "compile_library",
    "precompile_headers",
    "stderr_progress",
]
