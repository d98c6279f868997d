"""HTML form of a resolution: the step-by-step explanation the explorer shows beside the diagram."""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..dispatch.resolve import Resolution

KIND_COLOURS = {
    "kernel": "#2e7d32",
    "alias": "#1565c0",
    "autograd": "#6a1b9a",
    "fallback": "#ef6c00",
    "fallthrough": "#9e9e9e",
    "ambiguous": "#c62828",
    "missing": "#c62828",
}
_STYLE = "<style>.opmagic .dim{color:#888}</style>"


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
