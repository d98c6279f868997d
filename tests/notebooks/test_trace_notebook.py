"""``notebooks/trace.ipynb`` runs top to bottom in a real Jupyter kernel and shows its traces."""

from __future__ import annotations

import nbformat
import pytest


@pytest.fixture(scope="module")
def outputs(run_notebook) -> dict[str, list]:
    """Each code cell's outputs, by the cell's source."""
    notebook: nbformat.NotebookNode = run_notebook("trace")
    return {cell.source: cell.outputs for cell in notebook.cells if cell.cell_type == "code"}


def _data(outputs: dict[str, list], start: str, mime: str) -> str:
    cell = next(source for source in outputs if source.startswith(start))
    return "".join(o.get("data", {}).get(mime, "") + o.get("text", "") for o in outputs[cell])


def test_the_layer_forward_shows_as_a_tree_folded_by_module(outputs) -> None:
    html = _data(outputs, "torch.manual_seed(0)", "text/html")
    assert '<details class="call">' in html and "aten::linear" in html
    assert "AutogradCPU" in html and "self_attn (MultiheadAttention)" in html
    assert "decomposed" not in html  # linear, layer_norm: no backend kernel, by design
    frame = _data(outputs, "assert torch.equal", "text/html")
    assert "aten::linear" in frame and "self_attn" in frame
    text = _data(outputs, "linear = next", "text/plain")
    assert text.startswith("aten::linear") and "├─ aten::t" in text


def test_the_training_steps_backward_is_grouped_under_its_nodes(outputs) -> None:
    html = _data(outputs, "def step():", "text/html")
    assert '<details class="section" open="open"><summary>forward: ' in html
    assert '<details class="section" open="open"><summary>backward: ' in html
    assert "AddmmBackward0" in html and "backward of aten::addmm" in html
    linked = _data(outputs, "node = next", "text/plain")
    assert linked.startswith("AddmmBackward0 <- aten::addmm in ")
    assert "| called from cell [" in linked and "aten::mm" in linked
    by_module = _data(outputs, "frame = t_step.frame()", "text/plain")
    assert "backward" in by_module and "forward" in by_module and "linear1" in by_module


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


def test_an_edit_is_found_by_comparing_traces_and_compiled_code_shows_its_graph(outputs) -> None:
    compared = _data(outputs, "v = torch.randn(4, 8)", "text/plain")
    compared = " ".join(compared.split())
    assert "the first divergence is call" in compared and "mylib::clip" in compared
    compiled = _data(outputs, "compiled_block = torch.compile", "text/plain")
    assert "block (graph 0/0)" in compiled
    assert "mylib::clip: called: its real CPU kernel ran" in compiled
    assert "mylib::scaled_gelu: not called at run time" in compiled
