"""HTML forms of dispatch tables and resolutions (notebook fallbacks when no SVG is wanted)."""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING

from .text import grouped_entries

if TYPE_CHECKING:
    from ..dispatch.resolve import Resolution
    from ..dispatch.table import DispatchTable

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
    "<style>.opmagic td,.opmagic th{padding:2px 8px;text-align:left;vertical-align:top;"
    "font-family:monospace;font-size:12px}.opmagic .cat{font-weight:bold;background:#f3f3f3}"
    ".opmagic .dim{color:#888}</style>"
)


def table_html(table: DispatchTable) -> str:
    """The table as an HTML table; hover a key for what it is for."""
    rows = []
    for group in grouped_entries(table):
        first = group.first
        rows.append(
            f'<tr><td title="{escape(first.explanation, quote=True)}">'
            f"{escape(group.keys_label)}</td>"
            f"<td>{escape(group.category)}</td>"
            f'<td title="{escape(first.kind_text, quote=True)}" '
            f'style="color:{KIND_COLOURS.get(first.kind, "#000")}">{escape(group.kind_label)}</td>'
            f"<td>{escape(first.source)}</td></tr>"
        )
    missing = sum(1 for e in table.entries if e.kind == "missing")
    note = (
        f'<tr><td class="dim" colspan="4">{missing} other keys have no kernel</td></tr>'
        if missing
        else ""
    )
    return (
        f'{_STYLE}<div class="opmagic"><b>{escape(table.schema or table.op)}</b>'
        "<table><tr><th>key (highest priority first)</th><th>category</th><th>kind</th>"
        f"<th>source</th></tr>{''.join(rows)}{note}</table></div>"
    )


def resolution_html(resolution: Resolution) -> str:
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
