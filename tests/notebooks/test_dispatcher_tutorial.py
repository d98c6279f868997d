"""notebooks/dispatcher_tutorial.ipynb runs top to bottom in a fresh kernel."""

from __future__ import annotations

from typing import TYPE_CHECKING

import re

import pytest

from .outputs import cell_text

if TYPE_CHECKING:
    import nbformat

pytestmark = pytest.mark.slow  # runs a notebook in a kernel


@pytest.fixture(scope="module")
def executed(run_notebook) -> list[nbformat.NotebookNode]:
    """The notebook's code cells after a run in a fresh kernel."""
    return [c for c in run_notebook("dispatcher_tutorial").cells if c.cell_type == "code"]


def test_the_dispatch_path_changes_with_each_step(executed):
    by_start = {cell.source.splitlines()[0]: cell_text(cell) for cell in executed}
    assert "path: AutogradCPU -> CPU" in by_start["x, y = torch.randn(3), torch.randn(3)"]
    autograd = by_start["a = torch.randn(3, requires_grad=True)"]
    assert "('AutogradCPU', 'CPU')" in autograd and "tensor([1., 0., 0.])" in autograd
    contexts = by_start["with torch.no_grad():"]
    assert "no_grad:        ('AutogradCPU', 'CPU')" in contexts
    assert "inference_mode: ('CPU',)" in contexts
    autocast = by_start["xb, yb = x.bfloat16(), y.bfloat16()"]
    assert "('AutocastCPU', 'AutogradCPU', 'CPU')" in autocast and "torch.float32" in autocast


def test_each_library_cell_shows_what_it_registered_at_cell_lines(executed):
    libraries = [cell_text(c) for c in executed if c.source.startswith("%%torch_library")]
    assert "myops::myadd(Tensor self, Tensor other) -> Tensor  cell [2], line 7" in libraries[0]
    assert "Autograd [alias]" in libraries[1] and "AutocastCPU" in libraries[2]
    registrations = cell_text(executed[-1]).split("registrations as made", 1)[1]
    for key, site in [
        ("CPU", "cell [2], line 27"),
        ("CUDA", "cell [2], line 36"),
        ("Autograd [alias]", "cell [4], line 33"),
        ("AutocastCUDA", "cell [7], line 20"),
        ("AutocastCPU", "cell [7], line 30"),
    ]:
        assert re.search(rf"^\s+{re.escape(key)}\s+{re.escape(site)}$", registrations, re.M)
