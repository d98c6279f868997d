"""The quick path: ``extern "C" __global__`` kernels compiled by NVRTC in tens of milliseconds.

NVRTC comes from PyPI (``nvidia-cuda-nvrtc``, driven through ``cuda-bindings``): both
are public, versioned, installed with ``pip install "opmagic[cuda]"``, and work without a
GPU, so every CI run compile-checks kernels. (torch's own wrapper,
``torch.cuda._compile_kernel``, is private, needs the libnvrtc that CPU builds of torch
lack, and passes every Python int as ``int`` and every float as ``double`` whatever the
kernel's parameters are.)

Kernels are compiled to CUBIN (machine code) for the running GPU's architecture when NVRTC
knows it, else to PTX of the newest architecture it knows that the GPU can run: PTX from a
newer NVRTC than the driver cannot be JIT-compiled by that driver, CUBIN has no such
problem. Without a GPU they are compiled for ``sm_80`` (the check includes ptxas).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ...cachedir import digest
from ...display import Displayable
from ...errors import BuildOptionError, CompileError, CudaToolkitError
from ..diagnostics import failure_text, parse_diagnostics, renumber_log, where
from ..options import check_source_position, check_source_text, include_paths, split_flags
from .launcher import CudaKernel, check_signature
from .source import KernelSignature, kernel_signatures
from .toolkit import (
    INSTALL_CUDA_HEADERS,
    cuda_include_dirs,
    gpu_unavailable_reason,
    parse_archs,
    running_gpu_arch,
)

INSTALL_NVRTC = (
    'install NVRTC and its Python bindings: pip install "opmagic[cuda]" (cuda-bindings and '
    "nvidia-cuda-nvrtc, with the CUDA major version of your driver)"
)
NO_GPU_ARCH = "sm_80"
_SOURCE_NAME = "kernels.cu"
_BINARIES: dict[str, tuple[bytes, str, str]] = {}  # cache key -> (binary, arch, log)


@dataclass(frozen=True)
class NvrtcBinary:
    """What NVRTC made of a source for one architecture."""

    data: bytes
    arch: str  # "sm_86" (CUBIN) or "compute_86" (PTX)
    log: str  # NVRTC's warnings

    @property
    def kind(self) -> str:
        """``"cubin"`` (machine code) or ``"ptx"`` (JIT-compiled by the driver)."""
        return "cubin" if self.arch.startswith("sm_") else "ptx"


@dataclass(eq=False)
class CudaKernels(Displayable):
    """The kernels of one quick-path source, compiled; a launcher per kernel.

    ``kernels["name"]`` (also ``kernels.name``) launches as ``kernel[grid, block](*args)``
    or ``kernel[grid, block, shared_mem, stream](*args)``.
    """

    source: str
    label: str
    first_line: int
    options: tuple[str, ...]  # NVRTC options, architecture included
    binary: NvrtcBinary
    signatures: tuple[KernelSignature, ...]
    compile_seconds: float
    cached: bool
    fixed_arch: bool  # --arch was given: every GPU gets this binary
    no_gpu: str | None = None  # why no GPU can run them here (when compiled), or None
    kernels: dict[str, CudaKernel] = field(default_factory=dict)
    closed: bool = False

    def __getattr__(self, name: str) -> CudaKernel:
        kernels = self.__dict__.get("kernels", {})
        if name in kernels:
            return kernels[name]
        raise AttributeError(f"{self.label} has no kernel {name!r}; it has {', '.join(kernels)}")

    def __getitem__(self, name: str) -> CudaKernel:
        return self.kernels[name]

    def binary_for(self, arch: str | None) -> NvrtcBinary:
        """The binary for a GPU of architecture ``arch`` (compiled once per architecture)."""
        if self.fixed_arch or arch is None:
            return self.binary
        target = nvrtc_target(arch)
        if target == self.binary.arch:
            return self.binary
        options = tuple(o for o in self.options if not o.startswith("--gpu-architecture="))
        return _compile(self.source, options, target, self.label, self.first_line)[0]

    def where(self, line: int | None) -> str:
        """A source line as the user sees it: ``cell [3], line 6``."""
        return where(self.label, line, self.first_line)

    @property
    def description(self) -> str:
        """One line for listings."""
        return f"CUDA kernels ({self.binary.arch}): {', '.join(self.kernels)}"

    def close(self) -> None:
        """Retire the launchers (a re-run of the cell made new ones); idempotent."""
        self.closed = True
        for kernel in self.kernels.values():
            kernel.closed = True


def compile_cuda_kernels(
    source: str,
    *,
    arch: str | None = None,
    nvrtc_flags: Sequence[str] | str = (),
    include_dirs: Sequence[str | os.PathLike] = (),
    label: str | None = None,
    first_line: int = 1,
) -> CudaKernels:
    """Compile the ``extern "C" __global__`` kernels of ``source`` with NVRTC.

    ``arch``: one architecture (``"sm_86"``, ``"8.6"``, ``"compute_86"`` for PTX); default:
    the running GPU's (PTX when NVRTC does not know it yet), ``sm_80`` without a GPU.
    ``nvrtc_flags``: extra NVRTC options (``-DBLOCK=128``, ``--use_fast_math``, ...).
    ``include_dirs``: searched before CUDA's own headers (``cuda_fp16.h``, found from the
    toolkit or pip's nvidia packages). ``label``/``first_line``: how messages name the source.

    Raises :class:`CompileError` at the source line, :class:`BuildOptionError` for kernels
    the launchers cannot call (not ``extern "C"``, parameters that are neither pointers nor
    arithmetic scalars), :class:`CudaToolkitError` naming what to install.
    """
    check_source_text(source, "CUDA C++ source text")
    if not source.strip():
        raise BuildOptionError('The source is empty: write extern "C" __global__ kernels.')
    check_source_position(label, first_line)
    label = label or _SOURCE_NAME
    signatures = tuple(k for k in kernel_signatures(source) if k.defined)
    if signatures:  # else compiled first: a kernel whose signature does not parse is an error
        _check_kernels(signatures, label, first_line)
    archs = parse_archs(arch) if arch is not None else ()
    if len(archs) > 1:
        raise BuildOptionError(
            f"NVRTC compiles for one architecture at a time; got {', '.join(archs)}."
        )
    target = nvrtc_target(archs[0] if archs else running_gpu_arch() or NO_GPU_ARCH)
    flags = split_flags(nvrtc_flags, "nvrtc_flags")
    directories = include_paths(include_dirs)
    missing = [d for d in directories if not os.path.isdir(d)]
    if missing:
        raise BuildOptionError(f"Include directory not found: {', '.join(missing)}.")
    includes = [os.path.abspath(d) for d in directories] + list(cuda_include_dirs())
    options = (
        "-std=c++17",
        "-default-device",
        *(f"-I{d}" for d in includes),
        *flags,
    )
    started = time.perf_counter()
    binary, cached = _compile(source, options, target, label, first_line)
    if not signatures:  # it compiles, and has no kernel
        _check_kernels(signatures, label, first_line)
    result = CudaKernels(
        source,
        label,
        first_line,
        (*options, f"--gpu-architecture={target}"),
        binary,
        signatures,
        time.perf_counter() - started,
        cached,
        bool(archs),
        gpu_unavailable_reason(),
    )
    result.kernels = {k.name: CudaKernel(k, result) for k in signatures}
    return result


def _check_kernels(signatures: tuple[KernelSignature, ...], label: str, first_line: int) -> None:
    """Every kernel must be ``extern "C"`` with parameters a launcher can pass."""
    if not signatures:
        raise BuildOptionError(
            f'{label} defines no kernel: write extern "C" __global__ void name(...) {{ ... }} '
            "(or a TORCH_LIBRARY_IMPL(ns, CUDA, m) block for the nvcc full path)."
        )
    for kernel in signatures:
        place = where(label, kernel.line, first_line)
        if not kernel.extern_c or kernel.template:
            raise BuildOptionError(
                f'{place}: kernel {kernel.name} is not extern "C": the quick path launches '
                'kernels by their C name. Write extern "C" __global__ void ...; for C++ kernels '
                "(templates, overloads) add a TORCH_LIBRARY_IMPL block to use the nvcc full path."
            )
        problem = check_signature(kernel)
        if problem is not None:
            raise BuildOptionError(f"{place}: {problem}")


def nvrtc_target(arch: str) -> str:
    """The architecture to ask NVRTC for: ``arch`` when it knows it, else PTX it can make.

    ``sm_XY`` becomes ``compute_ZW``, the newest architecture NVRTC knows that is not newer
    than XY, so that a GPU newer than NVRTC still runs the kernels (its driver JIT-compiles
    the PTX).
    """
    number = arch.split("_", 1)[1]
    digits = int("".join(c for c in number if c.isdigit()))
    supported = supported_archs()
    if digits in supported:
        return arch
    older = [n for n in supported if n <= digits]
    if not older:
        known = ", ".join(f"sm_{n}" for n in supported)
        raise BuildOptionError(
            f"NVRTC {'.'.join(map(str, nvrtc_version()))} cannot compile for {arch}; it knows "
            f"{known}. Install the nvidia-cuda-nvrtc of your GPU's CUDA generation."
        )
    return f"compute_{max(older)}"


def _bindings() -> Any:
    """``cuda.bindings.nvrtc``, or :class:`CudaToolkitError` saying what to install."""
    try:
        from cuda.bindings import nvrtc
    except ImportError as error:
        raise CudaToolkitError(f"NVRTC is not installed ({error}): {INSTALL_NVRTC}.") from None
    return nvrtc


def nvrtc_version() -> tuple[int, int]:
    """NVRTC's ``(major, minor)``; raises :class:`CudaToolkitError` when it is missing."""
    nvrtc = _bindings()
    try:
        _, major, minor = nvrtc.nvrtcVersion()
    except RuntimeError as error:  # cuda.pathfinder cannot find libnvrtc
        raise CudaToolkitError(f"libnvrtc cannot be loaded ({error}): {INSTALL_NVRTC}.") from None
    return major, minor


def supported_archs() -> list[int]:
    """The architectures NVRTC compiles for, as numbers (``[75, 80, 86, ...]``)."""
    nvrtc_version()
    _, archs = _bindings().nvrtcGetSupportedArchs()
    return list(archs)


def _compile(
    source: str, options: tuple[str, ...], target: str, label: str, first_line: int
) -> tuple[NvrtcBinary, bool]:
    """``(binary, from the cache)``: NVRTC's CUBIN or PTX of ``source`` for ``target``."""
    options = (*options, f"--gpu-architecture={target}")
    key = digest({"source": source, "options": options, "nvrtc": nvrtc_version()})
    if key in _BINARIES:
        data, arch, log = _BINARIES[key]
        return NvrtcBinary(data, arch, log), True
    nvrtc = _bindings()
    _, program = nvrtc.nvrtcCreateProgram(source.encode(), _SOURCE_NAME.encode(), 0, [], [])
    try:
        encoded = [o.encode() for o in options]
        (result,) = nvrtc.nvrtcCompileProgram(program, len(encoded), encoded)
        _, size = nvrtc.nvrtcGetProgramLogSize(program)
        buffer = b" " * size
        nvrtc.nvrtcGetProgramLog(program, buffer)
        log = buffer.rstrip(b"\0 ").decode(errors="replace")
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise _compile_error(source, log, options, label, first_line, result)
        get_size, get = (
            (nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN)
            if target.startswith("sm_")
            else (nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX)
        )
        _, size = get_size(program)
        data = b" " * size
        get(program, data)
    finally:
        nvrtc.nvrtcDestroyProgram(program)
    _BINARIES[key] = (data, target, log)
    return NvrtcBinary(data, target, log), False


def _compile_error(
    source: str, log: str, options: tuple[str, ...], label: str, first_line: int, result: Any
) -> CompileError:
    """NVRTC's errors at their source lines (a missing CUDA header says what to install)."""
    diagnostics = parse_diagnostics(log, _SOURCE_NAME)
    message = failure_text("NVRTC", diagnostics, source, label, first_line)
    if not diagnostics:
        message = f"NVRTC rejected the options ({result.name}): {log or ' '.join(options)}"
    elif "could not open source file" in log and not cuda_include_dirs():
        message += f"\nCUDA's headers were not found: {INSTALL_CUDA_HEADERS}."
    return CompileError(
        message,
        diagnostics=diagnostics,
        log=renumber_log(log, _SOURCE_NAME, first_line),
        command="nvrtcCompileProgram " + " ".join(options),
        source=source,
        label=label,
        first_line=first_line,
    )
