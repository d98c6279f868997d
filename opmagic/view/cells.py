"""Text and HTML for what cells produce: custom-op summaries, check tables, session listings."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from ..cells.custom_op import CustomOpResult
from ..cells.session import SessionReport
from ..dispatch.table import DispatchTable
from ..display import renders
from ..verify.checks import CheckReport
from .layout import aligned, fitted, html_rows, joined
from .style import KIND_COLOURS, STATUS_COLOURS, styled
from .table import grouped_entries, table_html


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
    """The session listing as HTML, a section per cell."""
    if not report.cells:
        return styled("no cell has registered anything yet")
    sections = []
    for cell in report.cells:
        notes = "".join(f'<div class="dim">note: {escape(n)}</div>' for n in cell.notes)
        sections.append(
            f"<div><b>cell {escape(cell.label)}</b>"
            f"{html_rows(cell.items, ('registration', 'where'))}{notes}</div>"
        )
    colour = KIND_COLOURS["kernel"]
    return styled(f'<b style="color:{colour}">opmagic session</b>{"".join(sections)}')
