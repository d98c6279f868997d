"""notebooks/triton.ipynb: a vector add and a row softmax as ``%%triton_op`` in Triton's
interpreter, checked with ``--check``, compared against torch, an out-of-bounds access caught,
and the launches in a trace."""

from __future__ import annotations

import re

import pytest

from .outputs import cell_text

pytestmark = pytest.mark.slow  # runs a notebook in a kernel

pytest.importorskip("triton", reason='needs pip install "opmagic[triton]"')


def test_the_notebook_checks_compares_and_traces_its_triton_ops(run_notebook):
    notebook = run_notebook("triton")
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    by_magic = {cell.source.splitlines()[0]: cell_text(cell) for cell in code if cell.source}
    vector_add = next(text for line, text in by_magic.items() if "nb::vector_add" in line)
    assert "checks (4 passed)" in vector_add and "kernels: Triton's interpreter" in vector_add
    assert re.search(r"add_kernel +launched by vector_add +cell \[\d+\], line 6", vector_add)
    assert "all 2 cases pass" in by_magic["def pair(size, dtype, device):"]
    caught = by_magic["try:"]
    assert re.match(
        r"Triton kernel unmasked_kernel \(cell \[\d+\], line 9\): out-of-bounds load in program "
        r"\(3, 0, 0\): it reads 24 elements past the memory of x_ptr \(float32, 1000 elements\): "
        r"offsets 1000\.\.1023 from x_ptr\.",
        caught,
    )
    softmax = next(text for line, text in by_magic.items() if "nb::softmax" in line)
    assert "checks (4 passed)" in softmax and "all 2 cases pass" in softmax
    assert by_magic['print(opmagic.dispatch_table("nb::softmax")["CPU"].source)'].startswith(
        "triton_op launcher softmax (cell ["
    )
    trace = by_magic["x = torch.randn(37, 781)"]
    assert re.search(r"▸ launch softmax_kernel grid \(8,\) BLOCK_SIZE=1024 \(", trace)
