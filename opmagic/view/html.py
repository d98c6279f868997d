"""HTML forms: the diagram inline, with the table or the step-by-step explanation below it.

Notebook frontends rank text/html above image/svg+xml, so the HTML form embeds the SVG
itself: a table or resolution shows as its diagram whichever form the frontend picks.
"""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING

from ..errors import OpmagicError
from .text import grouped_entries

if TYPE_CHECKING:
    from ..dispatch.resolve import Resolution
    from ..dispatch.table import DispatchTable
    from .graph import Diagram

KIND_COLOURS = {
    "kernel": "#2e7d32",
    "alias": "#1565c0",
    "autograd": "#6a1b9a",
    "fallback": "#ef6c00",
    "fallthrough": "#9e9e9e",
    "ambiguous": "#c62828",
    "missing": "#c62828",
}
_STYLE = (
    "<style>.opmagic .dim{color:#888}.opmagic td,.opmagic th{padding:1px 8px;"
    "text-align:left;font-family:monospace;font-size:12px}</style>"
)


def steps_html(resolution: Resolution) -> str:
    """The path as an ordered list of steps, skipped keys dimmed, failure in red."""
    items = []
    for step in resolution.steps:
        skipped = "".join(
            f'<div class="dim">skipped {escape(s.key)}: {escape(s.detail)}</div>'
            for s in step.skipped
        )
        colour = "#c62828" if step.action == "error" else "#000"
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
        f'<div style="color:#c62828"><b>error:</b> {escape(resolution.error)}</div>'
        if resolution.error
        else ""
    )
    path = " &rarr; ".join(escape(k) for k in resolution.path) or "(none)"
    return (
        f'{_STYLE}<div class="opmagic"><b>{escape(resolution.schema or resolution.op)}</b>'
        f"{context}<div>path: {path}</div><ol>{''.join(items)}</ol>{error}</div>"
    )


def table_html(table: DispatchTable) -> str:
    """The table's diagram, then its rows (keys served alike merged) in a collapsible section."""
    rows = "".join(
        f'<tr><td title="{escape(g.first.explanation, quote=True)}">{escape(g.keys_label)}</td>'
        f"<td>{escape(g.category)}</td>"
        f'<td title="{escape(g.first.kind_text, quote=True)}" '
        f'style="color:{KIND_COLOURS.get(g.first.kind, "#000")}">{escape(g.kind_label)}</td>'
        f"<td>{escape(g.first.source)}</td></tr>"
        for g in grouped_entries(table)
    )
    listing = (
        "<table><tr><th>key (highest priority first)</th><th>category</th><th>kind</th>"
        f"<th>source</th></tr>{rows}</table>"
    )
    return _with_diagram(table.diagram(), "every key with a kernel", listing)


def resolution_html(resolution: Resolution) -> str:
    """The call's path diagram, then the step-by-step explanation in a collapsible section."""
    return _with_diagram(resolution.diagram(), "step by step", steps_html(resolution))


def _with_diagram(diagram: Diagram, summary: str, details: str) -> str:
    try:
        picture = diagram.svg()
    except OpmagicError as exc:  # no Graphviz at all: the details are the display
        picture = f'<pre class="dim">(no diagram: {escape(str(exc))})</pre>'
        return f'{_STYLE}<div class="opmagic">{picture}{details}</div>'
    return (
        f'{_STYLE}<div class="opmagic">{picture}'
        f"<details><summary>{escape(summary)}</summary>{details}</details></div>"
    )
