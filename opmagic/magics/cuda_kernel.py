"""``%%cuda_kernel``: CUDA kernels in a cell, by the quick path (NVRTC) or the full path (nvcc).

A cell with ``TORCH_LIBRARY*`` blocks is a ``.cu`` of a CUDA extension: the full path
(:func:`opmagic.compile_cuda_library`), hot-reloaded per cell like ``%%torch_library``. A
cell of ``extern "C" __global__`` kernels is the quick path
(:func:`opmagic.cuda_kernel_from_source`): launchers bound under the kernels' names, and with
``--op``/``--launch`` an operator's CUDA kernel; its registrations belong to the cell.
"""

from __future__ import annotations

import functools
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from ..cells.cuda_kernel import CudaKernelResult, cuda_kernel_from_source
from ..cells.history import CellSource
from ..cells.session import active_session
from ..native.blocks import scan_blocks
from ..native.cuda.library import compile_cuda_library
from .arguments import (
    BUILD_OPTIONS,
    COMPARE_OPTIONS,
    build_keywords,
    given_build_options,
    joined,
    parse_options,
    with_options,
)
from .compare import compare_cell
from .context import magic_context
from .session import running_cell_number
from .torch_library import CELL_BODY_FIRST_LINE, load_library_cell


@magics_class
class CudaKernelMagics(Magics):
    """The ``%%cuda_kernel`` cell magic."""

    @magic_arguments()
    @argument(
        "--arch",
        default=None,
        help="GPU architecture: sm_86 (or 86, 8.6), compute_90 for PTX; the full path takes "
        "several (sm_80,sm_90). Default: the running GPU's; without one sm_80 (quick path), "
        "sm_80,sm_90,compute_90 (full path)",
    )
    @argument(
        "--flags",
        action="append",
        default=[],
        metavar="FLAGS",
        help="extra NVRTC (quick path) or nvcc (full path) flags, split as a shell would "
        '(repeatable): --flags="-DN=4 --use_fast_math"',
    )
    @argument(
        "--op",
        default=None,
        metavar="NS::NAME",
        help="quick path: make the cell's kernels the CUDA kernel of this operator",
    )
    @argument(
        "--launch",
        default=None,
        metavar="SPEC",
        help="quick path, with --op: the Python body of the op's CUDA kernel, e.g. "
        '"out = torch.empty_like(a); vadd[cdiv(a.numel(), 256), 256](a, b, out, a.numel()); '
        "return out\" (in scope: the op's arguments, the kernels, torch, cdiv)",
    )
    @argument(
        "--schema",
        default=None,
        help="quick path, with --op: the schema to define the op with if it does not exist, "
        'e.g. "(Tensor a, Tensor b) -> Tensor"',
    )
    @argument(
        "--whole",
        action="store_true",
        help="full path: compile the cell as one nvcc translation unit, as setup.py does "
        "(slower: nvcc reads torch's headers; for cells the split cannot handle)",
    )
    @with_options(BUILD_OPTIONS)  # -I for both paths; the rest for the full path's host build
    @with_options(COMPARE_OPTIONS)
    @cell_magic
    def cuda_kernel(self, line: str, cell: str) -> Any:
        """Compile the CUDA kernels of this cell and bind or register them.

        Quick path (a cell of extern "C" __global__ kernels): NVRTC compiles the cell in tens
        of milliseconds; each kernel is bound under its name as a launcher, called like
        <<<>>>: vadd[grid, block](a, b, out, n) or vadd[grid, block, shared_mem, stream](...)
        (tensors pass their data pointers; numbers are converted to the parameters' C types;
        the stream defaults to torch's current one). With --op NS::NAME --launch SPEC
        (--schema to define the op) the kernels become the op's CUDA kernel; SPEC is the
        Python body of that kernel, with the op's arguments, the kernels, torch and cdiv in
        scope, for an op (Tensor a, Tensor b, int n) -> Tensor e.g.::

            out = torch.empty_like(a); vadd[cdiv(a.numel(), 256), 256](a, b, out, n); return out

        for the kernel::

            extern "C" __global__ void vadd(const float* a, const float* b, float* out, int n) {
              int i = blockIdx.x * blockDim.x + threadIdx.x;
              if (i < n) out[i] = a[i] + b[i];
            }

        Full path (a cell with TORCH_LIBRARY / TORCH_LIBRARY_IMPL(ns, CUDA, m) blocks, written
        as a .cu of a setup.py CUDAExtension): the kernels are compiled by nvcc, the torch glue
        by g++ with precompiled headers, linked and loaded; re-running replaces it.

        Without a GPU both paths compile (errors point at cell lines) and register; launching
        raises NoGPUError. Re-running a cell replaces what it made.
        """
        magic = "%%cuda_kernel"
        with magic_context(magic):
            args = parse_options(self.cuda_kernel, line)
            if scan_blocks(cell):
                quick = [f"--{o}" for o in ("op", "launch", "schema") if getattr(args, o)]
                self._refuse(quick, "a cell with TORCH_LIBRARY blocks (the nvcc full path)")
                result = self._full_path(args, cell)
            else:
                # -I applies to both paths (CUDA's own headers are found by themselves)
                full = [o for o in given_build_options(args) if o != "--include"]
                full += ["--whole"] * args.whole
                self._refuse(full, 'a cell of extern "C" kernels (the NVRTC quick path)')
                result = self._quick_path(args, line, cell)
        return compare_cell(self.shell, args.compare, result, magic)

    @staticmethod
    def _refuse(given: list[str], what: str) -> None:
        """Options that do not apply to this kind of cell are a usage error."""
        if given:
            raise UsageError(f"{', '.join(given)} do not apply to {what}.")

    def _full_path(self, args: Any, cell: str) -> Any:
        """Build, load and register the cell as a CUDA extension source (hot reload)."""
        build = functools.partial(
            compile_cuda_library,
            cell,
            arch=args.arch,
            whole=args.whole,
            nvcc_flags=joined(args.flags),
            **build_keywords(args),
        )
        options = {"arch": args.arch, "nvcc_flags": joined(args.flags)}
        return load_library_cell(self.shell, cell, build, "cuda_kernel", options)

    def _quick_path(self, args: Any, line: str, cell: str) -> CudaKernelResult:
        """Compile with NVRTC, bind the launchers and register the op's CUDA kernel."""
        shell = self.shell
        source = f"%%cuda_kernel {line}\n{cell}"
        filename = shell.compile.cache(source, running_cell_number(shell), raw_code=source)
        result = cuda_kernel_from_source(
            cell,
            op=args.op,
            launch=args.launch,
            schema=args.schema,
            arch=args.arch,
            nvrtc_flags=joined(args.flags),
            include_dirs=args.include_dirs,
            namespace=shell.user_ns,
            filename=filename,
            label=f"cell [{running_cell_number(shell)}]",
            first_line=CELL_BODY_FIRST_LINE,
        )
        session = active_session()
        if session is not None:  # the previous run's launchers retire when this run succeeds
            session.track(result, result.description)
            session.note_source(CellSource("cuda_kernel", cell, {"path": "nvrtc"}))
        return result
