"""Text and HTML for what cells produce: custom-op summaries, check tables, session listings."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import TYPE_CHECKING

from .html import KIND_COLOURS, table_html
from .text import grouped_entries

if TYPE_CHECKING:
    from ..cells.checks import CheckReport
    from ..cells.custom_op import CustomOpResult
    from ..cells.session import SessionReport
    from ..dispatch.table import DispatchTable

_STYLE = (
    "<style>.opmagic-cell td,.opmagic-cell th{padding:1px 8px;text-align:left;"
    "vertical-align:top;font-family:monospace;font-size:12px}"
    ".opmagic-cell .dim{color:#888}</style>"
)
_OWN_KINDS = ("kernel", "alias", "autograd", "ambiguous")
_STATUS_COLOURS = {"pass": "#2e7d32", "FAIL": "#c62828", "skip": "#9e9e9e"}


def aligned(rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    """Rows of cells as lines with every column but the last padded to its widest cell."""
    if not rows:
        return []
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return [
        indent + "  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)), row[-1]])
        for row in rows
    ]


def _html_rows(rows: Sequence[Sequence[str]], header: Sequence[str] | None = None) -> str:
    """An HTML table of text cells, with an optional header row."""
    head = "<tr>" + "".join(f"<th>{escape(h)}</th>" for h in header) + "</tr>" if header else ""
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in row) + "</tr>" for row in rows
    )
    return f"<table>{head}{body}</table>"


def custom_op_text(result: CustomOpResult) -> str:
    """Schema, where it is bound, the kernels the cell registered, its dispatch table, checks."""
    call = f"  call it as {result.function}(...) or torch.ops.{result.dotted}(...)"
    lines = [result.schema, call]
    lines += [f"  note: {note}" for note in result.notes]
    lines.append("  registered by the cell:")
    lines += aligned([(k.key, k.role, k.function, k.where) for k in result.kernels], "    ")
    lines.append("  dispatch table (keys the operator's own kernels serve):")
    lines += aligned(own_kernel_rows(result.table), "    ")
    others = sum(1 for e in result.table.entries if e.has_kernel) - sum(
        1 for e in result.table.entries if e.kind in _OWN_KINDS
    )
    lines.append(f"    ({others} more keys run backend fallbacks; print(result.table) for all)")
    if result.checks is not None:
        lines.append(check_text(result.checks))
    return "\n".join(lines)


def own_kernel_rows(table: DispatchTable) -> list[tuple[str, str, str]]:
    """(keys, kind, source) for the runs of keys served by the operator's own registrations."""
    return [
        (group.keys_label, group.kind_label, group.first.source)
        for group in grouped_entries(table)
        if group.first.kind in _OWN_KINDS
    ]


def custom_op_html(result: CustomOpResult) -> str:
    """The summary as HTML; the dispatch table folds away under a <details>."""
    rows = [(k.key, k.role, k.function, k.where) for k in result.kernels]
    notes = "".join(f'<div class="dim">note: {escape(n)}</div>' for n in result.notes)
    checks = check_html(result.checks) if result.checks is not None else ""
    return (
        f'{_STYLE}<div class="opmagic-cell"><b>{escape(result.schema)}</b>'
        f'<div class="dim">call it as {escape(result.function)}(...) or '
        f"torch.ops.{escape(result.dotted)}(...)</div>{notes}"
        + _html_rows(rows, ("key", "registers", "function", "where"))
        + f"<details><summary>dispatch table</summary>{table_html(result.table)}</details>"
        + f"{checks}</div>"
    )


def check_text(report: CheckReport) -> str:
    """One line per check: name, pass/FAIL/skip and the first line of any error."""
    lines = [f"  checks ({report.summary}) with {report.inputs}:"]
    lines += aligned([(r.name, r.status, r.detail) for r in report.rows], "    ")
    return "\n".join(lines)


def check_html(report: CheckReport) -> str:
    """The check table as HTML, statuses coloured."""
    rows = "".join(
        f"<tr><td>{escape(r.name)}</td>"
        f'<td style="color:{_STATUS_COLOURS[r.status]}">{escape(r.status)}</td>'
        f"<td>{escape(r.detail)}</td></tr>"
        for r in report.rows
    )
    return (
        f'{_STYLE}<div class="opmagic-cell"><b>checks ({escape(report.summary)})</b> '
        f'<span class="dim">with {escape(report.inputs)}</span><table>{rows}</table></div>'
    )


def session_text(report: SessionReport) -> str:
    """Per cell, what it registered and where."""
    if not report.cells:
        return "opmagic session: no cell has registered anything yet"
    lines = ["opmagic session: what each cell registered"]
    for cell in report.cells:
        lines.append(f"  cell {cell.label}")
        lines += aligned([(what, where) for what, where in cell.items], "    ")
        lines += [f"    note: {note}" for note in cell.notes]
    return "\n".join(lines)


def session_html(report: SessionReport) -> str:
    """The session listing as HTML, a section per cell."""
    if not report.cells:
        return f"{_STYLE}<div class='opmagic-cell'>no cell has registered anything yet</div>"
    sections = []
    for cell in report.cells:
        notes = "".join(f'<div class="dim">note: {escape(n)}</div>' for n in cell.notes)
        sections.append(
            f"<div><b>cell {escape(cell.label)}</b>"
            f"{_html_rows(cell.items, ('registration', 'where'))}{notes}</div>"
        )
    colour = KIND_COLOURS["kernel"]
    return (
        f'{_STYLE}<div class="opmagic-cell"><b style="color:{colour}">opmagic session</b>'
        f"{''.join(sections)}</div>"
    )
