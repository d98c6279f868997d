"""The views of a trace: width-aware text, the collapsible HTML tree, the DataFrame, the call
graph (read back from both Graphviz renderers' SVG) and the surprises summary."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest
import torch

from opmagic import Surprises, trace
from opmagic.dispatch.trace.result import walk_all
from opmagic.view.diagram import Diagram
from opmagic.view.trace import EMPTY, FRAME_COLUMNS

from .svgfacts import renderers, svg_facts


@pytest.fixture(scope="module")
def linear_trace():
    """A linear layer, an op that decomposes where it has no kernel of its own, then a
    failing matmul, under autocast: decomposition, casts, an error."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 3)
    library = torch.library.Library("opmagic_views_halve", "DEF")
    library.define("halve(Tensor x) -> Tensor")
    library.impl("halve", lambda x: x * 0.5, "CUDA")
    library.impl("halve", lambda x: x * 0.5, "CompositeImplicitAutograd")

    def step(x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.opmagic_views_halve.halve(layer(x).relu())
        return y @ torch.ones(5)  # fails: sizes do not match

    try:
        with torch.autocast("cpu"):
            yield trace(step, torch.randn(2, 4))
    finally:
        library._destroy()


@pytest.fixture(scope="module")
def training_step():
    """A small model's training step: forward in modules, backward in autograd nodes."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    x = torch.randn(3, 4)

    def step() -> torch.Tensor:
        loss = model(x).square().mean()
        loss.backward()
        return loss

    return trace(step, values=True)


@pytest.mark.parametrize("width", [60, 100, 160])
def test_text_fits_the_width_and_draws_the_tree(linear_trace, width: int) -> None:
    text = linear_trace.view("text", width=width)
    lines = text.splitlines()
    assert all(len(line) <= width for line in lines), [x for x in lines if len(x) > width]
    assert text.startswith("trace: ")
    # what the code raised starts its own line, whatever the widths of the timings before it
    assert any(line.startswith("raised RuntimeError: ") for line in lines)
    first = next(line for line in lines if line.startswith("aten::linear"))
    assert "AutocastCPU → Autograd" in first
    assert re.search(r"\d+(\.\d+)? (µs|ms|s)$", first.rstrip())  # its time, right-aligned
    assert any(line.startswith("├─ aten::to.dtype") for line in lines)
    assert any(line.startswith("│  └─ aten::_to_copy") for line in lines)
    assert any("✗ RuntimeError" in line for line in lines)  # the failing call says why
    assert "surprises:" in lines and any("autocast cast" in line for line in lines)


def test_str_is_the_text_view(linear_trace) -> None:
    assert "\naten::linear " in str(linear_trace)
    call = linear_trace.calls[0]
    assert str(call).splitlines()[0].startswith("aten::linear")


def test_html_is_a_collapsible_tree_with_paths_kernels_and_times(linear_trace) -> None:
    html = linear_trace._repr_html_()
    body = html[html.index('<div class="opmagic">') :]
    ET.fromstring(body)  # well-formed: every element closed
    assert body.count('<details class="call">') == sum(1 for c in linear_trace.walk() if c.children)
    assert "aten::linear" in body and "AutocastCPU → AutogradCPU" in body
    assert "[via CompositeImplicitAutograd]" in body and re.search(r"\d+ µs", body)
    assert "surprises" in body and "autocast cast" in body
    assert "✗ RuntimeError" in body


def test_frame_has_a_row_per_call_depth_first(linear_trace) -> None:
    frame = linear_trace.frame()
    assert list(frame.columns) == FRAME_COLUMNS
    assert len(frame) == len(linear_trace)
    assert list(frame["op"]) == [c.op for c in linear_trace.walk()]
    first = frame.iloc[0]
    assert first["depth"] == 0 and first["path"] == "AutocastCPU → AutogradCPU"
    assert first["kernel_kind"] == "via CompositeImplicitAutograd"
    assert frame["time_us"].dtype.kind == "f"
    assert frame["error"].notna().any()


@pytest.mark.parametrize("renderer", renderers())
def test_diagram_draws_calls_with_paths_and_nests_decompositions(linear_trace, renderer) -> None:
    diagram = linear_trace.diagram()
    assert isinstance(diagram, Diagram)
    assert "subgraph cluster_c1" in diagram.dot  # linear's decomposition
    facts = svg_facts(diagram.svg(renderer))
    texts = [shape.text for shape in facts.nodes.values()]
    assert any("aten::linear" in t and "AutocastCPU → AutogradCPU" in t for t in texts)
    assert len(facts.nodes) == len(linear_trace)
    assert "aten::linear decomposes into" in facts.all_text


def test_diagram_caps_the_number_of_calls(linear_trace) -> None:
    dot = linear_trace.view("diagram", max_calls=3).dot
    assert dot.count("fillcolor") == 3
    assert f"{len(linear_trace) - 3} more calls not drawn" in dot


def test_surprises_view(linear_trace) -> None:
    surprises = linear_trace.surprises()
    assert isinstance(surprises, Surprises)
    kinds = [s.kind for s in surprises]
    assert kinds.index("autocast cast") < kinds.index("decomposed")  # consequential first
    text = str(surprises)
    assert text.startswith("surprises:") and "aten::linear" in text
    assert '<table class="wraps">' in surprises._repr_html_()
    assert str(Surprises(())) == "surprises: none"


@pytest.mark.parametrize("width", [60, 100])
def test_text_cuts_forward_and_backward_into_sections_and_names_modules(
    training_step, width: int
) -> None:
    lines = training_step.view("text", width=width).splitlines()
    assert all(len(line) <= width for line in lines), [x for x in lines if len(x) > width]
    headings = [line for line in lines if line.startswith("── ")]
    assert [h.split(":")[0] for h in headings] == ["── forward", "── backward"]
    assert "autograd nodes" in headings[1]
    assert "· in 0 (Linear)" in lines and "· in 2 (Linear)" in lines
    assert lines[lines.index("· outside modules") + 1].startswith("aten::square")
    addmm = next(line for line in lines if line.startswith("AddmmBackward0"))
    assert "backward of aten::add" in addmm  # cut at narrow widths
    assert re.search(r"\d+(\.\d+)? (µs|ms|s)$", addmm.rstrip())


def test_html_folds_sections_and_modules_and_keeps_times_in_rows(training_step) -> None:
    html = training_step._repr_html_()
    body = html[html.index('<div class="opmagic">') :]
    ET.fromstring(body)
    assert body.count('<details class="section" open="open">') == 2
    assert '<details class="module" open="open">' in body and "2 (Linear)" in body
    assert '<details class="group">' in body and "AddmmBackward0" in body
    items = sum(1 for _ in walk_all(training_step.calls))
    folds = body.count('<details class="module"')
    assert body.count('<span class="time">') == items + folds  # every row shows its time
    assert body.count('<span class="main" title="') == items


def test_frame_has_phase_node_module_and_source(training_step) -> None:
    frame = training_step.frame()
    assert list(frame.columns) == FRAME_COLUMNS
    backward = frame[frame["phase"] == "backward"]
    forward = frame[frame["phase"] == "forward"]
    assert len(backward) and len(forward) and backward["node"].notna().all()
    assert set(backward["node"]) >= {"AddmmBackward0", "TBackward0"}
    first = forward.iloc[0]
    assert first["op"] == "aten::linear" and first["module"] == "0"
    assert first["source"].endswith(".step")
    assert "min" in first["outputs"] and first["kernel_source"]
    assert frame.groupby("module")["time_us"].sum().index.tolist() == ["0", "1", "2"]


def test_a_backward_call_shows_alone_with_its_node(training_step) -> None:
    node = next(n for n in training_step.nodes() if n.name == "AddmmBackward0")
    text = str(node)
    assert text.startswith("AddmmBackward0") and "aten::mm" in text
    assert 'class="group"' in node._repr_html_()


def test_diagram_draws_autograd_nodes_as_clusters(training_step) -> None:
    dot = training_step.diagram().dot
    assert "AddmmBackward0: backward of aten::addmm" in dot


def test_an_empty_trace_says_so_in_a_sentence() -> None:
    empty = trace(lambda: None)
    assert EMPTY in str(empty) and EMPTY in empty._repr_html_()
