"""Graphviz pictures of dispatch keys, shared by the table and resolution diagrams.

Keys are drawn in the dispatcher's priority order, top to bottom, one per rank (Debian's
dot 2.43 cannot lay out edges between record nodes of one rank). A kernel of the op's own
is a box of key, kind and source; keys a call passed over, fallbacks, fallthroughs and
missing kernels are one-line boxes, runs of them merged, their registration sites in
tooltips. A call's path is drawn as numbered bold edges and ends at the kernel that
computes the result, or at a red note saying why dispatch fails. A one-row legend names
only the styles the diagram uses.

Nodes are ``record`` and ``box`` shapes (:mod:`.diagram`'s plain labels). Everything here
only formats facts that ``opmagic.dispatch`` computed, and carried in the result drawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING

import graphviz

from .diagram import dot_label, plain, record, wrapped
from .style import DIM_COLOUR, FAIL_COLOUR, KIND_COLOURS, KIND_FILLS, PATH_COLOUR

if TYPE_CHECKING:
    from ..dispatch.resolve import Resolution, Skip, Step
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
_KIND_LEGEND = {
    "kernel": "own kernel",
    "alias": "via alias key",
    "autograd": "autograd kernel",
    "stub": "stub (raises)",
    "ambiguous": "ambiguous (raises)",
    "fallback": "backend fallback",
    "fallthrough": "fallthrough",
    "missing": "no kernel",
}
_SKIPPED = {"style": "filled,dashed", "fillcolor": "#fafafa", "color": DIM_COLOUR}
TITLE_WRAP = 80  # characters per line of the title
_NOTE_WRAP = 56  # characters per line of the call, error and Python notes
_COMPACT_WRAP = 40  # characters per line of a one-line box (which may wrap)
_ROW_CHARS = 84  # characters of one-line boxes side by side in one row
_TOOLTIP_KEYS = 12  # keys a tooltip lists
FULL_NODES = 4  # more kernels than this in a cluster or column: one-line boxes
_FONT = "Helvetica"


def keys_label(entries: Sequence[TableEntry], named: int = 3) -> str:
    """``CPU`` or ``CPU, CUDA, Meta + 60 more keys``: for a kernel of the op's own, the keys
    most readers know named first; for fallbacks and the like, the first keys."""
    if len(entries) <= named:
        return ", ".join(e.key for e in entries)
    if entries[0].is_own:
        entries = sorted(entries, key=lambda e: _familiarity(e.key))
    return f"{', '.join(e.key for e in entries[:named])} + {len(entries) - named} more keys"


_FAMILIAR = ("CPU", "CUDA", "Meta", "AutogradCPU", "AutogradCUDA", "AutocastCPU", "AutocastCUDA")


def _familiarity(key: str) -> int:
    """The keys most readers know first (CPU, CUDA, Meta, then their autograd/autocast
    keys), the others after them in priority order (a stable sort keeps it)."""
    return _FAMILIAR.index(key) if key in _FAMILIAR else len(_FAMILIAR)


# ------------------------------------------------------------------ nodes


@dataclass
class Pin:
    """What a call did at one key: the steps it ran there and why it passed it over."""

    steps: list[Step] = field(default_factory=list)
    numbers: list[int] = field(default_factory=list)
    skips: list[Skip] = field(default_factory=list)

    @property
    def skip_reason(self) -> str:
        """Why the call passed the key over, in one line."""
        return "; ".join(s.detail for s in self.skips)


@dataclass
class Node:
    """One box: a key, or a run of keys served alike (or passed over for the same reason)."""

    entries: list[TableEntry]
    pin: Pin | None = None

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

    @property
    def on_path(self) -> bool:
        """Whether the call's path runs this key's kernel."""
        return self.pin is not None and bool(self.pin.steps)


def pins_of(steps: Sequence[Step]) -> dict[str, Pin]:
    """Per key the call touched: its steps (numbered from 1) and the skips recorded there."""
    pins: dict[str, Pin] = {}
    for number, step in enumerate(steps, 1):
        pin = pins.setdefault(step.key, Pin())
        pin.steps.append(step)
        pin.numbers.append(number)
        for skip in step.skipped:
            skipped = pins.setdefault(skip.key, Pin())
            if skip.detail not in {s.detail for s in skipped.skips}:
                skipped.skips.append(skip)
    return pins


def category_clusters(entries: Sequence[TableEntry]) -> list[list[Node]]:
    """Clusters (runs of one category in priority order), each a list of nodes; inside a
    cluster, keys served by the same kernel share a node."""
    clusters: list[list[Node]] = []
    services: dict[tuple, Node] = {}
    previous_category = None
    for entry in entries:
        if entry.category != previous_category:
            clusters.append([])
            services = {}
            previous_category = entry.category
        service = (entry.kind, entry.alias, entry.source, entry.is_fallback)
        if service in services:
            services[service].entries.append(entry)
        else:
            services[service] = Node([entry])
            clusters[-1].append(services[service])
    return clusters


def column_nodes(entries: Sequence[TableEntry], pinned: dict[str, Pin]) -> list[Node]:
    """One column of nodes in priority order, look-alike keys merged.

    Keys on the path stand alone; consecutive keys passed over for the same reason share
    a node. Off the path, keys of one category served by the same kernel of the op's own
    share a node (as in the table's clusters), and keys with only a fallback, a fallthrough
    or no kernel share one node per kind until a kernel of the op's own from another
    category comes between: their sites differ, and what a reader needs is which kind
    serves them, and where they sit relative to the op's own kernels.
    """
    nodes: list[Node] = []
    own: dict[tuple, Node] = {}  # the current category's own kernels, by service
    others: dict[tuple, tuple[Node, str]] = {}  # (node, category) per kind, since the cut
    previous_skip: str | None = None
    category = None
    for entry in entries:
        pin = pinned.get(entry.key)
        if pin is not None:
            own, others = {}, {}
            reason = None if pin.steps else pin.skip_reason
            if reason is not None and reason == previous_skip:
                nodes[-1].entries.append(entry)
            else:
                nodes.append(Node([entry], pin))
            previous_skip, category = reason, None
            continue
        previous_skip = None
        if entry.category != category:
            own, category = {}, entry.category
        if entry.is_own:
            service = (entry.kind, entry.alias, entry.source)
            if service in own:
                own[service].entries.append(entry)
                continue
            own[service] = Node([entry])
            nodes.append(own[service])
            others = {look: held for look, held in others.items() if held[1] == category}
            continue
        look = (entry.kind, entry.is_fallback)
        if look in others:
            others[look][0].entries.append(entry)
        else:
            others[look] = (Node([entry]), category)
            nodes.append(others[look][0])
    return nodes


def _tooltip(node: Node) -> str:
    """Per key: what serves it and where that was registered (and, for up to three keys,
    what the key is for); then what the call did there."""
    shown = node.entries[:_TOOLTIP_KEYS]
    lines = []
    for entry in shown:
        lines.append(
            f"{entry.key}: {entry.kind_text}" + (f" — {entry.source}" if entry.source else "")
        )
        if len(node.entries) <= 3:
            lines.append(f"    {entry.explanation}")
    if len(node.entries) > len(shown):
        lines.append(f"... and {len(node.entries) - len(shown)} more keys")
    if node.pin is not None:
        lines += [f"{n}. {s.note}" for n, s in zip(node.pin.numbers, node.pin.steps, strict=True)]
        lines += [f"skipped: {s.detail}" for s in node.pin.skips]
    return "\n".join(lines)


# ------------------------------------------------------------------ building the graph


class KeyGraph:
    """Builds the ``graphviz.Digraph`` and remembers the styles it used, for the legend."""

    def __init__(self, title: list[str]) -> None:
        self.graph = graphviz.Digraph(
            "dispatch",
            graph_attr={
                "rankdir": "TB",
                "labelloc": "t",
                "fontname": _FONT,
                "fontsize": "11",
                "nodesep": "0.2",
                "ranksep": "0.16",
                "margin": "0.05",
                "label": dot_label(title),
            },
            node_attr={
                "shape": "box",
                "fontname": _FONT,
                "fontsize": "10",
                "style": "filled",
                "fillcolor": "white",
                "height": "0.25",
                "margin": "0.08,0.03",
            },
            edge_attr={"fontname": _FONT, "fontsize": "10", "arrowsize": "0.7"},
        )
        self.ranks: list[list[str]] = []  # nodes top to bottom, a list per rank
        self.styles: list[str] = []  # legend entries: the styles drawn

    def _use(self, style: str) -> None:
        """Remember that ``style`` is drawn, for the legend."""
        if style not in self.styles:
            self.styles.append(style)

    def add_clusters(self, clusters: list[list[Node]]) -> None:
        """Draw nodes in clusters by category (the table diagram); a cluster of more than
        :data:`FULL_NODES` nodes draws them as one-line boxes in rows."""
        for number, nodes in enumerate(clusters):
            with self.graph.subgraph(name=f"cluster_{number}") as cluster:
                cluster.attr(
                    label=CLUSTER_LABELS[nodes[0].first.category],
                    style="rounded,filled",
                    fillcolor="#fbfbfb",
                    color="#cfd8dc",
                    fontcolor="#546e7a",
                    fontsize="10",
                    margin="6",
                )
                self._add_nodes(cluster, nodes, compact=len(nodes) > FULL_NODES)

    def add_column(self, nodes: list[Node], compact: bool = False) -> dict[str, str]:
        """Draw nodes as one column; returns key -> node id for every key drawn.

        ``compact``: kernels of the op's own off the path are one-line boxes too.
        """
        self._add_nodes(self.graph, nodes, compact)
        return {e.key: node.node_id for node in nodes for e in node.entries}

    def _add_nodes(self, target: graphviz.Digraph, nodes: list[Node], compact: bool) -> None:
        """Nodes top to bottom, runs of one-line boxes side by side in rows of about
        :data:`_ROW_CHARS` characters (left to right, then down: priority order)."""
        run: list[tuple[str, int]] = []  # one-line boxes waiting to be packed into rows
        for node in nodes:
            width = self._add_node(target, node, compact)
            if width is None:
                self._add_rows(target, run)
                run = []
                self.ranks.append([node.node_id])
            else:
                run.append((node.node_id, width))
        self._add_rows(target, run)

    def _add_rows(self, target: graphviz.Digraph, boxes: list[tuple[str, int]]) -> None:
        """Put boxes (name, characters) side by side, a rank per row."""
        row: list[str] = []
        used = 0
        for name, width in boxes:
            if row and used + width > _ROW_CHARS:
                self._add_rank(target, row)
                row, used = [], 0
            row.append(name)
            used += width + 4
        if row:
            self._add_rank(target, row)

    def _add_rank(self, target: graphviz.Digraph, names: list[str]) -> None:
        """One rank: its nodes side by side, in order."""
        if len(names) > 1:
            with target.subgraph() as rank:
                rank.attr(rank="same")
                for name in names:
                    rank.node(name)
                for a, b in pairwise(names):
                    rank.edge(a, b, style="invis")
        self.ranks.append(names)

    def _add_node(self, target: graphviz.Digraph, node: Node, compact: bool) -> int | None:
        """One key node: a record of key, kind and source (returns None), or a one-line box
        (returns the length of its label's longest line, to pack it into a row)."""
        entry, pin = node.first, node.pin
        attrs = {"tooltip": plain(_tooltip(node))}
        classes = ["key"]
        fields = [keys_label(node.entries), entry.kind_label, entry.source]
        text = f"{keys_label(node.entries, 2)} · {entry.kind_label}"
        if node.on_path:
            assert pin is not None
            classes.append("path")
            self._use("path")
            attrs.update(fillcolor=KIND_FILLS[entry.kind], color=PATH_COLOUR, penwidth="2.4")
            if any(s.action == "ends" for s in pin.steps):
                fields.append("✓ computes the result")
            if any(s.action == "error" for s in pin.steps):
                fields.append("✗ dispatch fails here")
                classes.append("failed")
                self._use("failed")
                attrs.update(
                    color=FAIL_COLOUR, fillcolor=KIND_FILLS["missing"], fontcolor=FAIL_COLOUR
                )
            else:
                self._use(entry.kind)
        elif pin is not None:
            classes.append("skipped")
            self._use("skipped")
            text = f"{keys_label(node.entries, 2)} · skipped: {pin.skip_reason}"
            attrs.update(_SKIPPED, fontcolor="#757575")
        else:
            self._use(entry.kind)
            attrs.update(fillcolor=KIND_FILLS[entry.kind], color=KIND_COLOURS[entry.kind])
            if not entry.is_own:
                attrs["fontcolor"] = "#616161" if entry.kind != "missing" else FAIL_COLOUR
        attrs["class"] = " ".join(classes)
        if node.on_path or (pin is None and not compact and entry.is_own):
            target.node(node.node_id, shape="record", label=record(fields), **attrs)
            return None
        lines = wrapped([text], _COMPACT_WRAP)
        target.node(node.node_id, label=dot_label(lines), **attrs)
        return max(len(line) for line in lines)

    def add_path(self, resolution: Resolution, ids: dict[str, str]) -> None:
        """The call note, the numbered path edges, and how the path ends."""
        lines = [f"call {resolution.op}"]
        lines += [f"{i.name}: {i.description}" for i in resolution.inputs]
        lines += list(resolution.context)
        self.graph.node(
            "call",
            label=dot_label(wrapped(lines, _NOTE_WRAP), align="l"),
            shape="note",
            fillcolor="#fffde7",
            color="#f9a825",
            tooltip="the call and the thread-local state it is resolved under",
            **{"class": "call"},
        )
        self.ranks.insert(0, ["call"])
        previous = "call"
        for number, step in enumerate(resolution.steps, 1):
            verb = {"dispatch": "dispatch", "redispatch": "redispatch", "call": "calls again"}[
                step.via
            ]
            colour = FAIL_COLOUR if step.action == "error" else PATH_COLOUR
            self.graph.edge(
                previous,
                ids[step.key],
                label=f"{number} {verb}",
                style="bold,dashed" if step.assumed else "bold",
                penwidth="2.2",
                color=colour,
                fontcolor=colour,
                constraint="false",
                tooltip=plain(step.note),
                **{"class": "path"},
            )
            previous = ids[step.key]
        last = resolution.steps[-1] if resolution.steps else None
        if resolution.error is not None:
            self._end_node("error", "✗ dispatch fails", resolution.error, FAIL_COLOUR, previous)
        elif last is not None and last.action == "python":
            self._end_node("python", "hands over to Python", last.note, PATH_COLOUR, previous)

    def _end_node(self, name: str, heading: str, text: str, colour: str, after: str) -> None:
        """A note right below the last step: why dispatch fails, or where Python takes over."""
        self.graph.node(
            name,
            label=dot_label([heading, *wrapped([text], _NOTE_WRAP)], align="l"),
            shape="note" if name == "python" else "box",
            color=colour,
            fontcolor=colour,
            fillcolor="#fff5f5" if name == "error" else "white",
            penwidth="1.6",
            tooltip=plain(text),
            **{"class": name},
        )
        self.graph.edge(after, name, style="bold", penwidth="1.6", color=colour, **{"class": name})
        rows = [number for number, rank in enumerate(self.ranks) if after in rank]
        self.ranks.insert(rows[0] + 1 if rows else len(self.ranks), [name])

    def add_legend(self) -> None:
        """Rows under the diagram naming the styles it used; then the chain of ranks."""
        boxes = []
        order = ["path", "failed", *KIND_FILLS, "skipped"]
        for number, style in enumerate(sorted(self.styles, key=order.index)):
            attrs = _legend_attrs(style)
            self.graph.node(f"legend_{number}", **attrs)
            boxes.append((f"legend_{number}", len(attrs["label"])))
        self._add_rows(self.graph, boxes)
        for a, b in pairwise(self.ranks):
            self.graph.edge(a[0], b[0], style="invis", weight="10")


def _legend_attrs(style: str) -> dict[str, str]:
    """A small box drawn in ``style``, saying what the style means."""
    common = {"fontsize": "9", "height": "0.2", "class": "legend", "tooltip": "legend"}
    if style == "path":
        return {**common, "label": "on the path", "color": PATH_COLOUR, "penwidth": "2"}
    if style == "skipped":
        return {**common, **_SKIPPED, "fontcolor": "#757575", "label": "skipped"}
    if style == "failed":
        return {
            **common,
            "label": "fails",
            "color": FAIL_COLOUR,
            "fontcolor": FAIL_COLOUR,
            "fillcolor": KIND_FILLS["missing"],
        }
    return {
        **common,
        "label": _KIND_LEGEND[style],
        "fillcolor": KIND_FILLS[style],
        "color": KIND_COLOURS[style],
    }
