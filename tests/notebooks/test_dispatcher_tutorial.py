"""notebooks/dispatcher_tutorial.ipynb runs top to bottom in a fresh kernel."""

from __future__ import annotations

import os
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "dispatcher_tutorial.ipynb"


def _text(cell: nbformat.NotebookNode) -> str:
    """The streams and plain-text outputs of a cell, joined."""
    parts = []
    for output in cell.outputs:
        if output.output_type == "stream":
            parts.append(output.text)
        elif "data" in output:
            parts.append(output.data.get("text/plain", ""))
    return "\n".join(parts)


@pytest.fixture(scope="module")
def executed(build_cache, tmp_path_factory) -> list[nbformat.NotebookNode]:
    """The notebook's code cells after a run in kernel python3 with this checkout importable."""
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", pythonpath)  # XDG_CACHE_HOME is the run's build cache
        NotebookClient(
            notebook,
            kernel_name="python3",
            timeout=600,
            resources={"metadata": {"path": str(tmp_path_factory.mktemp("tutorial"))}},
        ).execute()  # raises CellExecutionError, naming the cell, on any error
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def test_committed_without_outputs():
    for cell in nbformat.read(NOTEBOOK, as_version=4).cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None


@pytest.mark.slow
def test_the_dispatch_path_changes_with_each_step(executed):
    by_start = {cell.source.splitlines()[0]: _text(cell) for cell in executed}
    assert "path: AutogradCPU -> CPU" in by_start["x, y = torch.randn(3), torch.randn(3)"]
    autograd = by_start["a = torch.randn(3, requires_grad=True)"]
    assert "('AutogradCPU', 'CPU')" in autograd and "tensor([1., 0., 0.])" in autograd
    contexts = by_start["with torch.no_grad():"]
    assert "no_grad:        ('AutogradCPU', 'CPU')" in contexts
    assert "inference_mode: ('CPU',)" in contexts
    autocast = by_start["xb, yb = x.bfloat16(), y.bfloat16()"]
    assert "('AutocastCPU', 'AutogradCPU', 'CPU')" in autocast and "torch.float32" in autocast


@pytest.mark.slow
def test_each_library_cell_shows_what_it_registered_at_cell_lines(executed):
    libraries = [_text(c) for c in executed if c.source.startswith("%%torch_library")]
    assert "myops::myadd(Tensor self, Tensor other) -> Tensor  cell [2], line 7" in libraries[0]
    assert "Autograd [alias]" in libraries[1] and "AutocastCPU" in libraries[2]
    registrations = _text(executed[-1]).split("registrations as made", 1)[1]
    for key, site in [
        ("CPU", "cell [2], line 27"),
        ("CUDA", "cell [2], line 36"),
        ("Autograd [alias]", "cell [4], line 33"),
        ("AutocastCUDA", "cell [7], line 20"),
        ("AutocastCPU", "cell [7], line 30"),
    ]:
        assert re.search(rf"^\s+{re.escape(key)}\s+{re.escape(site)}$", registrations, re.M)
