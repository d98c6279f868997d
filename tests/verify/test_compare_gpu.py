"""``compare`` on a GPU: a CUDA kernel checked against torch and timed with CUDA synchronised.
Skipped without a GPU; on one: ``python -m pytest -q -m gpu``."""

from __future__ import annotations

import pytest
import torch
from IPython.utils.capture import capture_output
from torch.utils import benchmark

from opmagic import compare
from opmagic.native.cuda.toolkit import gpu_unavailable_reason

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(gpu_unavailable_reason() is not None, reason=str(gpu_unavailable_reason())),
]

SILU = (
    'extern "C" __global__ void silu(const float* x, float* out, int n) {\n'
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < n) out[i] = x[i] / (1.0f + expf(-x[i]));\n"
    "}\n"
)
LINE = (
    '%%cuda_kernel --op gcmp::silu --schema "(Tensor x) -> Tensor" --launch "out = '
    'torch.empty_like(x); silu[cdiv(x.numel(), 256), 256](x, out, x.numel()); return out" '
    '--compare "torch.nn.functional.silu --inputs one --sizes 1024 1048576 --min-run-time 0.05"'
)


def test_a_cuda_kernel_is_compared_on_the_gpu_by_default(cells) -> None:
    cells.run("def one(n, dtype, device):\n    return torch.randn(n, dtype=dtype, device=device)")
    with capture_output() as captured:
        cells.run(f"{LINE}\n{SILU}")
    texts = [o.data.get("text/plain", "") for o in captured.outputs]
    assert any(
        t.startswith("gcmp::silu vs torch.nn.functional.silu (cuda:0): all 2 cases pass")
        for t in texts
    ), texts
    buggy = SILU.replace("expf(-x[i])", "__expf(-x[i]) * 1.001f")
    with capture_output() as captured:
        cells.run(f"{LINE}\n{buggy}")
    texts = [o.data.get("text/plain", "") for o in captured.outputs]
    assert any("FAIL (values)" in t for t in texts), texts


def test_timings_on_the_gpu_are_benchmark_measurements() -> None:
    result = compare(
        torch.sin,
        torch.sin,
        lambda n, d, dev: torch.randn(n, device=dev),
        sizes=[4096],
        min_run_time=0.05,
        progress=False,
    )
    (row,) = result.rows
    assert row.device == "cuda:0" and row.status == "pass"
    assert isinstance(row.timing, benchmark.Measurement)


def test_on_the_gpu_an_output_left_unwritten_fails_though_the_allocator_recycles() -> None:
    """CUDA's caching allocator hands the block the kernel's scratch result just freed to
    the output it allocates next: without NaN-filled new memory, an output never written
    would hold the right values and pass."""

    def forgets_to_copy(x: torch.Tensor) -> torch.Tensor:
        scratch = torch.sin(x)  # the result, computed where it is not returned
        del scratch
        return torch.empty_like(x)  # the same block, back from the cache: never written

    (row,) = compare(
        forgets_to_copy,
        torch.sin,
        lambda n, d, dev: torch.randn(n, device=dev),
        sizes=[1 << 20],
        min_run_time=0.01,
        progress=False,
    ).rows
    assert row.verdict == "FAIL: NaN", row.mismatches
    assert "never wrote" in row.mismatches[0].detail
