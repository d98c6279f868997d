"""Memory held per re-run: the process's RSS while one cell of each magic is re-run many times.

For each magic, an unchanged cell is run twice (built, then what a re-run maps is mapped),
then re-run ``RERUNS`` times in one IPython shell; after each re-run the resident set
(``VmRSS``) and the open descriptors are read. The baseline is the same cell's own first 10
re-runs: growth per re-run = (mean RSS of the last 10 - mean of the first 10) / the re-runs
between them. Cells:

- ``%%custom_op``: a Python op with a fake impl and an autograd formula;
- ``%%torch_library``: a C++ library (an unchanged cell is a cache hit: load and register);
- ``%%cuda_kernel`` quick path (NVRTC, ``--op``): compiles and registers without a GPU;
- ``%%cuda_kernel`` full path (nvcc + g++, host code on the CPU API): cache hit per re-run,
  loads and registers without a GPU (CUDA kernels only launch on one).

A plain ``torch.library.custom_op`` cell re-run in IPython without opmagic is printed too,
as what torch itself holds per re-definition. A C++ cell's re-run maps a fresh copy of its
library and never unmaps the old one (tensors or autograd graphs may point into it: see
opmagic/native/loader.py), so its named baseline is the library's file size. Run from the
repository root:
``python benchmarks/reruns.py [RERUNS]`` (opmagic installed, or ``PYTHONPATH=.``); the C++
cells use the per-user build cache (the first run builds them once). Exits 1 when a cell
holds more than its library's size (none for Python cells) plus ``SLACK_KIB`` per re-run.
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import textwrap

from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

RERUNS = int(sys.argv[1]) if len(sys.argv) > 1 else 100
WINDOW = 10
SLACK_KIB = 16.0  # allowed per re-run beyond the library copy a C++ cell maps by design

CUSTOM_OP = textwrap.dedent(
    """\
    %%custom_op rr_bench::scale
    def scale(x: Tensor) -> Tensor:
        return x * 2

    @fake
    def _(x):
        return torch.empty_like(x)

    @backward
    def _(ctx, grad):
        return grad * 2
    """
)
PLAIN_CUSTOM_OP = textwrap.dedent(
    """\
    @torch.library.custom_op("rr_plain::scale", mutates_args=())
    def scale(x: Tensor) -> Tensor:
        return x * 2

    @scale.register_fake
    def _(x):
        return torch.empty_like(x)

    scale.register_autograd(lambda ctx, grad: grad * 2)
    """
)
TORCH_LIBRARY = textwrap.dedent(
    """\
    %%torch_library
    #include <torch/library.h>
    #include <ATen/core/Tensor.h>

    at::Tensor scale(const at::Tensor& x) { return x.mul(2); }

    TORCH_LIBRARY(rr_bench_lib, m) { m.def("scale(Tensor x) -> Tensor"); }
    TORCH_LIBRARY_IMPL(rr_bench_lib, CPU, m) { m.impl("scale", scale); }
    """
)
KERNEL = (
    'extern "C" __global__ void vadd(const float* a, const float* b, float* out, int n) {\n'
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < n) out[i] = a[i] + b[i];\n"
    "}\n"
)
CUDA_QUICK = (
    '%%cuda_kernel --op rr_bench_quick::vadd --schema "(Tensor a, Tensor b) -> Tensor" '
    '--launch "out = torch.empty_like(a); vadd[cdiv(a.numel(), 256), 256](a, b, out, '
    'a.numel()); return out"\n' + KERNEL
)
CUDA_FULL = "%%cuda_kernel\n" + textwrap.dedent(
    """\
    #include <torch/library.h>
    #include <ATen/core/Tensor.h>
    #include <ATen/ops/empty.h>

    __global__ void vadd_kernel(const float* a, const float* b, float* out, int n) {
      int i = blockIdx.x * blockDim.x + threadIdx.x;
      if (i < n) out[i] = a[i] + b[i];
    }

    at::Tensor vadd_cuda(const at::Tensor& a, const at::Tensor& b) {
      at::Tensor out = at::empty(a.sizes(), a.options());
      int n = a.numel();
      vadd_kernel<<<(n + 255) / 256, 256>>>(a.data_ptr<float>(), b.data_ptr<float>(),
                                           out.data_ptr<float>(), n);
      return out;
    }

    TORCH_LIBRARY(rr_bench_full, m) { m.def("vadd(Tensor a, Tensor b) -> Tensor"); }
    TORCH_LIBRARY_IMPL(rr_bench_full, CUDA, m) { m.impl("vadd", &vadd_cuda); }
    """
)


def _rss_kib() -> int:
    """This process's resident set size, in KiB."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def _descriptors() -> int:
    """How many file descriptors this process has open."""
    return len(os.listdir("/proc/self/fd"))


def _measure(shell: InteractiveShell, label: str, cell: str) -> tuple[float, float] | None:
    """Re-run ``cell``; print its RSS against its first re-runs; the growth per re-run and
    the size of the library a re-run maps (0 for a Python cell), in KiB."""
    samples = []
    for run in range(RERUNS + 2):
        # displayed (that is part of a re-run), not printed here; not kept in Out (IPython's
        # output cache would hold every result: its memory, not the magic's)
        with capture_output():
            result = shell.run_cell(cell, store_history=False, cell_id=label)
        if not result.success:
            error = result.error_before_exec or result.error_in_exec
            print(f"{label:<40} cannot run here: {type(error).__name__}: {error}"[:400])
            return None
        if run == 1:
            fds_before = _descriptors()
        if run >= 2:
            gc.collect()
            samples.append(_rss_kib())
    first = statistics.mean(samples[:WINDOW])
    last = statistics.mean(samples[-WINDOW:])
    growth = (last - first) / (len(samples) - WINDOW)
    library = getattr(result.result, "path", None)
    library_kib = library.stat().st_size / 1024 if library is not None else 0.0
    print(
        f"{label:<40} first {WINDOW}: {first / 1024:7.1f} MiB   last {WINDOW}: "
        f"{last / 1024:7.1f} MiB   per re-run: {growth:+6.1f} KiB   library: "
        f"{library_kib:5.1f} KiB   descriptors: {_descriptors() - fds_before:+d}"
    )
    return growth, library_kib


def main() -> int:
    """Measure every magic in one shell, print the table, and check the target."""
    shell = InteractiveShell.instance()
    shell.run_cell("import torch\nfrom torch import Tensor")
    print(f"RSS over {RERUNS} re-runs of an unchanged cell (baseline: its first {WINDOW} re-runs)")
    plain = _measure(shell, "torch.library.custom_op (no opmagic)", PLAIN_CUSTOM_OP)
    shell.run_line_magic("load_ext", "opmagic")
    growths = {
        "%%custom_op": _measure(shell, "%%custom_op", CUSTOM_OP),
        "%%torch_library": _measure(shell, "%%torch_library (cache hit)", TORCH_LIBRARY),
        "%%cuda_kernel quick": _measure(shell, "%%cuda_kernel quick (NVRTC, no GPU)", CUDA_QUICK),
        "%%cuda_kernel full": _measure(shell, "%%cuda_kernel full (cache hit, no GPU)", CUDA_FULL),
    }
    shell.run_line_magic("unload_ext", "opmagic")
    if plain is not None:
        print(
            f"baseline: torch.library.custom_op itself holds {plain[0]:+.1f} KiB per re-definition"
        )
    missed = [
        name
        for name, measured in growths.items()
        if measured is not None and measured[0] > measured[1] + SLACK_KIB
    ]
    print(
        f"target: per re-run <= the library a re-run maps + {SLACK_KIB:.0f} KiB; "
        f"missed: {', '.join(missed) or 'none'}"
    )
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
