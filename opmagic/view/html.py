"""HTML forms: the diagram inline, with the table or the step-by-step explanation below it.

Notebook frontends rank text/html above image/svg+xml, so the HTML form embeds the SVG
itself: a table or resolution shows as its diagram whichever form the frontend picks.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import TYPE_CHECKING

from ..dispatch.resolve import Resolution
from ..dispatch.table import DispatchTable, OverloadTables
from ..display import renders
from ..errors import OpmagicError
from .style import FAIL_COLOUR, KIND_COLOURS, styled
from .text import grouped_entries

if TYPE_CHECKING:
    from .graph import Diagram


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


@renders(DispatchTable, "html")
def table_html(table: DispatchTable) -> str:
    """The table's diagram, then its rows (keys served alike merged) in a collapsible section."""
    listing = listing_html(table)
    return _with_diagram(table.diagram(), "the operator's own kernels, per key", listing)


def listing_html(table: DispatchTable, show_all: bool = False) -> str:
    """The table's rows as the diagram groups them: the op's own kernels (every key with
    ``show_all``), keys of one category served alike on one row (all of them in its
    tooltip), the kind coloured; then how many keys are left out. Unstyled: callers wrap
    it with :func:`~opmagic.view.style.styled`."""
    rows = "".join(
        f'<tr><td title="{escape(", ".join(e.key for e in g.entries), quote=True)}">'
        f"{escape(g.keys_label)}</td><td>{escape(g.category)}</td>"
        f'<td title="{escape(g.first.kind_text, quote=True)}" '
        f'style="color:{KIND_COLOURS.get(g.first.kind, "#000")}">{escape(g.kind_label)}</td>'
        f"<td>{escape(g.first.source)}</td></tr>"
        for g in grouped_entries(table, show_all)
    )
    left_out = sum(1 for e in table.entries if not e.is_own)
    note = (
        f'<div class="dim">{left_out} more keys have only a backend fallback, a fallthrough or '
        "no kernel.</div>"
        if left_out and not show_all
        else ""
    )
    return (
        "<table><tr><th>keys (highest priority first)</th><th>category</th><th>kind</th>"
        f"<th>source</th></tr>{rows}</table>{note}"
    )


@renders(Resolution, "html")
def resolution_html(resolution: Resolution) -> str:
    """The call's path diagram, then the step-by-step explanation in a collapsible section."""
    return _with_diagram(resolution.diagram(), "step by step", steps_html(resolution))


@renders(OverloadTables, "html")
def overload_tables_html(tables: OverloadTables) -> str:
    """Every overload's table, one after the other."""
    return "".join(table_html(table) for table in tables)


def html_rows(rows: Sequence[Sequence[str]], header: Sequence[str] | None = None) -> str:
    """An HTML table of text cells, with an optional header row."""
    head = "<tr>" + "".join(f"<th>{escape(h)}</th>" for h in header) + "</tr>" if header else ""
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in row) + "</tr>" for row in rows
    )
    return f"<table>{head}{body}</table>"


def _with_diagram(diagram: Diagram, summary: str, details: str) -> str:
    """The diagram's SVG inline, ``details`` folded below it (alone when no Graphviz draws)."""
    try:
        picture = diagram.svg()
    except OpmagicError as exc:  # no Graphviz at all: the details are the display
        return styled(f'<pre class="dim">(no diagram: {escape(str(exc))})</pre>{details}')
    return styled(f"{picture}<details><summary>{escape(summary)}</summary>{details}</details>")
