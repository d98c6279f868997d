"""Diagrams of tables and paths, read back from the SVG of both renderers."""

from __future__ import annotations

import pytest
import torch
from torch.testing._internal.two_tensor import TwoTensor

import opmagic
from opmagic import OpmagicError, dispatch_table, resolve
from opmagic.view import graph
from opmagic.view.graph import resolution_diagram, table_diagram
from opmagic.view.render import render_svg

from .svgfacts import renderers, svg_facts


@torch.library.custom_op("opmagic_graph::scale", mutates_args=())
def scale(x: torch.Tensor, factor: float) -> torch.Tensor:
    """A custom op with a CompositeExplicitAutograd kernel and no fake impl."""
    return x * factor


_defined: dict = {}
exec(  # a kernel defined outside any file: its source reads "(<string>:1)"
    "@torch.library.custom_op('opmagic_graph::shifted', mutates_args=())\n"
    "def shifted(x: torch.Tensor) -> torch.Tensor:\n"
    "    return x + 1\n",
    {"torch": torch},
    _defined,
)

_cpu_only = torch.library.Library("opmagic_graph", "FRAGMENT")
_cpu_only.define("cpu_only(Tensor x) -> Tensor")
_cpu_only.impl("cpu_only", lambda x: x.clone(), "CPU")


def _nodes_with(facts, words: str) -> list[str]:
    return [title for title, shape in facts.nodes.items() if words in shape.text]


@pytest.mark.parametrize("renderer", renderers())
def test_table_shows_own_kernels_by_default_and_every_key_on_request(renderer: str) -> None:
    table = dispatch_table(scale)
    facts = svg_facts(table_diagram(table).svg(renderer))
    assert "Meta" in facts.nodes
    assert "custom_op fake impl: none registered" in facts.nodes["Meta"].text
    autograd = _nodes_with(facts, "AutogradCPU")
    assert len(autograd) == 1 and "via Autograd" in facts.nodes[autograd[0]].text
    assert _nodes_with(facts, "via CompositeExplicitAutograd")
    assert "PythonDispatcher" not in facts.nodes  # a backend fallback: not the op's own
    assert "more keys not drawn" in facts.all_text
    for cluster in ("autograd", "backends", "legend", "own kernel: registered for this key"):
        assert cluster in facts.all_text

    every = svg_facts(table_diagram(table, show_all=True).svg(renderer))
    assert "PythonDispatcher" in every.nodes
    assert "fallback" in every.nodes["PythonDispatcher"].text
    assert _nodes_with(every, "missing")
    assert len(every.nodes) > len(facts.nodes)
    assert "more keys not drawn" not in every.all_text


@pytest.mark.parametrize("renderer", renderers())
def test_path_is_numbered_bold_edges_with_skipped_keys_dimmed(renderer: str) -> None:
    x = torch.randn(3, requires_grad=True)
    facts = svg_facts(resolution_diagram(resolve(scale, x, 2.0)).svg(renderer))
    assert facts.path_nodes() == {"AutogradCPU", "CPU"}
    assert facts.edges["call->AutogradCPU"].texts == ("1 dispatch",)
    assert facts.edges["AutogradCPU->CPU"].texts == ("2 redispatch",)
    assert "path" in facts.edges["AutogradCPU->CPU"].classes
    assert "✓ computes the result" in facts.nodes["CPU"].text
    assert "x: Tensor(float32, cpu, [3], requires_grad)" in facts.nodes["call"].text
    for skipped in ("AutocastCPU", "ADInplaceOrView", "BackendSelect"):
        assert "skipped" in facts.nodes[skipped].classes
    assert "excluded by TLS: autocast for CPU is off" in facts.nodes["AutocastCPU"].text
    assert "PythonDispatcher" not in facts.nodes
    assert "path: AutogradCPU → CPU" in facts.all_text
    assert "more keys not drawn: keys this call never looked at" in facts.all_text


def test_all_keys_around_the_same_path() -> None:
    resolution = resolve(scale, torch.randn(3, requires_grad=True), 2.0)
    facts = svg_facts(resolution_diagram(resolution, show_all=True).svg())
    assert facts.path_nodes() == {"AutogradCPU", "CPU"}
    assert "PythonDispatcher" in facts.nodes
    assert "skipped" in facts.nodes["AutocastCPU"].classes
    assert "more keys not drawn" not in facts.all_text


def test_a_call_again_is_numbered_in_order() -> None:
    with torch.autocast("cpu"):
        resolution = resolve(torch.ops.aten.mm, torch.randn(2, 3), torch.randn(3, 4))
    facts = svg_facts(resolution_diagram(resolution).svg())
    assert facts.edges["call->AutocastCPU"].texts == ("1 dispatch",)
    assert facts.edges["AutocastCPU->AutogradCPU"].texts == ("2 calls again",)
    assert facts.edges["AutogradCPU->CPU"].texts == ("3 redispatch",)
    assert "autocast on for cpu" in facts.nodes["call"].text


@pytest.mark.parametrize("renderer", renderers())
def test_a_raising_kernel_is_marked_where_dispatch_fails(renderer: str) -> None:
    resolution = resolve(scale, torch.randn(3, device="meta"), 2.0)
    facts = svg_facts(resolution_diagram(resolution).svg(renderer))
    assert "failed" in facts.nodes["Meta"].classes
    assert "✗ dispatch fails here" in facts.nodes["Meta"].text
    assert "Meta->error" in facts.edges
    assert facts.nodes["error"].texts[0] == "dispatch fails"
    assert "register_fake" in facts.nodes["error"].text
    assert "✗ fails" in facts.all_text


def test_a_missing_kernel_is_drawn_as_missing() -> None:
    resolution = resolve(torch.ops.opmagic_graph.cpu_only, torch.randn(2).to_sparse())
    facts = svg_facts(resolution_diagram(resolution).svg())
    assert "missing" in facts.nodes["SparseCPU"].text
    assert "failed" in facts.nodes["SparseCPU"].classes
    assert "no kernel for SparseCPU" in facts.nodes["error"].text


def test_a_hand_over_to_python_ends_in_a_note() -> None:
    t = torch.randn(2)
    resolution = resolve(torch.ops.aten.mul.Tensor, TwoTensor(t, t.clone()), t)
    facts = svg_facts(resolution_diagram(resolution).svg())
    assert "Python->python" in facts.edges
    assert facts.nodes["python"].texts[0] == "hands over to Python"
    assert "TwoTensor" in facts.nodes["python"].text


@pytest.mark.parametrize("renderer", renderers())
def test_record_syntax_characters_survive(renderer: str) -> None:
    text = 'a{b}|<c> "q" \\ d'
    dot = f'digraph {{ n [shape=record, label="{{{graph._escape_field(text)}|two}}"]; }}'
    assert svg_facts(render_svg(dot, renderer)).nodes["n"].texts == (text, "two")
    table = dispatch_table(torch.ops.opmagic_graph.shifted)
    facts = svg_facts(table_diagram(table).svg(renderer))
    assert "custom_op impl shifted (<string>:1)" in facts.all_text


def test_results_display_as_svg_plus_text() -> None:
    resolution = resolve(scale, torch.randn(3), 2.0)
    table = dispatch_table(scale)
    for result in (resolution, table):
        bundle = result._repr_mimebundle_()
        assert set(bundle) == {"image/svg+xml", "text/plain"}
        assert bundle["text/plain"] == str(result)
        assert svg_facts(bundle["image/svg+xml"]).nodes
        assert set(result._repr_mimebundle_(include=["text/plain"])) == {"text/plain"}
        assert set(result._repr_mimebundle_(exclude=["image/svg+xml"])) == {"text/plain"}


def test_without_graphviz_the_display_falls_back_to_text(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_graphviz(dot: str, renderer: str | None = None) -> str:
        raise OpmagicError("No Graphviz to draw diagrams with")

    monkeypatch.setattr(graph, "render_svg", no_graphviz)
    bundle = resolve(scale, torch.randn(3), 2.0)._repr_mimebundle_()
    assert set(bundle) == {"text/plain"}
    assert "(no diagram: No Graphviz to draw diagrams with)" in bundle["text/plain"]


def test_overload_tables_display_one_diagram_each() -> None:
    tables = dispatch_table(torch.ops.aten.add)
    assert isinstance(tables, opmagic.OverloadTables)
    html = tables._repr_html_()
    assert html.count("<svg") == len(tables)
    assert all(table.schema.split("(")[0] in html for table in tables)
    assert str(tables) == "\n\n".join(str(table) for table in tables)
