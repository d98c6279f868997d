"""How a diagnosis looks: text that fits the terminal (the ladder, then each finding with its
fix), HTML (the rungs as a ladder, findings with the fix highlighted and the table row), and a
DataFrame of the rungs (``"frame"``)."""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING

from ..display import renders
from ..verify.doctor import Diagnosis, Finding, RungResult
from .compare import format_seconds
from .layout import aligned, fitted, terminal_width
from .style import FAIL_FILL, STATUS_COLOURS, styled

if TYPE_CHECKING:
    import pandas

_MARKS = {"pass": "✓", "fail": "✗", "skip": "·"}
_FIX_FILL = "#e8f5e9"  # the fix's background: what to change stands out


def heading(diagnosis: Diagnosis) -> str:
    """``doctor mylib::f: 2 findings: no-fake, backward-arity (7 rungs pass, ...)``."""
    return f"doctor {diagnosis.op}: {diagnosis.summary}"


def _rung_note(rung: RungResult) -> str:
    """What a rung row says after its status: why, or on how many samples."""
    if rung.detail:
        return rung.detail
    return f"{rung.samples} sample{'s' if rung.samples != 1 else ''}" if rung.samples else ""


@renders(Diagnosis, "text")
def diagnosis_text(diagnosis: Diagnosis, width: int | None = None) -> str:
    """The heading, the ladder (a row per rung: mark, name, status, time, why), then every
    finding: its cause, message, evidence, site and fix (the fix's lines kept whole)."""
    width = width or terminal_width()
    lines = fitted([heading(diagnosis)], width)
    lines += fitted([f"  schema: {diagnosis.schema}"], width)
    lines += fitted([f"  samples: {'; '.join(diagnosis.samples)}"], width)
    title_width = max((len(rung.title) for rung in diagnosis.rungs), default=0)
    rows = [
        [
            f"{_MARKS[rung.status]} {rung.title.ljust(title_width)}  {rung.status:<4}  "
            + (format_seconds(rung.seconds) if rung.status != "skip" else "").rjust(8),
            _rung_note(rung),
        ]
        for rung in diagnosis.rungs
    ]
    lines += aligned(rows, width=width)
    for number, finding in enumerate(diagnosis.findings, 1):
        lines.append("")
        lines += _finding_text(number, finding, width)
    lines += fitted([f"  ladder climbed in {format_seconds(diagnosis.seconds)}"], width)
    return "\n".join(lines)


def _finding_text(number: int, finding: Finding, width: int) -> list[str]:
    """One finding as text lines."""
    lines = fitted([f"{number}. {finding.cause} (rung {finding.rung}): {finding.message}"], width)
    for label, value in (("evidence", finding.evidence), ("site", finding.site)):
        if value:
            lines += fitted([f"   {label}: {line}" for line in value.splitlines()], width)
    if finding.fix:
        lines.append("   fix:")
        lines += [f"       {line}" for line in finding.fix.splitlines()]
    return lines


@renders(Diagnosis, "html")
def diagnosis_html(diagnosis: Diagnosis) -> str:
    """The ladder as a table (failing rungs highlighted), then a box per finding with its
    evidence (the table row or the comparison), its site and its fix highlighted."""
    colour = STATUS_COLOURS["pass" if diagnosis.ok else "FAIL"]
    rows = []
    for rung in diagnosis.rungs:
        fill = f' style="background:{FAIL_FILL}"' if rung.status == "fail" else ""
        status = (
            f'<b style="color:{_colour(rung.status)}">'
            f"{_MARKS[rung.status]} {escape(rung.status)}</b>"
        )
        time = escape(format_seconds(rung.seconds)) if rung.status != "skip" else ""
        rows.append(
            f"<tr{fill}><td>{escape(rung.title)}</td><td>{status}</td><td>{time}</td>"
            f'<td class="dim">{escape(_rung_note(rung))}</td></tr>'
        )
    findings = "".join(_finding_html(n, f) for n, f in enumerate(diagnosis.findings, 1))
    return styled(
        f'<b style="color:{colour}">{escape(heading(diagnosis))}</b>'
        f'<div class="dim">{escape(diagnosis.schema)} · samples: '
        f"{escape('; '.join(diagnosis.samples))}</div>"
        "<table><tr><th>rung</th><th>status</th><th>time</th><th></th></tr>"
        f"{''.join(rows)}</table>{findings}"
        f'<div class="dim">ladder climbed in {escape(format_seconds(diagnosis.seconds))}</div>'
    )


def _colour(status: str) -> str:
    """The colour of a rung's status (``fail`` as checks' ``FAIL``)."""
    return STATUS_COLOURS["FAIL" if status == "fail" else status]


def _finding_html(number: int, finding: Finding) -> str:
    """One finding: cause and message, evidence and site, the fix in a highlighted block."""
    fix = (
        f'<pre style="background:{_FIX_FILL};padding:4px 6px;border-left:3px solid '
        f'{STATUS_COLOURS["pass"]}">{escape(finding.fix)}</pre>'
        if finding.fix
        else ""
    )
    return (
        f'<div style="margin:6px 0;padding:4px 8px;border-left:3px solid '
        f'{STATUS_COLOURS["FAIL"]}">'
        f'<b>{number}. <span style="color:{STATUS_COLOURS["FAIL"]}">{escape(finding.cause)}'
        f'</span></b> <span class="dim">(rung {escape(finding.rung)})</span> '
        f"{escape(finding.message)}"
        f'<div class="dim">evidence: <code>{escape(finding.evidence)}</code></div>'
        f'<div class="dim">site: {escape(finding.site)}</div>{fix}</div>'
    )


@renders(Diagnosis, "frame")
def diagnosis_frame(diagnosis: Diagnosis) -> pandas.DataFrame:
    """A row per rung: status, detail, seconds, samples and the causes it found or met."""
    import pandas as pd

    return pd.DataFrame.from_records(
        [
            {
                "rung": rung.name,
                "title": rung.title,
                "status": rung.status,
                "detail": rung.detail,
                "seconds": rung.seconds,
                "samples": rung.samples,
                "causes": ", ".join(rung.causes),
            }
            for rung in diagnosis.rungs
        ],
        columns=["rung", "title", "status", "detail", "seconds", "samples", "causes"],
    )
