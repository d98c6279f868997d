"""Text and HTML of an export (what went where, what was left out) and of its verification
(each step's outcome and time, a failed step's log)."""

from __future__ import annotations

from html import escape

from ..display import format_duration, renders
from ..package import Export, Verification
from .layout import aligned, fitted, html_rows
from .style import FAIL_FILL, STATUS_COLOURS, styled


def _tests_line(export: Export) -> str:
    """``4 opcheck, 2 compare, 1 compile cases``, or that there are none."""
    counted = ", ".join(f"{count} {kind}" for kind, count in export.tests if count)
    return f"{counted} cases" if counted else "only the schema check (no check ran in a cell)"


@renders(Export, "text")
def export_text(export: Export) -> str:
    """The package: its operators, the cells and their files, what was left out, the tests."""
    lines = fitted(
        [f"exported {export.name} {export.version} to {export.directory} "
         f"({export.abi_description})"]
    )
    lines.append("  operators:")
    lines += aligned([(op.schema, f"cell {op.cell}, {op.source}") for op in export.operators],
                     "    ")
    lines.append("  cells:")
    lines += aligned(
        [(cell.label, cell.kind, "; ".join([", ".join(cell.files), *cell.notes]))
         for cell in export.cells],
        "    ",
    )
    if export.left_out:
        lines.append("  left out:")
        lines += aligned([(cell.label, cell.reason) for cell in export.left_out], "    ")
    lines += fitted([f"  tests: {_tests_line(export)} (tests/test_ops.py)"])
    lines += fitted([f"  note: {note}" for note in export.notes])
    lines += fitted(["  prove it: .verify() builds the wheel, installs it where opmagic is not "
                     "importable and runs the tests there"])
    return "\n".join(lines)


@renders(Export, "html")
def export_html(export: Export) -> str:
    """The same as HTML tables."""
    operators = html_rows(
        [(op.schema, f"cell {op.cell}", op.source) for op in export.operators],
        ("operator", "cell", "file"),
    )
    cells = html_rows(
        [(c.label, c.kind, ", ".join(c.files), "; ".join(c.notes)) for c in export.cells],
        ("cell", "kind", "files", "notes"),
    )
    left_out = (
        "<div><b>left out</b>"
        + html_rows([(c.label, c.reason) for c in export.left_out], ("cell", "why"))
        + "</div>"
        if export.left_out
        else ""
    )
    notes = "".join(f'<div class="dim">note: {escape(n)}</div>' for n in export.notes)
    return styled(
        f"<b>exported {escape(export.name)} {escape(export.version)}</b> to "
        f"<code>{escape(str(export.directory))}</code> "
        f'<span class="dim">({escape(export.abi_description)})</span>'
        f"{operators}{cells}{left_out}"
        f"<div>tests: {escape(_tests_line(export))} (tests/test_ops.py)</div>{notes}"
        '<div class="dim">prove it: .verify() builds the wheel, installs it where opmagic is '
        "not importable and runs the tests there</div>"
    )


@renders(Verification, "text")
def verification_text(result: Verification) -> str:
    """A line per step (outcome, time, what it found), a failed step's log below it."""
    lines = fitted([f"{result.name}: {result.summary}"])
    width = max((len(step.name) for step in result.steps), default=0)
    for step in result.steps:
        row = f"  {step.status:<4}  {step.seconds:5.1f} s  {step.name:<{width}}  {step.detail}"
        lines += fitted([row])
        if step.log:  # a log keeps its lines whole: it is the tool's own output
            lines += ["    " + line for line in step.log.splitlines()]
    if result.wheel:
        lines += fitted([f"  wheel: {result.directory / 'dist' / result.wheel}"])
    return "\n".join(lines)


@renders(Verification, "html")
def verification_html(result: Verification) -> str:
    """The steps as a table, statuses coloured, a failed step's log under it."""
    rows = []
    for step in result.steps:
        fill = f' style="background:{FAIL_FILL}"' if step.status == "FAIL" else ""
        rows.append(
            f"<tr{fill}><td style=\"color:{STATUS_COLOURS[step.status]}\">{escape(step.status)}"
            f"</td><td>{format_duration(step.seconds, 2)}</td><td>{escape(step.name)}</td>"
            f"<td>{escape(step.detail)}</td></tr>"
        )
        if step.log:
            rows.append(f'<tr><td colspan="4"><pre>{escape(step.log)}</pre></td></tr>')
    wheel = (
        f'<div class="dim">wheel: {escape(str(result.directory / "dist" / result.wheel))}</div>'
        if result.wheel
        else ""
    )
    return styled(
        f"<b>{escape(result.name)}: {escape(result.summary)}</b><table>{''.join(rows)}</table>"
        f"{wheel}"
    )
