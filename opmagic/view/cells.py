"""Text and HTML for what cells produce: custom-op summaries, check tables, session listings."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from ..cells.custom_op import CustomOpResult
from ..cells.session import CellReport, SessionReport
from ..dispatch.table import DispatchTable
from ..display import renders
from ..verify.checks import CheckReport
from .layout import aligned, fitted, html_rows, joined
from .style import KIND_COLOURS, STATUS_COLOURS, styled
from .table import grouped_entries, table_html

SESSION_CELLS = 8  # cells %opmagic session shows in a notebook before folding the others


@renders(CustomOpResult, "text")
def custom_op_text(result: CustomOpResult, details: Sequence[str] = ()) -> str:
    """Schema, where it is bound, the kernels the cell registered, its dispatch table, checks;
    ``details``: lines a more specific summary (``%%triton_op``'s) adds after the notes."""
    call = f"  call it as {result.function}(...) or torch.ops.{result.dotted}(...)"
    lines = fitted([result.schema, call, *(f"  note: {note}" for note in result.notes)])
    lines += details
    lines.append("  registered by the cell:")
    lines += aligned([(k.key, k.role, joined(k.function, k.where)) for k in result.kernels], "    ")
    lines.append("  dispatch table (keys the operator's own kernels serve):")
    lines += aligned(
        [(keys, joined(kind, source)) for keys, kind, source in own_kernel_rows(result.table)],
        "    ",
    )
    others = sum(1 for e in result.table.entries if e.has_kernel and not e.is_own)
    every_key = f"print(opmagic.dispatch_table({result.function}).diagram(show_all=True))"
    lines += fitted([f"    ({others} more keys run backend fallbacks; every key: {every_key})"])
    if isinstance(result.checks, CheckReport):
        lines.append(check_text(result.checks))
    return "\n".join(lines)


def own_kernel_rows(table: DispatchTable) -> list[tuple[str, str, str]]:
    """(keys, kind, source) for the runs of keys served by the operator's own registrations."""
    return [
        (group.keys_label, group.kind_label, group.first.source) for group in grouped_entries(table)
    ]


@renders(CustomOpResult, "html")
def custom_op_html(result: CustomOpResult, details: str = "") -> str:
    """The summary as HTML; the dispatch table folds away under a <details>. ``details``:
    HTML a more specific summary adds after the notes."""
    rows = [(k.key, k.role, k.function, k.where) for k in result.kernels]
    notes = "".join(f'<div class="dim">note: {escape(n)}</div>' for n in result.notes)
    checks = check_html(result.checks) if isinstance(result.checks, CheckReport) else ""
    return styled(
        f"<b>{escape(result.schema)}</b>"
        f'<div class="dim">call it as {escape(result.function)}(...) or '
        f"torch.ops.{escape(result.dotted)}(...)</div>{notes}{details}"
        + html_rows(rows, ("key", "registers", "function", "where"))
        + f"<details><summary>dispatch table</summary>{table_html(result.table)}</details>"
        + checks
    )


@renders(CheckReport, "text")
def check_text(report: CheckReport) -> str:
    """One line per check: name, pass/FAIL/skip and the first line of any error."""
    lines = fitted([f"  checks ({report.summary}) with {report.inputs}:"])
    lines += aligned([(r.name, r.status, r.detail) for r in report.rows], "    ")
    return "\n".join(lines)


@renders(CheckReport, "html")
def check_html(report: CheckReport) -> str:
    """The check table as HTML, statuses coloured."""
    rows = "".join(
        f"<tr><td>{escape(r.name)}</td>"
        f'<td style="color:{STATUS_COLOURS[r.status]}">{escape(r.status)}</td>'
        f"<td>{escape(r.detail)}</td></tr>"
        for r in report.rows
    )
    return styled(
        f"<b>checks ({escape(report.summary)})</b> "
        f'<span class="dim">with {escape(report.inputs)}</span><table>{rows}</table>'
    )


@renders(SessionReport, "text")
def session_text(report: SessionReport) -> str:
    """Per cell, what it registered and where."""
    if not report.cells:
        return "opmagic session: no cell has registered anything yet"
    lines = ["opmagic session: what each cell registered"]
    for cell in report.cells:
        lines.append(f"  cell {cell.label}")
        lines += aligned([(what, where) for what, where in cell.items], "    ")
        lines += fitted([f"    note: {note}" for note in cell.notes])
    return "\n".join(lines)


@renders(SessionReport, "html")
def session_html(report: SessionReport) -> str:
    """The session listing as one table, a cell's rows under its label (notes dimmed); the
    cells after the first :data:`SESSION_CELLS` fold away below them."""
    if not report.cells:
        return styled("No cell has registered anything yet.")
    colour = KIND_COLOURS["kernel"]
    things = sum(len(cell.items) for cell in report.cells)
    cells = "cell" if len(report.cells) == 1 else "cells"
    head = (
        f'<b style="color:{colour}">opmagic session</b>: {len(report.cells)} {cells} '
        f"{'holds' if len(report.cells) == 1 else 'hold'} {things} registration"
        f"{'' if things == 1 else 's'}"
    )
    shown, folded = report.cells[:SESSION_CELLS], report.cells[SESSION_CELLS:]
    body = _session_table(shown)
    if folded:
        body += (
            f"<details><summary>{len(folded)} more cells (cells {escape(folded[0].label)} to "
            f"{escape(folded[-1].label)})</summary>{_session_table(folded)}</details>"
        )
    return styled(head + body)


def _session_table(cells: Sequence[CellReport]) -> str:
    """Rows of (cell, registration, where), a cell's label on its first row, its notes after."""
    rows = []
    for cell in cells:
        entries = [*cell.items, *((f"note: {note}", None) for note in cell.notes)]
        for number, (what, where) in enumerate(entries):
            label = escape(f"cell\u00a0{cell.label}") if number == 0 else ""
            shown = (
                f"<td>{escape(what)}</td><td>{escape(where)}</td>"
                if where is not None
                else f'<td colspan="2" class="dim">{escape(what)}</td>'
            )
            rows.append(f"<tr><td>{label}</td>{shown}</tr>")
    head = "<tr><th>cell</th><th>registration</th><th>where</th></tr>"
    return f"<table>{head}{''.join(rows)}</table>"
