"""notebooks/cuda_kernel.ipynb: kernels compile, register on the CUDA key, trace; GPU cells skip."""

from __future__ import annotations

import pytest

from opmagic.native.cuda.toolkit import gpu_unavailable_reason

from .outputs import cell_text

pytestmark = pytest.mark.slow  # runs a notebook in a kernel

pytest.importorskip("cuda.bindings.nvrtc", reason='needs pip install "opmagic[cuda]"')


def test_the_notebook_registers_traces_and_skips_gpu_cells_without_a_gpu(run_notebook):
    notebook = run_notebook("cuda_kernel")
    texts = [cell_text(cell) for cell in notebook.cells if cell.cell_type == "code"]
    assert any("vadd[grid, block](a, b, out, n)" in t for t in texts)
    assert any(t.startswith("kernel at cell [") for t in texts)  # the CUDA entry of the table
    assert any("('AutogradCPU',) -> no kernel for CPU" in t for t in texts)
    assert any("NVRTC: compile error at broken.cu, line 2:" in t for t in texts)
    assert any("libnb_ext.so" in t for t in texts)  # the full path built
    if gpu_unavailable_reason() is None:
        assert any("nb::vadd matches torch's a + b" in t for t in texts)
        assert any("nb_ext::muladd matches" in t for t in texts)
    else:
        assert sum("skipped (needs a GPU)" in t for t in texts) == 2
        assert any(t.startswith("NoGPUError: Cannot launch kernel vadd") for t in texts)
