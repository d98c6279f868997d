"""The views of a trace: width-aware text, the collapsible HTML tree, the DataFrame, the call
graph (read back from both Graphviz renderers' SVG) and the surprises summary."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest
import torch

from opmagic import Surprises, trace
from opmagic.view.diagram import Diagram
from opmagic.view.trace import FRAME_COLUMNS

from .svgfacts import renderers, svg_facts


@pytest.fixture(scope="module")
def linear_trace():
    """A linear layer then a failing matmul, under autocast: decomposition, casts, an error."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 3)

    def step(x: torch.Tensor) -> torch.Tensor:
        y = layer(x).relu()
        return y @ torch.ones(5)  # fails: sizes do not match

    with torch.autocast("cpu"):
        return trace(step, torch.randn(2, 4))


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
    assert "<table>" in surprises._repr_html_()
    assert str(Surprises(())) == "surprises: none"
