"""The dispatcher tutorial's code, taken from the notebook's cells, compiled unchanged.

The builds land in the run's cache, so the notebook test that executes the same cells in a
kernel reuses them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
import torch

import opmagic
from opmagic import LoadedLibrary, compile_library

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "dispatcher_tutorial.ipynb"


def tutorial_cells() -> list[str]:
    """The C++ sources of the notebook's %%torch_library cells, in order."""
    cells = nbformat.read(NOTEBOOK, as_version=4).cells
    return [
        cell.source.split("\n", 1)[1]
        for cell in cells
        if cell.cell_type == "code" and cell.source.startswith("%%torch_library")
    ]


@pytest.fixture(scope="module")
def tutorial(build_cache) -> Iterator[list[LoadedLibrary]]:
    """The three tutorial libraries: myadd with CPU/CUDA kernels, autograd, autocast."""
    libraries = [compile_library(source, progress=None) for source in tutorial_cells()]
    yield libraries
    for library in reversed(libraries):
        library.close()


def test_each_cell_adds_its_kernels(tutorial):
    definition, autograd, autocast = tutorial
    assert [op.schema for op in definition.operators] == [
        "myops::myadd(Tensor self, Tensor other) -> Tensor"
    ]
    assert [k.key for k in definition.kernels] == ["CPU", "CUDA"]
    assert [(k.key, k.is_alias) for k in autograd.kernels] == [("Autograd", True)]
    assert [k.key for k in autocast.kernels] == ["AutocastCUDA", "AutocastCPU"]
    # torch/extension.h, narrowed where a cell uses no autograd function (narrowing.py)
    assert [lib.build.header_set for lib in tutorial] == ["types", "extension", "types"]


def test_the_cpu_kernel_adds(tutorial):
    with torch.inference_mode():  # no autograd keys: straight to the CPU kernel
        x, y = torch.randn(4), torch.randn(4)
        assert opmagic.resolve("myops::myadd", x, y).path == ("CPU",)
        assert torch.equal(torch.ops.myops.myadd(x, y), x + y)


def test_the_autograd_kernel_redispatches_below_autograd_and_backpropagates(tutorial):
    a, b = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    assert opmagic.resolve("myops::myadd", a, b).path == ("AutogradCPU", "CPU")
    out = torch.ops.myops.myadd(a, b)  # as written, the tutorial's kernel returns result[0]
    assert out.item() == pytest.approx((a[0] + b[0]).item())
    out.backward()
    assert a.grad.tolist() == [1.0, 0.0, 0.0] and b.grad.tolist() == [1.0, 0.0, 0.0]


def test_the_autocast_wrapper_casts_then_calls_the_op_below_autocast(tutorial):
    xb, yb = torch.randn(3).bfloat16(), torch.randn(3).bfloat16()
    with torch.autocast("cpu"):
        assert opmagic.resolve("myops::myadd", xb, yb).path == ("AutocastCPU", "AutogradCPU", "CPU")
        assert torch.ops.myops.myadd(xb, yb).dtype == torch.float32
    with pytest.raises(RuntimeError, match="expected scalar type Float but found BFloat16"):
        torch.ops.myops.myadd(xb, yb)
    table = opmagic.dispatch_table("myops::myadd")
    assert table["AutocastCUDA"].kind == "kernel"  # the tutorial's wrapper, for CUDA autocast
