"""Plain-text forms of dispatch tables and resolutions, for terminals and ``python -m opmagic``."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..dispatch.resolve import Resolution
from ..dispatch.table import DispatchTable, OverloadTables
from ..display import renders

if TYPE_CHECKING:
    from ..dispatch.table import TableEntry


@dataclass(frozen=True)
class EntryGroup:
    """Consecutive table entries of one category served the same way (shown as one row)."""

    category: str
    entries: tuple[TableEntry, ...]

    @property
    def first(self) -> TableEntry:
        return self.entries[0]

    @property
    def keys_label(self) -> str:
        """``CPU`` or ``CUDA, HIP, XLA`` or ``AutogradNestedTensor … AutogradOther (19 keys)``."""
        names = [e.key for e in self.entries]
        if len(names) <= 3:
            return ", ".join(names)
        return f"{names[0]}, {names[1]} … {names[-1]} ({len(names)} keys)"

    @property
    def kind_label(self) -> str:
        return self.first.kind_label


def grouped_entries(table: DispatchTable, include_missing: bool = False) -> Iterator[EntryGroup]:
    """Table entries in priority order, runs of identical service merged into one group."""
    run: list[TableEntry] = []
    for entry in table.entries:
        if entry.kind == "missing" and not include_missing:
            continue  # hidden keys do not split a run: the label names its first and last keys
        if run and _same_service(run[-1], entry):
            run.append(entry)
            continue
        if run:
            yield EntryGroup(run[0].category, tuple(run))
        run = [entry]
    if run:
        yield EntryGroup(run[0].category, tuple(run))


def _same_service(a: TableEntry, b: TableEntry) -> bool:
    return (a.category, a.kind, a.alias, a.source) == (b.category, b.kind, b.alias, b.source)


@renders(DispatchTable, "text")
def table_text(table: DispatchTable, include_missing: bool = False) -> str:
    """The table as aligned text: one row per run of keys served alike, in priority order."""
    groups = list(grouped_entries(table, include_missing))
    rows = [(g.keys_label, g.category, g.kind_label, g.first.source) for g in groups]
    header = ("key (highest priority first)", "category", "kind", "source")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(3)]
    lines = [table.schema or table.op]
    for row in [header, *rows]:
        lines.append(
            "  "
            + "  ".join(f"{cell:<{w}}" for cell, w in zip(row, widths, strict=False))
            + f"  {row[3]}"
        )
    missing = sum(1 for e in table.entries if e.kind == "missing")
    if missing and not include_missing:
        lines.append(f"  ({missing} other keys have no kernel: a call reaching them fails)")
    own = [r for r in table.registrations if r.active]
    if own:
        lines.append("  registrations as made (before alias keys fill the table):")
        labels = [f"{r.key}{' [alias]' if r.is_alias else ''}" for r in own]
        width = max(len(label) for label in labels)
        lines.extend(
            f"    {label:<{width}}  {r.source}" for label, r in zip(labels, own, strict=True)
        )
    return "\n".join(lines)


@renders(Resolution, "text")
def resolution_text(resolution: Resolution) -> str:
    """The resolved path as numbered steps with origins, skipped keys and what runs."""
    lines = [resolution.schema or resolution.op]
    if resolution.inputs:
        lines.append(
            "  inputs: " + "; ".join(f"{i.name}: {i.description}" for i in resolution.inputs)
        )
    if resolution.context:
        lines.append("  context: " + "; ".join(resolution.context))
    lines.append("  path: " + (" -> ".join(resolution.path) or "(none)"))
    for number, step in enumerate(resolution.steps, 1):
        assumed = "  [assumes the Python handler calls the op again]" if step.assumed else ""
        lines.append(f"  {number}. {step.key}  ({step.entry.kind_text}){assumed}")
        lines.append(f"       from: {step.origin}")
        for skip in step.skipped:
            lines.append(f"       skipped {skip.key}: {skip.detail}")
        marker = {"error": "FAILS", "ends": "ends", "python": "hands over to Python"}.get(
            step.action, "then"
        )
        lines.append(f"       {marker}: {step.note}")
    if resolution.error:
        lines.append(f"  error: {resolution.error}")
    return "\n".join(lines)


@renders(OverloadTables, "text")
def overload_tables_text(tables: OverloadTables) -> str:
    """Every overload's table, a blank line between them."""
    return "\n\n".join(table_text(table) for table in tables)


def aligned(rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    """Rows of cells as lines with every column but the last padded to its widest cell."""
    if not rows:
        return []
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return [
        indent + "  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)), row[-1]])
        for row in rows
    ]
