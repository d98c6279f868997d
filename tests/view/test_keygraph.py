"""Diagrams of tables and paths, read back from the SVG of both renderers."""

from __future__ import annotations

import shutil
from pathlib import Path

import graphviz
import pytest
import torch

import opmagic
from opmagic import OpmagicError, dispatch_table, resolve
from opmagic.view import diagram
from opmagic.view.diagram import render_svg
from opmagic.view.resolution import resolution_diagram
from opmagic.view.table import table_diagram

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


def _legend(facts) -> set[str]:
    return {shape.text for shape in facts.with_class("legend").values()}


@pytest.mark.parametrize("renderer", renderers())
def test_table_shows_own_kernels_by_default_and_every_key_on_request(renderer: str) -> None:
    table = dispatch_table(scale)
    facts = svg_facts(table_diagram(table).svg(renderer))
    assert facts.nodes["Meta"].texts == (
        "Meta",
        "stub: raises (no fake impl)",
        "no fake impl: register one with register_fake",
    )
    autograd = facts.node_with("AutogradCPU")
    assert "via Autograd" in autograd.text
    assert facts.node_with("CPU, CUDA").texts[1] == "via CompositeExplicitAutograd"
    assert "PythonDispatcher" not in facts.all_text  # a backend fallback: not the op's own
    assert "keys with only a fallback or no kernel are not drawn" in facts.all_text
    for cluster in ("autograd", "backends"):
        assert cluster in facts.all_text
    assert _legend(facts) == {"autograd kernel", "via alias key", "stub (raises)"}

    every = svg_facts(table_diagram(table, show_all=True).svg(renderer))
    fallbacks = every.node_with("PythonDispatcher")
    assert fallbacks.text.endswith("· fallback")
    assert "aten/src/ATen/core/PythonFallbackKernel.cpp" in fallbacks.tooltip  # sites: tooltips
    assert "PythonFallbackKernel.cpp" not in every.all_text
    assert any("· missing" in shape.text for shape in every.nodes.values())
    assert "not drawn" not in every.all_text
    assert {"backend fallback", "no kernel", "fallthrough"} <= _legend(every)


@pytest.mark.parametrize("renderer", renderers())
def test_every_key_of_a_table_fits_about_one_screen(renderer: str) -> None:
    """All ~135 keys: runs of fallbacks, fallthroughs and missing kernels are merged."""
    for op in (scale, "aten::add.Tensor"):
        facts = svg_facts(table_diagram(dispatch_table(op), show_all=True).svg(renderer))
        assert facts.height_pt <= 800 and facts.width_pt <= 700, (op, facts.height_pt)


@pytest.mark.parametrize("renderer", renderers())
def test_path_is_numbered_bold_edges_with_skipped_keys_dimmed(renderer: str) -> None:
    x = torch.randn(3, requires_grad=True)
    facts = svg_facts(resolution_diagram(resolve(scale, x, 2.0)).svg(renderer))
    assert facts.path_nodes() == {"AutogradCPU", "CPU"}
    assert facts.edges["call->AutogradCPU"].texts == ("1 dispatch",)
    assert facts.edges["AutogradCPU->CPU"].texts == ("2 redispatch",)
    assert "path" in facts.edges["AutogradCPU->CPU"].classes
    assert facts.nodes["CPU"].texts[-1] == "✓ computes the result"
    assert "x: Tensor(float32, cpu, [3], requires_grad)" in facts.nodes["call"].text
    skipped = facts.with_class("skipped")
    assert facts.nodes["AutocastCPU"].text == (
        "AutocastCPU · skipped: excluded by TLS: autocast for CPU is off"
    )
    # keys passed over for the same reason share a box: the reason, not the C++ site
    together = facts.nodes["ADInplaceOrView +1"]
    assert together.text == "ADInplaceOrView, BackendSelect · skipped: fallthrough for this op"
    assert "VariableFallbackKernel.cpp:103" in together.tooltip
    assert set(skipped) == {"AutocastCPU", "ADInplaceOrView +1"}
    assert "PythonDispatcher" not in facts.all_text
    assert "path: AutogradCPU → CPU" in facts.all_text
    assert "keys the call never looked at are not drawn" in facts.all_text
    # the legend names only what is drawn: nothing fails, nothing is a fallback
    assert _legend(facts) == {"on the path", "autograd kernel", "via alias key", "skipped"}


@pytest.mark.parametrize("renderer", renderers())
def test_a_two_key_path_fits_500_points(renderer: str) -> None:
    """The issue's budget: the answer readable at 100% without scrolling a screen."""
    x = torch.randn(3, requires_grad=True)
    facts = svg_facts(resolution_diagram(resolve(scale, x, 2.0)).svg(renderer))
    assert facts.height_pt <= 500 and facts.width_pt <= 600, facts
    with torch.inference_mode():
        one = svg_facts(resolution_diagram(resolve(scale, x.detach(), 2.0)).svg(renderer))
    assert one.height_pt <= 500 and one.width_pt <= 600


def test_all_keys_around_the_same_path() -> None:
    resolution = resolve(scale, torch.randn(3, requires_grad=True), 2.0)
    facts = svg_facts(resolution_diagram(resolution, show_all=True).svg())
    assert facts.path_nodes() == {"AutogradCPU", "CPU"}
    assert facts.node_with("PythonDispatcher").text.endswith("· fallback")
    assert "skipped" in facts.nodes["AutocastCPU"].classes
    assert "not drawn" not in facts.all_text
    assert facts.height_pt <= 900


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
    assert facts.nodes["Meta"].texts[1:] == (
        "stub: raises (no fake impl)",
        "no fake impl: register one with register_fake",
        "✗ dispatch fails here",
    )
    assert "Meta->error" in facts.edges
    assert facts.nodes["error"].texts[0] == "✗ dispatch fails"
    assert "register_fake" in facts.nodes["error"].text
    assert "✗ fails" in facts.all_text
    assert "fails" in _legend(facts) and "stub (raises)" not in _legend(facts)
    # as readable as a success: about as wide as one, not a wide strip shrunk to fit
    assert facts.width_pt <= 600 and facts.height_pt <= 500


def test_a_missing_kernel_is_drawn_as_missing() -> None:
    resolution = resolve(torch.ops.opmagic_graph.cpu_only, torch.randn(2).to_sparse())
    facts = svg_facts(resolution_diagram(resolution).svg())
    assert "missing" in facts.nodes["SparseCPU"].text
    assert "failed" in facts.nodes["SparseCPU"].classes
    assert "no kernel for SparseCPU" in facts.nodes["error"].text


class Opaque(torch.Tensor):
    """A wrapper subclass that does not say what it wraps (no ``__tensor_flatten__``)."""

    @staticmethod
    def __new__(cls, elem: torch.Tensor) -> Opaque:
        return torch.Tensor._make_wrapper_subclass(cls, elem.shape, dtype=elem.dtype)

    def __init__(self, elem: torch.Tensor) -> None:
        self.elem = elem

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        unwrapped = [a.elem if isinstance(a, Opaque) else a for a in args]
        return func(*unwrapped, **(kwargs or {}))


def test_a_hand_over_to_python_ends_in_a_note() -> None:
    t = torch.randn(2)
    resolution = resolve(torch.ops.aten.mul.Tensor, Opaque(t), t)
    facts = svg_facts(resolution_diagram(resolution).svg())
    assert "Python->python" in facts.edges
    assert facts.nodes["python"].texts[0] == "hands over to Python"
    assert "Opaque" in facts.nodes["python"].text


def test_a_python_meta_kernel_is_named_by_its_function() -> None:
    """torch/_meta_registrations.py registers through one Library: name the function."""
    resolution = resolve(torch.ops.aten.mm, torch.randn(2, 3, device="meta"), torch.randn(3, 4))
    facts = svg_facts(resolution_diagram(resolution).svg())
    assert "meta_mm (torch/_meta_registrations.py:" in facts.nodes["Meta"].text


def test_the_diagram_is_a_graphviz_graph_to_restyle_and_save(tmp_path: Path) -> None:
    diagram = resolve(scale, torch.randn(3), 2.0).diagram()
    assert isinstance(diagram.graph, graphviz.Digraph)
    assert diagram.dot == diagram.graph.source
    before = diagram.svg()
    diagram.graph.attr(bgcolor="#fafafa")
    assert diagram.svg() != before and 'fill="#fafafa"' in diagram.svg()
    saved = Path(diagram.graph.save(tmp_path / "path.gv"))
    assert saved.read_text() == diagram.dot
    if shutil.which("dot"):  # graphviz's own render() runs the system Graphviz
        png = Path(diagram.graph.render(tmp_path / "path", format="png"))
        assert png.read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("renderer", renderers())
def test_record_syntax_characters_survive(renderer: str) -> None:
    text = 'a{b}|<c> "q" \\ d \\"'
    drawn = graphviz.Digraph()
    drawn.node("n", shape="record", label=diagram.record([text, "two"]))
    drawn.node("m", label=diagram.dot_label([text, "<html?>"]), tooltip=diagram.plain(text))
    facts = svg_facts(render_svg(drawn.source, renderer))
    assert facts.nodes["n"].texts == (text, "two")
    assert facts.nodes["m"].texts == (text, "<html?>")
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

    monkeypatch.setattr(diagram, "render_svg", no_graphviz)
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
