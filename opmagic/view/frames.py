"""pandas forms of dispatch facts, and their styled notebook display."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..dispatch.table import DispatchTable
from ..display import Displayable, renders
from .style import KIND_COLOURS, KIND_FILLS

if TYPE_CHECKING:
    import pandas
    from pandas.io.formats.style import Styler

TABLE_COLUMNS = ["key", "category", "kind", "alias", "source", "site", "explanation"]
KERNEL_COLUMNS = ["key", "category", "kind", "alias", "source"]
STYLED_ROWS = 200  # rows a notebook shows styled; the frame itself keeps them all


@renders(DispatchTable, "frame")
def table_frame(table: DispatchTable) -> pandas.DataFrame:
    """A row per runtime key of the table, in priority order, missing keys included."""
    import pandas as pd

    rows = [
        (e.key, e.category, e.kind, e.alias, e.source, e.site, e.explanation) for e in table.entries
    ]
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def op_kernels_frame(table: DispatchTable) -> pandas.DataFrame:
    """The operator's own kernels per key, in priority order (no fallbacks, no missing keys)."""
    import pandas as pd

    rows = [
        (e.key, e.category, e.kind, e.alias, e.source)
        for e in table.entries
        if e.kind != "missing" and not e.is_fallback
    ]
    return pd.DataFrame(rows, columns=KERNEL_COLUMNS)


def style_kinds(frame: pandas.DataFrame) -> Styler:
    """Colour the cells that name a kernel kind (``kernel``, ``alias:...``, ``missing``, ...):
    the ``kind`` column of a long frame, every cell of a wide one."""

    def colour(value: Any) -> str:
        """The CSS of one cell: the kind's colours, or nothing for other values."""
        kind = str(value).split(":", 1)[0]
        if kind not in KIND_FILLS:
            return ""
        return f"background-color: {KIND_FILLS[kind]}; color: {KIND_COLOURS[kind]}"

    return frame.style.map(colour, subset=["kind"] if "kind" in frame.columns else None)


@dataclass(frozen=True)
class KernelsView(Displayable):
    """A kernels DataFrame for display: styled in notebooks, plain text in terminals."""

    frame: pandas.DataFrame


@renders(KernelsView, "html")
def kernels_view_html(view: KernelsView) -> str:
    """The first rows, coloured by kind, and how to get the rest."""
    shown = view.frame.head(STYLED_ROWS)
    note = ""
    if len(view.frame) > len(shown):
        note = (
            f"<p>First {len(shown)} of {len(view.frame)} rows. Narrow it down (a namespace, "
            "--key, --missing) or take the DataFrame: <code>view.frame</code>.</p>"
        )
    return style_kinds(shown).to_html() + note


@renders(KernelsView, "text")
def kernels_view_text(view: KernelsView) -> str:
    """Every row as aligned text (the command line prints this)."""
    import pandas as pd

    with pd.option_context("display.max_rows", None, "display.width", 200):
        return view.frame.to_string()


@renders(KernelsView, "pretty")
def kernels_view_pretty(view: KernelsView) -> str:
    """Terminal IPython: pandas' own (abridged) text form."""
    return repr(view.frame)
