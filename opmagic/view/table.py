"""How a dispatch table looks: text (a heading per category, keys served alike on one row),
HTML (its diagram over its rows), a diagram (the op's own kernels in clusters by category, or
every key), a DataFrame; and every overload's tables one after the other.

Everything here formats the entries the table holds: it was read when it was made.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING

from ..dispatch.table import DispatchTable, OverloadTables
from ..display import renders
from .diagram import Diagram, result_bundle, with_diagram, wrapped
from .keygraph import FULL_NODES, TITLE_WRAP, KeyGraph, category_clusters, column_nodes, keys_label
from .layout import aligned, fitted, joined
from .style import KIND_COLOURS

if TYPE_CHECKING:
    import pandas

    from ..dispatch.table import TableEntry

TABLE_COLUMNS = ["key", "category", "kind", "alias", "source", "site", "explanation"]


@dataclass(frozen=True)
class EntryGroup:
    """Table entries of one category run served the same way (shown as one row)."""

    category: str
    entries: tuple[TableEntry, ...]

    @property
    def first(self) -> TableEntry:
        """The highest-priority entry: the one the row describes."""
        return self.entries[0]

    @property
    def keys_label(self) -> str:
        """``CPU`` or ``CUDA, HIP`` or ``CPU, CUDA + 61 more keys``."""
        return keys_label(self.entries, 2)

    @property
    def kind_label(self) -> str:
        """How the row's keys are served: ``kernel``, ``via Autograd``, ..."""
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


@renders(OverloadTables, "text")
def overload_tables_text(tables: OverloadTables) -> str:
    """Every overload's table, a blank line between them."""
    return "\n\n".join(table_text(table) for table in tables)


@renders(DispatchTable, "html")
def table_html(table: DispatchTable) -> str:
    """The table's diagram, then its rows (keys served alike merged) in a collapsible section."""
    listing = listing_html(table)
    return with_diagram(table_diagram(table), "the operator's own kernels, per key", listing)


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
        '<table class="wraps"><tr><th>keys (highest priority first)</th><th>category</th>'
        "<th>kind</th>"
        f"<th>source</th></tr>{rows}</table>{note}"
    )


@renders(OverloadTables, "html")
def overload_tables_html(tables: OverloadTables) -> str:
    """Every overload's table, one after the other."""
    return "".join(table_html(table) for table in tables)


renders(DispatchTable, "mimebundle")(result_bundle)  # its diagram (SVG) plus its text


@renders(DispatchTable, "diagram")
def table_diagram(table: DispatchTable, show_all: bool = False) -> Diagram:
    """An operator's dispatch table as a diagram.

    By default only keys with a kernel of the operator's own (registered for the key or
    filled in from an alias key) are drawn, in clusters by category; ``show_all`` draws
    every runtime key, fallbacks, fallthroughs and missing kernels included, as one
    column. Where there are more than :data:`FULL_NODES` kernels (in a cluster, or in
    the column), they are one-line boxes with their sources in tooltips.
    """
    shown = list(table.entries) if show_all else [e for e in table.entries if e.is_own]
    hidden = len(table.entries) - len(shown)
    title = wrapped([table.schema or table.op], TITLE_WRAP)
    if hidden:
        title.append(f"({hidden} keys with only a fallback or no kernel are not drawn)")
    builder = KeyGraph(title)
    if show_all:
        nodes = column_nodes(shown, {})
        own = sum(1 for node in nodes if node.first.is_own)
        builder.add_column(nodes, compact=own > FULL_NODES)
    else:
        builder.add_clusters(category_clusters(shown))
    builder.add_legend()
    return Diagram(builder.graph, table_text(table, show_all=show_all))


@renders(DispatchTable, "frame")
def table_frame(table: DispatchTable) -> pandas.DataFrame:
    """A row per runtime key of the table, in priority order, missing keys included."""
    import pandas as pd

    rows = [
        (e.key, e.category, e.kind, e.alias, e.source, e.site, e.explanation) for e in table.entries
    ]
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)
