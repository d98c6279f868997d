"""How a trace looks: a tree of calls (text and collapsible HTML), a call graph, a DataFrame,
and the surprises summary. Everything here formats facts ``opmagic.dispatch.trace`` recorded.

Each call shows as ``op  key → key → key  kernel kind  time``: the keys whose kernels ran, how
the kernel that ended the path was registered, and the call's wall time (children included,
tracer overhead taken out).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Sequence
from html import escape
from typing import TYPE_CHECKING

import graphviz

from ..dispatch.trace import Surprises, Trace, TracedCall
from ..display import Displayable, renders
from .diagram import Diagram, dot_label
from .layout import wrap
from .style import FAIL_COLOUR, KIND_COLOURS, KIND_FILLS, styled

if TYPE_CHECKING:
    import pandas

FRAME_COLUMNS = ["depth", "op", "path", "kernel_kind", "source", "time_us", "inputs", "error"]
DIAGRAM_CALLS = 150  # calls a diagram draws before it says how many it left out
ARROW = " → "


def _time(ns: int) -> str:
    """A duration for people: ``12 µs``, ``1.3 ms``, ``2.1 s``."""
    if ns < 1_000_000:
        return f"{ns / 1000:.0f} µs"
    if ns < 1_000_000_000:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e9:.2f} s"


def _headline(trace: Trace) -> list[str]:
    """The summary line, then what the traced code raised (on its own line so it reads whole)."""
    total = len(trace)
    made = len(trace.calls)
    text = (
        f"trace: {total} operator call{'s' if total != 1 else ''} ({made} made by the traced "
        f"code itself), {_time(trace.time_ns)} (tracing added {_time(trace.overhead_ns)})"
    )
    if trace.exception is None:
        return [text]
    return [text, f"raised {type(trace.exception).__name__}: {trace.exception}"]


def _kind_of(call: TracedCall) -> str:
    """The colour key of a call's final kernel (``TableEntry.kind``, or missing on error)."""
    if call.error:
        return "missing"
    return call.kernel.kind if call.kernel is not None else "missing"


# ------------------------------------------------------------------ text


def _short_kind(kind: str) -> str:
    """``via CompositeImplicitAutograd`` -> ``CompositeImplicit``: kinds short enough for a row."""
    return kind.removeprefix("via ").removesuffix("Autograd") or kind


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def _text_rows(calls: Sequence[TracedCall]) -> Iterator[tuple[str, TracedCall]]:
    """Rows of a call forest: top-level calls flush left, their subtrees drawn below them."""
    for call in calls:
        yield call.op, call
        yield from _subtree(call.children, "")


def _subtree(calls: Sequence[TracedCall], prefix: str) -> Iterator[tuple[str, TracedCall]]:
    for index, call in enumerate(calls):
        last = index == len(calls) - 1
        yield prefix + ("└─ " if last else "├─ ") + call.op, call
        yield from _subtree(call.children, prefix + ("   " if last else "│  "))


def calls_text(calls: Sequence[TracedCall], width: int | None = None) -> list[str]:
    """One line per call (tree, op, path, kernel kind, time), fitted to ``width`` columns."""
    width = width or shutil.get_terminal_size().columns
    rows = list(_text_rows(calls))
    if not rows:
        return ["(no operator calls)"]
    name_width = min(max(len(name) for name, _ in rows), max(24, width // 3))
    lines = []
    for name, call in rows:
        time = _time(call.time_ns).rjust(9)
        middle_width = max(10, width - name_width - len(time) - 4)
        middle = ARROW.join(call.path) or "(no kernel ran)"
        middle = f"{middle}  [{_short_kind(call.kernel_kind)}]"
        left = _clip(name, name_width).ljust(name_width)
        lines.append(f"{left}  {_clip(middle, middle_width).ljust(middle_width)}  {time}")
        indent = " " * (len(name) - len(name.lstrip(" │├└─")) + 3)
        if call.error:
            lines.append(_clip(f"{indent}✗ {call.error}", width))
        lines += [_clip(f"{indent}▸ {note}", width) for note in call.notes]
    return lines


@renders(Trace, "text")
def trace_text(trace: Trace, width: int | None = None) -> str:
    """The headline, the call tree, then the surprises, fitted to the terminal's width."""
    width = width or shutil.get_terminal_size().columns
    headline = [wrapped for line in _headline(trace) for wrapped in wrap(line, width)]
    lines = [*headline, *calls_text(trace.calls, width)]
    lines += [_clip(f"▸ {note}", width) for note in trace.notes]
    surprises = trace.surprises()
    if len(surprises):
        lines += ["", surprises_text(surprises, width)]
    return "\n".join(lines)


@renders(TracedCall, "text")
def call_text(call: TracedCall, width: int | None = None) -> str:
    """One call and the calls under it, as the trace's tree shows them."""
    return "\n".join(calls_text([call], width))


@renders(Surprises, "text")
def surprises_text(surprises: Surprises, width: int | None = None) -> str:
    """``kind  op ×count  detail`` per surprise, fitted to ``width``."""
    width = width or shutil.get_terminal_size().columns
    if not len(surprises):
        return "surprises: none"
    kind_width = max(len(s.kind) for s in surprises)
    labels = [f"{s.op}{f' ×{s.count}' if s.count > 1 else ''}" for s in surprises]
    op_width = min(max(len(label) for label in labels), max(20, width // 3))
    lines = ["surprises:"]
    for surprise, label in zip(surprises, labels, strict=True):
        head = f"  {surprise.kind:<{kind_width}}  {_clip(label, op_width):<{op_width}}  "
        detail = wrap(surprise.detail, max(20, width - len(head))) or [""]
        lines.append(head + detail[0])
        lines += [" " * len(head) + more for more in detail[1:]]
    return "\n".join(lines)


# ------------------------------------------------------------------ HTML


def _call_row(call: TracedCall) -> str:
    """One call's line of the HTML tree: op, inputs, path, kernel kind and source, time."""
    colour = KIND_COLOURS.get(_kind_of(call), "#000")
    path = ARROW.join(escape(k) for k in call.path) or '<span class="dim">(no kernel ran)</span>'
    error = (
        f' <span style="color:{FAIL_COLOUR}">✗ {escape(call.error)}</span>' if call.error else ""
    )
    source = escape(call.source)
    return (
        f'<span class="op">{escape(call.op)}</span> <span class="dim">({escape(call.inputs)})'
        f"</span> {path} "
        f'<span style="color:{colour}" title="{source}">'
        f"[{escape(call.kernel_kind)}]</span> "
        f'<span class="dim">{source}</span> '
        f'<span class="time">{_time(call.time_ns)}</span>{error}'
    )


def _note_html(note: object) -> str:
    """A note (a Triton launch, ...) as a line of the tree: its HTML view, else its text."""
    shown = note._repr_html_() if isinstance(note, Displayable) else None
    return f'<div class="call">▸ {shown or escape(str(note))}</div>'


def _call_html(call: TracedCall) -> str:
    row = _call_row(call)
    notes = "".join(_note_html(note) for note in call.notes)
    if not call.children:
        return f'<div class="call">{row}{notes}</div>'
    children = notes + "".join(_call_html(c) for c in call.children)
    return (
        f'<details class="call"><summary>{row}</summary>'
        f'<div class="calls">{children}</div></details>'
    )


@renders(Trace, "html")
def trace_html(trace: Trace) -> str:
    """The headline, the surprises, then the calls as a collapsible tree (op → path → kernel)."""
    surprises = trace.surprises()
    summary = surprises_html(surprises, wrapped=False) if len(surprises) else ""
    calls = "".join(_call_html(c) for c in trace.calls) or '<div class="dim">(no calls)</div>'
    calls += "".join(_note_html(note) for note in trace.notes)
    headline = "".join(f'<div class="headline">{escape(line)}</div>' for line in _headline(trace))
    return styled(f'{headline}{summary}<div class="calls-pane">{calls}</div>')


@renders(TracedCall, "html")
def call_html(call: TracedCall) -> str:
    """One call with the calls under it, collapsible."""
    return styled(_call_html(call))


@renders(Surprises, "html")
def surprises_html(surprises: Surprises, wrapped: bool = True) -> str:
    """The surprises as a table: kind, operator, how many calls, what happened."""
    if not len(surprises):
        body = '<div class="dim">surprises: none</div>'
    else:
        rows = "".join(
            f"<tr><td>{escape(s.kind)}</td><td>{escape(s.op)}</td><td>{s.count}</td>"
            f"<td>{escape(s.detail)}</td></tr>"
            for s in surprises
        )
        body = (
            '<details open="open"><summary>surprises</summary><table><tr><th>kind</th><th>op</th>'
            f"<th>calls</th><th>what happened</th></tr>{rows}</table></details>"
        )
    return styled(body) if wrapped else body


# ------------------------------------------------------------------ DataFrame


@renders(Trace, "frame")
def trace_frame(trace: Trace) -> pandas.DataFrame:
    """A row per call, depth-first: depth, op, path, kernel kind, source, time (µs), ..."""
    import pandas as pd

    rows = [
        (
            call.depth,
            call.op,
            ARROW.join(call.path),
            call.kernel_kind,
            call.source,
            call.time_ns / 1000,
            call.inputs,
            call.error,
        )
        for call in trace.walk()
    ]
    return pd.DataFrame(rows, columns=FRAME_COLUMNS)


# ------------------------------------------------------------------ diagram


class _CallGraph:
    """The call forest as a ``graphviz.Digraph``: calls as boxes, decompositions as nested
    clusters.

    Edges are added at the top level: an edge inside a cluster would pull its caller in.
    """

    def __init__(self, graph: graphviz.Digraph, limit: int) -> None:
        self.graph = graph
        self.edges: list[tuple[str, str, dict[str, str]]] = []
        self.count = 0
        self.limit = limit
        self.left_out = 0

    def node(self, call: TracedCall, target: graphviz.Digraph) -> str | None:
        if self.count >= self.limit:
            self.left_out += sum(1 for _ in call.walk())
            return None
        self.count += 1
        name = f"c{self.count}"
        kind = _kind_of(call)
        lines = (
            call.op,
            " → ".join(call.path) or "(no kernel ran)",
            f"{call.kernel_kind}, {_time(call.time_ns)}",
        )
        target.node(
            name,
            label=dot_label(lines),
            fillcolor=KIND_FILLS.get(kind, "#fff"),
            color=FAIL_COLOUR if call.error else "#616161",
        )
        return name

    def calls(
        self, calls: Sequence[TracedCall], parent: str | None, target: graphviz.Digraph
    ) -> None:
        previous = None
        for call in calls:
            name = self.node(call, target)
            if name is None:
                continue
            if parent is not None:
                self.edges.append((parent, name, {}))
            elif previous is not None:  # the traced code's own calls, in order
                self.edges.append((previous, name, {"style": "dotted", "arrowhead": "none"}))
            previous = name
            if not call.children:
                continue
            kernel = call.kernel
            if kernel is not None and kernel.alias == "CompositeImplicitAutograd":
                with target.subgraph(name=f"cluster_{name}") as cluster:
                    cluster.attr(
                        label=dot_label([f"{call.op} decomposes into"]),
                        style="dashed",
                        color="#1565c0",
                        fontsize="10",
                    )
                    self.calls(call.children, name, cluster)
            else:
                self.calls(call.children, name, target)


@renders(Trace, "diagram")
def trace_diagram(trace: Trace, max_calls: int = DIAGRAM_CALLS) -> Diagram:
    """The call graph: each call a box (op, path, kernel kind, time), an edge to each call its
    kernels made; a CompositeImplicitAutograd decomposition is drawn inside a dashed cluster.
    At most ``max_calls`` calls are drawn."""
    dot = graphviz.Digraph(
        "trace",
        # calls below the call that made them: siblings side by side, depth downwards (left
        # to right, a deep trace was wider than a notebook)
        graph_attr={"rankdir": "TB", "ordering": "out", "fontname": "Helvetica", "fontsize": "11"},
        node_attr={
            "shape": "box",
            "style": "rounded,filled",
            "fontname": "Helvetica",
            "fontsize": "10",
        },
        edge_attr={"color": "#757575"},
    )
    graph = _CallGraph(dot, max_calls)
    graph.calls(trace.calls, None, dot)
    if graph.left_out:
        dot.node(
            "more",
            label=dot_label([f"{graph.left_out} more calls not drawn (max_calls={max_calls})"]),
            shape="plaintext",
        )
    for tail, head, attrs in graph.edges:
        dot.edge(tail, head, **attrs)
    return Diagram(dot, trace_text(trace))
