"""``notebooks/trace.ipynb`` runs top to bottom in a real Jupyter kernel and shows its traces."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import nbformat

pytestmark = pytest.mark.slow  # runs a notebook in a kernel


@pytest.fixture(scope="module")
def outputs(run_notebook) -> dict[str, list]:
    """Each code cell's outputs, by the cell's source."""
    notebook: nbformat.NotebookNode = run_notebook("trace")
    return {cell.source: cell.outputs for cell in notebook.cells if cell.cell_type == "code"}


def _data(outputs: dict[str, list], start: str, mime: str) -> str:
    cell = next(source for source in outputs if source.startswith(start))
    return "".join(o.get("data", {}).get(mime, "") + o.get("text", "") for o in outputs[cell])


def test_the_layer_forward_shows_as_a_tree_with_its_surprises(outputs) -> None:
    html = _data(outputs, "torch.manual_seed(0)", "text/html")
    assert '<details class="call">' in html and "aten::linear" in html
    assert "AutogradCPU" in html and "surprises" in html
    assert "aten::linear" in _data(outputs, "assert torch.equal", "text/html")  # the frame
    text = _data(outputs, "linear = next", "text/plain")
    assert text.startswith("aten::linear") and "├─ aten::t" in text


def test_autocast_and_inference_mode_paths(outputs) -> None:
    surprises = _data(outputs, "%%trace --autocast cpu", "text/plain")
    assert "autocast cast" in surprises and "bfloat16" in surprises
    amp = _data(outputs, "linear_amp = next", "text/plain")
    assert amp.startswith("('AutocastCPU', 'AutogradCPU')") and "aten::to.dtype" in amp
    inference = _data(outputs, "with torch.inference_mode()", "text/plain")
    assert "Autograd" not in inference and "'CPU'" in inference


def test_the_custom_op_decomposes_and_its_gaps_are_surprises(outputs) -> None:
    html = _data(outputs, "lib = torch.library.Library", "text/html")
    assert "mylib::scaled_gelu" in html and "aten::gelu" in html
    assert "no fake impl" in html and "mylib::clip" in html
    svg = _data(outputs, "t_custom.diagram()", "image/svg+xml")
    assert "mylib::scaled_gelu decomposes into" in svg
