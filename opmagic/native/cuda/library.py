"""``compile_cuda_library``: a ``.cu`` with kernels and TORCH_LIBRARY blocks, through the
pipeline of :func:`~opmagic.native.compile_library` (cache, locks, diagnostics at source
lines, hot reload, progress).

nvcc spends ~36 s on a ``.cu`` that includes torch's headers and under a second on the
kernels alone, so the source is split (:func:`~opmagic.native.cuda.source.split_source`):

- the **host code** (torch glue, ``TORCH_LIBRARY`` blocks, the kernels declared only, every
  ``<<<...>>>`` launch rewritten to opmagic's checked launch) is compiled by g++ with the
  precompiled torch headers, exactly as ``%%torch_library`` compiles a cell;
- the **device code** (kernels, ``__device__`` functions, shared types, without torch's host
  headers) is compiled by nvcc, plus one accessor per kernel the host code launches
  (``opmagic_kernel_handle_N``, found in the host object's undefined symbols), since nvcc
  gives template kernels internal linkage;
- the linker joins them, defining each ``opmagic_cuda::kernel_handle<K>`` the host object
  needs as its accessor (``--defsym``), against the CUDA runtime torch uses.

A cell that cannot be split (see ``SplitSource.whole_reason``), or ``whole=True``, is
compiled as one nvcc translation unit, as setup.py's CUDAExtension would. Both files keep
the cell's line numbers, so every diagnostic points at the cell.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ...cachedir import BuildCache, ProgressCallback, Stopwatch, stderr_progress
from ...errors import CompileError, LoadError, MissingHeadersError
from ..compiler import StepResult, run_step
from ..diagnostics import parse_diagnostics
from ..flag_rules import refuse_writing_flags
from ..headers import prepare_prefix
from ..library import LoadedLibrary, load_library
from ..options import DEFAULT_OPT_LEVEL, BuildOptions, split_flags
from ..pipeline import (
    BuildInfo,
    BuildRequest,
    compile_env,
    compile_error,
    compile_unit,
    link,
    output_flags,
    publish,
)
from ..toolchain import Toolchain
from .source import SplitSource, rewrite_launches, split_source
from .toolkit import (
    CudaToolkit,
    find_cuda_toolkit,
    nvcc_arch_flags,
    parse_archs,
)

LAUNCH_HEADER = Path(__file__).with_name("cuda_launch.h")
# what torch's cpp_extension gives nvcc: c10::Half and CUDA's __half must not both convert
TORCH_NVCC_FLAGS = (
    "-D__CUDA_NO_HALF_OPERATORS__",
    "-D__CUDA_NO_HALF_CONVERSIONS__",
    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-D__CUDA_NO_HALF2_OPERATORS__",
    "--expt-relaxed-constexpr",
)
_HANDLE_SYMBOL = re.compile(r"\b(_ZN12opmagic_cuda13kernel_handleI\S+)")
_HANDLE_DEMANGLED = re.compile(r"kernel_handle<&\(?(?:void )?(?P<kernel>.+?)(?:\(.*\))?\)?>\(\)$")
_MISSING_HEADER = re.compile(r"([\w./+-]+\.h(?:pp)?): No such file or directory")
_CUDA_LIBRARY_HEADERS = ("cusparse", "cublas", "cusolver", "curand", "cufft", "nccl", "cudnn")
_TORCH_CUDA_LIBRARIES = ("c10_cuda", "torch_cuda")


@dataclass(frozen=True)
class CudaBuild:
    """The CUDA part of a full-path build request: toolkit, architectures, split or whole (a
    :class:`~opmagic.native.pipeline.BuildVariant`)."""

    toolkit: CudaToolkit
    archs: tuple[str, ...]
    whole: bool
    nvcc_flags: tuple[str, ...]
    opt_level: str

    def identity(self) -> dict:
        """What about the CUDA side changes the build (part of its cache key)."""
        return {
            **self.toolkit.identity(),
            "archs": self.archs,
            "whole": self.whole,
            "nvcc_flags": self.nvcc_flags,
            "launch_header": LAUNCH_HEADER.read_text(),
        }

    def build(
        self,
        request: BuildRequest,
        toolchain: Toolchain,
        cache: BuildCache,
        scratch: Path,
        stopwatch: Stopwatch,
    ) -> BuildInfo:
        """Build ``request`` in ``scratch``: split (g++ and nvcc) or whole (nvcc)."""
        source = request.options.source
        (scratch / f"{request.options.name}.cu").write_text(source)  # the registration site
        split = split_source(source)
        reason = "asked for (whole=True)" if self.whole else split.whole_reason
        context = _Context(self, request, toolchain, cache, scratch, stopwatch)
        if reason is None:
            return context.split(split)
        return context.whole(f"compiled as one nvcc translation unit: {reason}")

    def arch_define(self) -> str:
        """The architectures, for the launch helper's "built for ..." messages."""
        return f'-DOPMAGIC_CUDA_ARCHS="{" ".join(self.archs)}"'

    def host_flags(self) -> list[str]:
        """Flags for host code next to CUDA: CUDA's headers, the architectures."""
        flags = [f for d in self.toolkit.include_dirs for f in ("-isystem", d)]
        return [*flags, self.arch_define()]

    def link_flags(self) -> list[str]:
        """The CUDA runtime (the one torch loads, by soname) and torch's CUDA libraries."""
        torch_lib = Path(torch.__file__).parent / "lib"
        flags = [f"-L{self.toolkit.library_dir}", "-lcudart"]
        flags += [
            f"-l{lib}" for lib in _TORCH_CUDA_LIBRARIES if (torch_lib / f"lib{lib}.so").exists()
        ]
        return [*flags, f"-Wl,-rpath,{self.toolkit.library_dir}"]


@dataclass
class _Context:
    """One CUDA build in progress (what every step needs)."""

    cuda: CudaBuild
    request: BuildRequest
    toolchain: Toolchain
    cache: BuildCache
    scratch: Path
    stopwatch: Stopwatch

    def split(self, split: SplitSource) -> BuildInfo:
        """Host code by g++ (precompiled torch headers), device code by nvcc, then link."""
        name = self.request.options.name
        host = compile_unit(
            self.request,
            self.toolchain,
            self.cache,
            self.scratch,
            self.stopwatch,
            source_text=split.host,
            source_name=f"{name}.host.cpp",
            extra_flags=self.cuda.host_flags(),
            extra_includes=[str(LAUNCH_HEADER)],
            step="compiling host code (g++)",
        )
        if host.step.returncode != 0:
            # the kernels are checked all the same: their errors come first, they are cheap
            self.nvcc(split.device, f"{name}.device.cu", "device.o")
            raise self.host_failure(host.step, f"{name}.host.cpp")
        kernels = self.launched_kernels(host.object_name)
        accessors = "".join(
            f'\nextern "C" const void* opmagic_kernel_handle_{index}() '
            f"{{ return reinterpret_cast<const void*>(&{kernel}); }}"
            for index, (_, kernel) in enumerate(kernels)
        )
        device = self.nvcc(split.device + accessors, f"{name}.device.cu", f"{name}.device.o")
        aliases = [
            f"-Wl,--defsym,{symbol}=opmagic_kernel_handle_{index}"
            for index, (symbol, _) in enumerate(kernels)
        ]
        # __host__ __device__ functions are compiled on both sides: one definition is kept
        linked = self.link_or_fail(
            [host.object_name, f"{name}.device.o"], [*aliases, "-Wl,-z,muldefs"]
        )
        return publish(
            self.request,
            self.toolchain,
            self.cache,
            self.scratch,
            self.stopwatch,
            host,
            [host.step, device, linked],
            f"{name}.cu",
            deps_files=[f"{name}.device.d"],
            leftovers=[f"{name}.device.o"],
            cuda_mode="split",
            archs=self.cuda.archs,
            device_seconds=device.seconds,
        )

    def link_or_fail(self, objects: list[str], extra_flags: Sequence[str] = ()) -> StepResult:
        """Link ``objects`` with the CUDA runtime; a link error names the cell."""
        linked = link(
            self.request,
            self.toolchain,
            self.scratch,
            self.stopwatch,
            objects,
            [*extra_flags, *self.cuda.link_flags()],
        )
        if linked.returncode != 0:
            raise compile_error(
                self.request, self.toolchain, linked, f"{self.request.options.name}.cu"
            )
        return linked

    def whole(self, note: str) -> BuildInfo:
        """The cell as one nvcc translation unit (launches rewritten), then link."""
        options = self.request.options
        name = options.name
        prefix = prepare_prefix(
            options.source,
            self.toolchain,
            self.request.flags,
            options.defines,
            self.cache,
            self.stopwatch,
            precompile=False,
            force=False,
        )
        source = rewrite_launches(options.source)
        compiled = self.nvcc(
            source,
            f"{name}.whole.cu",
            f"{name}.whole.o",
            torch_flags=[
                *(f for d in self.toolchain.system_includes for f in ("-isystem", d)),
                "-DTORCH_API_INCLUDE_EXTENSION_H",
                f"-DTORCH_EXTENSION_NAME={name}",
                "-include",
                str(prefix.header),
            ],
        )
        linked = self.link_or_fail([f"{name}.whole.o"])
        return publish(
            self.request,
            self.toolchain,
            self.cache,
            self.scratch,
            self.stopwatch,
            None,
            [compiled, linked],
            f"{name}.cu",
            deps_files=[f"{name}.whole.d"],
            leftovers=[f"{name}.whole.o"],
            cuda_mode="whole",
            archs=self.cuda.archs,
            device_seconds=compiled.seconds,
            note=note,
        )

    def nvcc(
        self,
        source: str,
        source_name: str,
        object_name: str,
        torch_flags: Sequence[str] = (),
    ) -> StepResult:
        """Compile ``source`` with nvcc; raises :class:`CompileError` at the cell's lines."""
        options, toolchain = self.request.options, self.toolchain
        (self.scratch / source_name).write_text(source)
        stem = source_name.rsplit(".", 1)[0]
        host_options = ["-fPIC", "-fvisibility=hidden", "-fvisibility-inlines-hidden"]
        host_options.append(f"-O{self.cuda.opt_level}")
        command = [
            self.cuda.toolkit.nvcc,
            "-ccbin",
            toolchain.compiler[0],
            "-std=c++20",
            "-Xcompiler",
            ",".join(host_options),
            toolchain.abi_flag,
            *TORCH_NVCC_FLAGS,
            *(f for d in toolchain.torch_includes for f in ("-isystem", d)),
            *torch_flags,
            *(f"-I{d}" for d in options.include_dirs),
            *options.defines,
            self.cuda.arch_define(),
            "-include",
            str(LAUNCH_HEADER),
            *nvcc_arch_flags(self.cuda.archs),
            *self.cuda.nvcc_flags,
            *output_flags(source_name, object_name, f"{stem}.d"),
        ]
        self.stopwatch.report(f"compiling device code (nvcc, {' '.join(self.cuda.archs)})")
        env = compile_env(toolchain, self.cache)
        step = run_step(command, cwd=self.scratch, stopwatch=self.stopwatch, env=env)
        if step.returncode != 0:
            raise compile_error(self.request, toolchain, step, source_name)
        return step

    def launched_kernels(self, object_name: str) -> list[tuple[str, str]]:
        """``(symbol, kernel expression)`` of each kernel handle the host object needs."""
        nm = shutil.which("nm")
        if nm is None:
            raise MissingHeadersError("nm (binutils) is missing: apt-get install binutils.")
        output = subprocess.run(
            [nm, "-u", "--format=posix", object_name],
            cwd=self.scratch,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        symbols = sorted(set(_HANDLE_SYMBOL.findall(output)))
        if not symbols:
            return []
        demangled = subprocess.run(
            ["c++filt"], input="\n".join(symbols), capture_output=True, text=True, check=True
        ).stdout.splitlines()
        kernels = []
        for symbol, name in zip(symbols, demangled, strict=True):
            match = _HANDLE_DEMANGLED.search(name.strip())
            if match is None:
                raise CompileError(f"opmagic cannot read the kernel handle {name!r}.")
            kernels.append((symbol, match["kernel"]))
        return kernels

    def host_failure(self, step: StepResult, source_name: str) -> Exception:
        """The host compile's error; for headers a CPU torch or CUDA install lacks, what to
        install (the kernels compiled: only torch's CUDA API is missing)."""
        diagnostics = parse_diagnostics(step.output, source_name)
        missing = next(
            (
                m[1]
                for d in diagnostics
                if d.is_error
                for m in [_MISSING_HEADER.search(d.message)]
                if m
            ),
            None,
        )
        if missing is not None and (
            (torch.version.cuda is None and missing.startswith(("c10/cuda", "ATen/cuda")))
            or os.path.basename(missing).startswith(_CUDA_LIBRARY_HEADERS)
        ):
            return MissingHeadersError(_missing_cuda_headers(missing, self.cuda.archs))
        return compile_error(self.request, self.toolchain, step, source_name)


def _missing_cuda_headers(header: str, archs: Sequence[str]) -> str:
    """What to install when torch's CUDA headers cannot be compiled here."""
    compiled = f"The kernels compiled (nvcc, {' '.join(archs)}); the host code cannot: "
    if torch.version.cuda is None:
        return (
            f"{compiled}it uses torch's CUDA API (it includes {header} through a torch CUDA "
            f"header), and torch {torch.__version__} is a CPU build without it. Install a CUDA "
            "build of torch (pip install torch --index-url https://download.pytorch.org/whl/"
            "cu130), or launch kernels on the default stream (<<<grid, block>>>) without "
            "torch's CUDA headers."
        )
    return (
        f"{compiled}{header} is missing. torch's CUDA headers include the CUDA math libraries' "
        "headers: pip install nvidia-cublas nvidia-cusparse nvidia-cusolver (CUDA "
        f"{torch.version.cuda}), or install a full CUDA toolkit and point CUDA_HOME at it."
    )


def compile_cuda_library(
    source: str,
    *,
    arch: str | Sequence[str] | None = None,
    whole: bool = False,
    nvcc_flags: Sequence[str] | str = (),
    name: str | None = None,
    extra_cflags: Sequence[str] | str = (),
    extra_ldflags: Sequence[str] | str = (),
    include_dirs: Sequence[str | os.PathLike] = (),
    opt_level: int | str = DEFAULT_OPT_LEVEL,
    precompiled_headers: bool = True,
    force: bool = False,
    verbose: bool = False,
    replace: LoadedLibrary | None = None,
    label: str | None = None,
    first_line: int = 1,
    progress: ProgressCallback | None = stderr_progress,
) -> LoadedLibrary:
    """Compile CUDA C++ (``__global__`` kernels, host functions taking ``at::Tensor``,
    ``TORCH_LIBRARY*`` blocks), load it and register its operators and kernels.

    The source is a ``.cu`` as written for setup.py's CUDAExtension. ``arch``: GPU
    architectures (``"sm_86"``, ``"8.6"``, ``"compute_90"`` for PTX, or several; default: the
    running GPU's, else sm_80, sm_90 and compute_90 PTX). ``whole``: compile the source as one
    nvcc translation unit instead of splitting it (slower; see the module docstring).
    ``nvcc_flags``: extra nvcc flags. The other options are :func:`compile_library`'s
    (``extra_cflags`` go to g++, which compiles the host code).

    Without a GPU the library still builds, loads and registers (the dispatcher shows its
    CUDA kernels); launching raises. On a CPU build of torch, host code using torch's CUDA API
    (``at::cuda::getCurrentCUDAStream``) cannot compile: the kernels are checked, then
    :class:`~opmagic.errors.MissingHeadersError` says so.
    """
    nvcc = split_flags(nvcc_flags, "nvcc_flags")
    refuse_writing_flags(nvcc, "nvcc_flags", nvcc=True)
    toolkit = find_cuda_toolkit()
    archs = parse_archs(arch)
    options = BuildOptions.create(
        source,
        cuda=True,
        name=name,
        extra_cflags=extra_cflags,
        extra_ldflags=extra_ldflags,
        include_dirs=include_dirs,
        opt_level=opt_level,
        precompiled_headers=precompiled_headers,
        force=force,
        verbose=verbose,
        label=label,
        first_line=first_line,
    )
    cuda = CudaBuild(toolkit, archs, bool(whole), nvcc, options.opt_level)
    try:
        return load_library(options, replace=replace, progress=progress, variant=cuda)
    except LoadError as error:
        if torch.version.cuda is None and "::cuda::" in str(error):
            raise LoadError(
                f"{error} torch {torch.__version__} is a CPU build: torch's CUDA libraries "
                "(libc10_cuda, libtorch_cuda) that host code using at::cuda/c10::cuda needs are "
                "not there. Install a CUDA build of torch."
            ) from None
        raise
