"""How a dispatcher diff looks: text that fits the terminal, HTML grouped by namespace (aten
overrides first: they change what every model runs), a DataFrame, one operator's table before
and after side by side, and the calls a diff affects. Everything here formats facts that
``opmagic.dispatch.diff`` computed when the diff was made.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape
from typing import TYPE_CHECKING

from ..dispatch.diff import (
    AffectedCalls,
    Change,
    DispatchDiff,
    DispatchSnapshot,
    OpTableDiff,
    TableRow,
)
from ..dispatch.diff.labels import entry_text
from ..dispatch.diff.result import FRAME_COLUMNS
from ..display import format_duration, renders
from .layout import aligned, fitted, html_rows, more_note
from .style import styled

if TYPE_CHECKING:
    import pandas

SHOWN = 40  # changes a section shows as text before it folds the rest
NAMED_KEYS = 3  # keys a grouped row names before "+ N more keys"
ARROW = " → "
SECTIONS = (
    ("operators", "operators"),
    ("kernels", "kernels (per operator and key)"),
    ("fallbacks", "backend fallbacks (every operator)"),
    ("routes", "torch._native override routes"),
)


@renders(DispatchSnapshot, "text")
def snapshot_text(snapshot: DispatchSnapshot) -> str:
    """One line: what the snapshot holds, and how to compare with it."""
    return (
        f"dispatcher snapshot: {len(snapshot.dumps):,} operators, "
        f"{len(snapshot.fallbacks)} backend fallbacks, {len(snapshot.routes)} torch._native "
        f"routes ({format_duration(snapshot.seconds)}); compare with opmagic.diff(snapshot)"
    )


# ------------------------------------------------------------------ the whole diff as text


def summary(diff: DispatchDiff) -> str:
    """``dispatcher diff: 1 operator added, 4 kernels (1 aten override), ...``."""
    if not len(diff):
        return "dispatcher diff: nothing changed"
    parts = []
    for changes, one, many in (
        (diff.operators, "operator", "operators"),
        (diff.kernels, "kernel", "kernels"),
        (diff.fallbacks, "fallback", "fallbacks"),
        (diff.routes, "torch._native route", "torch._native routes"),
        (diff.derived, "derived entry", "derived entries"),
    ):
        if changes:
            parts.append(_count(len(changes), one, many))
    overrides = len(diff.aten_overrides)
    note = f"; {_count(overrides, 'aten override', 'aten overrides')}" if overrides else ""
    return f"dispatcher diff: {', '.join(parts)}{note} ({format_duration(diff.seconds)})"


@renders(DispatchDiff, "text")
def diff_text(diff: DispatchDiff, limit: int | None = SHOWN, show_all: str = "d.frame()") -> str:
    """The summary, the aten overrides, then each section: the user's changes, a change per
    line, folded after ``limit`` lines (``None``: all); torch's own registrations (made by
    lazily imported torch modules) as a count."""
    lines = fitted([summary(diff)])
    overrides = diff.aten_overrides
    if overrides:
        lines.append("aten overrides (they change what every model runs):")
        lines += _rows(overrides, limit, show_all)
    for attribute, title in SECTIONS:
        shown = [c for c in getattr(diff, attribute) if not c.by_torch and not c.overrides_aten]
        if shown:
            lines.append(f"{title}:")
            lines += _rows(shown, limit, show_all)
    derived = _derived_groups([c for c in diff.derived if not c.by_torch])
    if derived:
        lines.append("derived entries (served from a registration at another key):")
        rows = [(op, _keys(keys), text) for op, keys, text in derived]
        lines += _folded(rows, limit, "derived groups", show_all)
    by_torch = [c for c in diff.changes if c.by_torch]
    if by_torch:
        ops = len({c.op for c in by_torch})
        lines += fitted(
            [
                f"registered by torch itself (torch modules imported since): "
                f"{_count(len(by_torch), 'change', 'changes')} on "
                f"{_count(ops, 'operator', 'operators')}; all of "
                f"them: {show_all}"
            ]
        )
    return "\n".join(lines)


def _rows(changes: Sequence[Change], limit: int | None, show_all: str) -> list[str]:
    """A line per change (its cells aligned), folded after ``limit`` lines."""
    rows = [
        (change.op or change.key, _key_cell(change), change.change, _cell(change))
        for change in changes
    ]
    return _folded(rows, limit, "changes", show_all)


def _folded(
    rows: Sequence[Sequence[str]], limit: int | None, what: str, show_all: str
) -> list[str]:
    """The first ``limit`` rows aligned (all of them for ``None``), then how many more."""
    shown = rows if limit is None else rows[:limit]
    return aligned(shown) + more_note(len(rows), len(shown), what, show_all)


def _key_cell(change: Change) -> str:
    """The key of a kernel or route; a fallback's row already names it."""
    return "" if change.what in ("operator", "fallback") else change.key


def _cell(change: Change) -> str:
    """What the change did, in one cell: the new thing, what it hides or replaces; an
    operator's schema with where it was defined."""
    if change.what == "operator":
        return f"{change.after or change.before} · {change.site}"
    if change.change == "added":
        hides = f" (over {change.hides})" if change.hides else ""
        return f"{change.after}{hides}"
    if change.change == "replaced":
        return f"{change.after}, was {change.before}"
    now = f"; now {change.after}" if change.after else ""
    return f"{_removed(change)}{now}"


def _removed(change: Change) -> str:
    """What went: the kernel that was removed (named by its site) or what was there."""
    if change.what == "kernel" and change.site not in change.before:
        return f"{change.kind} · {change.site}"
    return change.before


def _derived_groups(changes: Sequence[Change]) -> list[tuple[str, list[str], str]]:
    """Derived changes of one operator now served alike for the same cause, as one row
    ``(op, keys, text)``; what served them before is named when it was the same for all, else
    its kinds are."""
    groups: dict[tuple[str, str, str], tuple[list[str], list[str]]] = {}
    for change in changes:
        keys, befores = groups.setdefault((change.op, change.after, change.because), ([], []))
        keys.append(change.key)
        befores.append(change.before)
    rows = []
    for (op, after, because), (keys, befores) in groups.items():
        kinds = dict.fromkeys(before.partition(" · ")[0] for before in befores)
        before = befores[0] if len(set(befores)) == 1 else " or ".join(kinds)
        rows.append((op, keys, f"{before}{ARROW}{after} (after {because})"))
    return rows


def _keys(keys: Sequence[str]) -> str:
    """``CPU, CUDA, Meta + 57 more keys``."""
    if len(keys) <= NAMED_KEYS:
        return ", ".join(keys)
    return f"{', '.join(keys[:NAMED_KEYS])} + {len(keys) - NAMED_KEYS} more keys"


def _count(number: int, one: str, many: str) -> str:
    """``1 kernel``, ``3 kernels``."""
    return f"{number:,} {one if number == 1 else many}"


# ------------------------------------------------------------------ HTML


@renders(DispatchDiff, "html")
def diff_html(diff: DispatchDiff) -> str:
    """The summary, the aten overrides, then the changes grouped by namespace (aten first);
    fallbacks, derived entries and torch's own registrations folded below."""
    parts = [f'<div class="headline">{escape(summary(diff))}</div>']
    overrides = diff.aten_overrides
    if overrides:
        parts.append(
            "<b>aten overrides</b> (they change what every model runs)" + _changes_html(overrides)
        )
    own = [
        c
        for c in (*diff.operators, *diff.kernels, *diff.routes)
        if not c.by_torch and not c.overrides_aten
    ]
    for namespace in _namespaces(own):
        parts.append(
            f"<b>{escape(namespace)}</b>"
            + _changes_html([c for c in own if c.namespace == namespace])
        )
    folded = (
        ("backend fallbacks", [c for c in diff.fallbacks if not c.by_torch]),
        (
            "derived entries (served from a registration at another key)",
            [c for c in diff.derived if not c.by_torch],
        ),
        ("registered by torch itself", [c for c in diff.changes if c.by_torch]),
    )
    for title, changes in folded:
        if changes:
            parts.append(
                f"<details><summary>{escape(title)} ({len(changes):,})</summary>"
                f"{_changes_html(changes)}</details>"
            )
    return styled("".join(parts))


def _namespaces(changes: Iterable[Change]) -> list[str]:
    """The namespaces of some changes, aten first, then alphabetically."""
    return sorted({c.namespace for c in changes}, key=lambda n: (n != "aten", n))


def _changes_html(changes: Sequence[Change]) -> str:
    rows = [
        (c.op, c.key, c.change, c.before, c.after, c.site, c.hides or c.because) for c in changes
    ]
    return html_rows(rows, ["op", "key", "change", "before", "after", "site", "hides / after"])


# ------------------------------------------------------------------ DataFrames


@renders(DispatchDiff, "frame")
def diff_frame(diff: DispatchDiff) -> pandas.DataFrame:
    """A row per change, in the diff's order (operators, kernels, fallbacks, routes, derived)."""
    import pandas as pd

    rows = [[getattr(c, column) for column in FRAME_COLUMNS] + [c.by_torch] for c in diff]
    return pd.DataFrame(rows, columns=[*FRAME_COLUMNS, "by_torch"])


# ------------------------------------------------------------------ one operator, side by side


@renders(OpTableDiff, "text")
def table_diff_text(table: OpTableDiff) -> str:
    """The operator's schema, then its keys before and after side by side (keys served alike
    on one row): first the keys served differently now, then the ones that kept a kernel of
    the operator's own; then its registrations that changed."""
    lines = fitted([_schemas(table)])
    changed = _row_groups(row for row in table.rows if row.changed)
    kept = _row_groups(row for row in table.rows if not row.changed)
    rows: list[tuple[str, str, str]] = [("key", "before", "after")]
    rows += [(_keys(keys), before, after) for keys, before, after in changed]
    rows += [(_keys(keys), before, "same") for keys, before, _ in kept]
    lines += aligned(rows)
    if table.registrations:
        lines.append("registrations that changed:")
        lines += aligned(
            [(c.key or "(definition)", c.change, _cell(c)) for c in table.registrations]
        )
    return "\n".join(lines)


def _row_groups(rows: Iterable[TableRow]) -> list[tuple[list[str], str, str]]:
    """Rows served alike before and after, as ``(keys, before, after)`` in priority order."""
    groups: dict[tuple[str, str], list[str]] = {}
    for row in rows:
        groups.setdefault((entry_text(row.before), entry_text(row.after)), []).append(row.key)
    return [(keys, before, after) for (before, after), keys in groups.items()]


def _schemas(table: OpTableDiff) -> str:
    if table.schema_before == table.schema_after:
        return table.schema_after or table.op
    return f"{table.schema_before or '(not defined)'}{ARROW}{table.schema_after or '(not defined)'}"


@renders(OpTableDiff, "html")
def table_diff_html(table: OpTableDiff) -> str:
    """The rows as an HTML table, the changed keys in bold."""
    body = "".join(
        f"<tr><td>{'<b>' if row.changed else ''}{escape(row.key)}"
        f"{'</b>' if row.changed else ''}</td><td>{escape(entry_text(row.before))}</td>"
        f"<td>{escape(entry_text(row.after) if row.changed else 'same')}</td></tr>"
        for row in table.rows
    )
    registrations = _changes_html(table.registrations) if table.registrations else ""
    return styled(
        f"<b>{escape(_schemas(table))}</b><table><tr><th>key</th><th>before</th>"
        f"<th>after</th></tr>{body}</table>{registrations}"
    )


@renders(OpTableDiff, "frame")
def table_diff_frame(table: OpTableDiff) -> pandas.DataFrame:
    """A row per key: before and after (kind and source), and whether it changed."""
    import pandas as pd

    rows = [
        (
            row.key,
            row.before.kind_label,
            row.before.source,
            row.after.kind_label,
            row.after.source,
            row.changed,
        )
        for row in table.rows
    ]
    return pd.DataFrame(
        rows,
        columns=["key", "before_kind", "before_source", "after_kind", "after_source", "changed"],
    )


# ------------------------------------------------------------------ affected calls


@renders(AffectedCalls, "text")
def affected_text(affected: AffectedCalls) -> str:
    """``12 aten::sin calls now run ... instead of ...``, a line per group, then what could not
    be checked."""
    if not affected.calls:
        lines = [f"none of the {affected.checked:,} calls checked runs something else now"]
    else:
        total = sum(call.count for call in affected)
        lines = [f"{total:,} of {affected.checked:,} calls run something else now:"]
        lines += fitted(
            [
                f"  {_count(call.count, call.op + ' call', call.op + ' calls')} ({call.inputs}): "
                f"at {call.key}, "
                f"{call.after} instead of {call.before}"
                for call in affected
            ]
        )
    lines += fitted([f"  not checked: {reason}" for reason in affected.skipped])
    return "\n".join(lines)


@renders(AffectedCalls, "html")
def affected_html(affected: AffectedCalls) -> str:
    """The groups as an HTML table under the count."""
    head = affected_text(affected).split("\n", 1)[0]
    rows = [(c.op, str(c.count), c.key, c.before, c.after, c.inputs) for c in affected]
    table = html_rows(rows, ["op", "calls", "key", "before", "now", "inputs"]) if rows else ""
    skipped = "".join(f'<div class="dim">not checked: {escape(s)}</div>' for s in affected.skipped)
    return styled(f'<div class="headline">{escape(head)}</div>{table}{skipped}')


@renders(AffectedCalls, "frame")
def affected_frame(affected: AffectedCalls) -> pandas.DataFrame:
    """A row per group of calls."""
    import pandas as pd

    rows = [(c.op, c.key, c.before, c.after, c.count, c.inputs) for c in affected]
    return pd.DataFrame(rows, columns=["op", "key", "before", "after", "count", "inputs"])
