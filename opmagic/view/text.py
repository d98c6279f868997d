"""Plain-text forms of dispatch tables and resolutions, for terminals and ``python -m opmagic``.

Text fits the terminal (``shutil.get_terminal_size``: ``$COLUMNS``, else the terminal, else
80 columns) and is left-aligned: :func:`aligned` lays out columns and wraps the last one,
:func:`fitted` wraps long lines under their own indentation, :func:`more_note` ends a
listing cut after its first lines with a count and the command that shows them all.
"""

from __future__ import annotations

import shutil
import textwrap
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
    """Table entries of one category run served the same way (shown as one row)."""

    category: str
    entries: tuple[TableEntry, ...]

    @property
    def first(self) -> TableEntry:
        return self.entries[0]

    @property
    def keys_label(self) -> str:
        """``CPU`` or ``CUDA, HIP`` or ``CPU, CUDA + 61 more keys``."""
        return keys_label(self.entries, 2)

    @property
    def kind_label(self) -> str:
        return self.first.kind_label


def grouped_entries(table: DispatchTable, show_all: bool = False) -> Iterator[EntryGroup]:
    """Table entries in priority order; within a run of one category, keys served the same
    way share a group. Only kernels of the op's own unless ``show_all``."""
    run: dict[tuple, list[TableEntry]] = {}
    for entry in table.entries:
        if not (show_all or entry.is_own):
            continue
        if run and next(iter(run.values()))[0].category != entry.category:
            yield from (EntryGroup(e[0].category, tuple(e)) for e in run.values())
            run = {}
        run.setdefault((entry.kind, entry.alias, entry.source), []).append(entry)
    yield from (EntryGroup(e[0].category, tuple(e)) for e in run.values())


def keys_label(entries: Sequence[TableEntry], named: int = 3) -> str:
    """``CPU`` or ``CPU, CUDA, Meta + 60 more keys``: for a kernel of the op's own, the keys
    most readers know named first; for fallbacks and the like, the first keys."""
    if len(entries) <= named:
        return ", ".join(e.key for e in entries)
    if entries[0].is_own:
        entries = sorted(entries, key=lambda e: _familiarity(e.key))
    return f"{', '.join(e.key for e in entries[:named])} + {len(entries) - named} more keys"


_FAMILIAR = ("CPU", "CUDA", "Meta", "AutogradCPU", "AutogradCUDA", "AutocastCPU", "AutocastCUDA")


def _familiarity(key: str) -> int:
    """The keys most readers know first (CPU, CUDA, Meta, then their autograd/autocast
    keys), the others after them in priority order (a stable sort keeps it)."""
    return _FAMILIAR.index(key) if key in _FAMILIAR else len(_FAMILIAR)


@renders(DispatchTable, "text")
def table_text(table: DispatchTable, show_all: bool = False, show_all_hint: str = "") -> str:
    """The table as text: the op's own kernels (every key with ``show_all``) in priority
    order, a heading per category, keys served alike on one row; then what is left out and
    ``show_all_hint``, the command that lists it (default: the Python call)."""
    lines = fitted([table.schema or table.op])
    rows: list[tuple[str, str]] = [("  key (highest priority first)", "kind · source")]
    category = None
    for group in grouped_entries(table, show_all):
        if group.category != category:
            category = group.category
            rows.append((f"  {category}:", ""))
        rows.append((f"    {group.keys_label}", joined(group.kind_label, group.first.source)))
    lines += aligned(rows, indent="")
    left_out = [e for e in table.entries if not e.is_own]
    if left_out and not show_all:
        missing = sum(1 for e in left_out if e.kind == "missing")
        others = len(left_out) - missing
        hint = (
            show_all_hint or f"print(opmagic.dispatch_table({table.op!r}).diagram(show_all=True))"
        )
        lines += fitted(
            [
                f"  (not listed: {others} keys with only a backend fallback or a fallthrough, "
                f"{missing} with no kernel (a call reaching them fails); all keys: {hint})"
            ]
        )
    own = [r for r in table.registrations if r.active]
    if own:
        lines.append("  registrations as made (before alias keys fill the table):")
        lines += aligned(
            [(f"{r.key}{' [alias]' if r.is_alias else ''}", r.source) for r in own], "    "
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
    return "\n".join(fitted(lines))


def answer_line(resolution: Resolution) -> str:
    """The answer in one line: the path, then what its last kernel does, or why it fails."""
    path = " → ".join(resolution.path) or "(no kernel runs)"
    if resolution.error:
        return f"{path}  ✗ fails: {resolution.error}"
    last = resolution.steps[-1] if resolution.steps else None
    return f"{path}  ·  {last.key}: {last.note}" if last is not None else path


@renders(OverloadTables, "text")
def overload_tables_text(tables: OverloadTables) -> str:
    """Every overload's table, a blank line between them."""
    return "\n\n".join(table_text(table) for table in tables)


# ------------------------------------------------------------------ fitting the terminal

_MIN_LAST = 24  # a last column narrower than this moves to its own line


def terminal_width() -> int:
    """The terminal's width in columns: ``$COLUMNS``, else the terminal's, else 80."""
    return shutil.get_terminal_size((80, 24)).columns


def aligned(
    rows: Sequence[Sequence[str]], indent: str = "  ", width: int | None = None
) -> list[str]:
    """Rows of cells as left-aligned columns that fit ``width`` (default: the terminal).

    Every column but the last is padded to its widest cell; a last cell that does not fit
    in the room left goes below its row, indented, wrapped to the width. When even the
    other columns leave under :data:`_MIN_LAST` characters, every row is a small record
    instead: its first cell, then each other cell on a line of its own, indented. Nothing
    is cut. A row whose other cells are empty (a heading) is printed as it is.
    """
    if not rows:
        return []
    width = width or terminal_width()
    count = len(rows[0])
    cells_rows = [row for row in rows if any(row[1:])] or list(rows)
    widths = [max(len(row[i]) for row in cells_rows) for i in range(count - 1)]
    last_room = min(_MIN_LAST, max(len(row[-1]) for row in cells_rows))
    records = len(indent) + sum(w + 2 for w in widths) + last_room > width
    under = indent + "      "
    lines = []
    for row in rows:
        if not any(row[1:]):
            lines += fitted([indent + row[0]], width)
            continue
        if records:
            lines += fitted([indent + row[0]], width)
            lines += [line for cell in row[1:] if cell for line in fitted([under + cell], width)]
            continue
        start = indent + "".join(f"{cell.ljust(w)}  " for cell, w in zip(row, widths, strict=False))
        room = width - len(start)
        last = row[-1]
        if len(last) <= room:
            lines.append((start + last).rstrip())
        else:
            lines.append(start.rstrip())
            lines += fitted([under + last], width)
    return lines


def fitted(lines: Sequence[str], width: int | None = None) -> list[str]:
    """Lines wrapped to ``width`` (default: the terminal), continuations indented under
    the line's own indentation."""
    width = width or terminal_width()
    out = []
    for line in lines:
        if len(line) <= width:
            out.append(line)
            continue
        indent = " " * (len(line) - len(line.lstrip()))
        out += textwrap.wrap(
            line.strip(),
            width,
            initial_indent=indent,
            subsequent_indent=indent + "    ",
            break_long_words=False,
            break_on_hyphens=False,
        ) or [line]
    return out


def joined(*parts: str) -> str:
    """The non-empty parts, ``·``-separated: one cell for what would not fit as columns."""
    return " · ".join(part for part in parts if part)


def more_note(total: int, shown: int, what: str, show_all: str) -> list[str]:
    """Where a listing was folded after ``shown`` of ``total`` items: how many more
    ``what`` there are and ``show_all``, the command that shows them all (nothing when
    nothing was folded)."""
    if total <= shown:
        return []
    return fitted(
        [f"... {total - shown:,} more {what} ({total:,} in all); all of them: {show_all}"]
    )
