"""How a resolution looks: the call's path as numbered steps (text), its path diagram over the
step-by-step explanation (HTML), and the diagram itself: the keys the call's keysets had, the
path as numbered bold edges, the keys it passed over dimmed, or the whole table around them.

Everything here formats what the resolution holds, its operator's table included: an old
resolution draws the same after its operator is redefined or removed.
"""

from __future__ import annotations

from collections.abc import Iterable
from html import escape
from typing import TYPE_CHECKING

from ..dispatch.keys import key_info, runtime_keys
from ..dispatch.resolve import Resolution
from ..display import renders
from .diagram import Diagram, result_bundle, with_diagram, wrapped
from .keygraph import TITLE_WRAP, KeyGraph, column_nodes, pins_of
from .layout import fitted
from .style import FAIL_COLOUR, KIND_COLOURS, styled

if TYPE_CHECKING:
    from ..dispatch.table import TableEntry


@renders(Resolution, "text")
def resolution_text(resolution: Resolution) -> str:
    """The resolved path as numbered steps with origins, skipped keys and what runs."""
    lines = [resolution.schema or resolution.op]
    if resolution.inputs:
        lines.append(
            "  inputs: " + "; ".join(f"{i.name}: {i.description}" for i in resolution.inputs)
        )
    if resolution.context:
        lines.append("  context: " + "; ".join(resolution.context))
    lines.append("  path: " + (" -> ".join(resolution.path) or "(none)"))
    for number, step in enumerate(resolution.steps, 1):
        assumed = "  [assumes the Python handler calls the op again]" if step.assumed else ""
        lines.append(f"  {number}. {step.key}  ({step.entry.kind_text}){assumed}")
        lines.append(f"       from: {step.origin}")
        for skip in step.skipped:
            lines.append(f"       skipped {skip.key}: {skip.detail}")
        marker = {"error": "FAILS", "ends": "ends", "python": "hands over to Python"}.get(
            step.action, "then"
        )
        lines.append(f"       {marker}: {step.note}")
    if resolution.error:
        lines.append(f"  error: {resolution.error}")
    return "\n".join(fitted(lines))


def answer_line(resolution: Resolution) -> str:
    """The answer in one line: the path, then what its last kernel does, or why it fails."""
    path = " → ".join(resolution.path) or "(no kernel runs)"
    if resolution.error:
        return f"{path}  ✗ fails: {resolution.error}"
    last = resolution.steps[-1] if resolution.steps else None
    return f"{path}  ·  {last.key}: {last.note}" if last is not None else path


def steps_html(resolution: Resolution) -> str:
    """The path as an ordered list of steps, skipped keys dimmed, failure in red."""
    items = []
    for step in resolution.steps:
        skipped = "".join(
            f'<div class="dim">skipped {escape(s.key)}: {escape(s.detail)}</div>'
            for s in step.skipped
        )
        colour = FAIL_COLOUR if step.action == "error" else "#000"
        items.append(
            f"<li><b>{escape(step.key)}</b> "
            f'<span style="color:{KIND_COLOURS.get(step.entry.kind, "#000")}">'
            f"({escape(step.entry.kind_text)})</span>"
            f'<div class="dim">from: {escape(step.origin)}</div>{skipped}'
            f'<div style="color:{colour}">{escape(step.note)}</div></li>'
        )
    context = (
        f'<div class="dim">context: {escape("; ".join(resolution.context))}</div>'
        if resolution.context
        else ""
    )
    error = (
        f'<div style="color:{FAIL_COLOUR}"><b>error:</b> {escape(resolution.error)}</div>'
        if resolution.error
        else ""
    )
    path = " &rarr; ".join(escape(k) for k in resolution.path) or "(none)"
    return styled(
        f"<b>{escape(resolution.schema or resolution.op)}</b>"
        f"{context}<div>path: {path}</div><ol>{''.join(items)}</ol>{error}"
    )


@renders(Resolution, "html")
def resolution_html(resolution: Resolution) -> str:
    """The call's path diagram, then the step-by-step explanation in a collapsible section."""
    return with_diagram(resolution_diagram(resolution), "step by step", steps_html(resolution))


renders(Resolution, "mimebundle")(result_bundle)  # its diagram (SVG) plus its text


@renders(Resolution, "diagram")
def resolution_diagram(resolution: Resolution, show_all: bool = False) -> Diagram:
    """A call's path through the dispatcher as a diagram.

    By default only the keys the call's keysets had are drawn: the path (numbered bold
    edges) and the keys it passed over (dimmed, with the reason). ``show_all`` draws the
    whole dispatch table around them.
    """
    pinned = pins_of(resolution.steps)
    entries = _resolution_entries(resolution, show_all)
    shown = [e for e in entries if show_all or e.key in pinned]
    hidden = len(runtime_keys()) + 1 - len(shown)  # every runtime key, and Undefined
    title = wrapped([resolution.schema or resolution.op], TITLE_WRAP)
    title += wrapped([f"path: {_path_words(resolution)}"], TITLE_WRAP)
    if hidden:
        title.append(f"({hidden} keys the call never looked at are not drawn)")
    builder = KeyGraph(title)
    ids = builder.add_column(column_nodes(shown, pinned), compact=True)
    builder.add_path(resolution, ids)
    builder.add_legend()
    return Diagram(builder.graph, resolution_text(resolution))


def _path_words(resolution: Resolution) -> str:
    """``AutogradCPU → CPU``, with ``✗ fails`` when dispatch fails."""
    path = " → ".join(resolution.path) or "(none)"
    return f"{path}  ✗ fails" if resolution.error else path


def _resolution_entries(resolution: Resolution, show_all: bool) -> list[TableEntry]:
    """Entries in priority order: the whole table for ``show_all``, else the call's keys."""
    by_key: dict[str, TableEntry] = {}
    for step in resolution.steps:
        by_key.setdefault(step.key, step.entry)
    if show_all:
        return [by_key.get(e.key, e) for e in resolution.table.entries]
    for skip in (s for step in resolution.steps for s in step.skipped):
        by_key.setdefault(skip.key, resolution.table[skip.key])
    order = {e.key: i for i, e in enumerate(_priority_entries(by_key.values()))}
    return sorted(by_key.values(), key=lambda e: order[e.key])


def _priority_entries(entries: Iterable[TableEntry]) -> list[TableEntry]:
    """Entries sorted by the dispatcher's priority (``Undefined`` last)."""
    return sorted(entries, key=lambda e: (e.key == "Undefined", key_info(e.key).priority))
