"""pandas forms of dispatch facts (``kernels()``): styled, folded HTML in notebooks; width-aware
text. A dispatch table's own DataFrame is drawn by :mod:`.table`."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING, Any

from ..dispatch.kernels import LONG_COLUMNS as KERNEL_LONG_COLUMNS
from ..display import Displayable, renders
from .layout import NOTEBOOK_CHARS, fitted, joined, more_note, terminal_width
from .style import KIND_COLOURS, KIND_FILLS, styled

if TYPE_CHECKING:
    import pandas
    from pandas.io.formats.style import Styler

_MIN_NAME = 24  # narrowest operator column of a wide frame's matrix
SHOWN_ROWS = 20  # rows a notebook or terminal shows before folding the rest
STYLED_ROWS = 200  # rows a notebook shows styled in all (folded after SHOWN_ROWS)


def style_kinds(frame: pandas.DataFrame) -> Styler:
    """Colour the cells that name a kernel kind (``kernel``, ``alias:...``, ``missing``, ...):
    the ``kind`` column of a long frame, every cell of a wide one. The cells' CSS ids come
    from the rows, not from pandas' random ones: the same frame shows the same HTML."""

    def colour(value: Any) -> str:
        """The CSS of one cell: the kind's colours, or nothing for other values."""
        kind = str(value).split(":", 1)[0]
        if kind not in KIND_FILLS:
            return ""
        return f"background-color: {KIND_FILLS[kind]}; color: {KIND_COLOURS[kind]}"

    rows_id = hashlib.blake2b(frame.to_csv().encode(), digest_size=6).hexdigest()
    styler = frame.style.set_uuid(f"opmagic{rows_id}")
    return styler.map(colour, subset=["kind"] if "kind" in frame.columns else None)


@dataclass(frozen=True)
class KernelsView(Displayable):
    """A kernels DataFrame for display: styled in notebooks, width-aware text in terminals,
    both folded after their first rows. ``show_all`` is the command that gives every row
    (by default the Python call, :func:`kernels_call`); ``empty`` the sentence shown when
    there is none (:func:`nothing_found`)."""

    frame: pandas.DataFrame
    show_all: str = "the view's .frame (a DataFrame)"
    empty: str = "No kernel matches."


def kernels_view(
    frame: pandas.DataFrame,
    namespace: str | None = None,
    keys: Sequence[str] | str | None = None,
    wide: bool = False,
    missing: str | None = None,
) -> KernelsView:
    """The view of ``opmagic.kernels(namespace, keys, wide=wide, missing=missing)``'s rows."""
    return KernelsView(
        frame,
        kernels_call(namespace, keys, wide, missing),
        nothing_found(namespace, keys, missing),
    )


def nothing_found(
    namespace: str | None, keys: Sequence[str] | str | None, missing: str | None
) -> str:
    """What it means that ``kernels(namespace, keys, missing=missing)`` has no row."""
    where = f" of namespace {namespace}" if namespace else ""
    if missing is not None:
        return f"Every operator{where} has a kernel of its own for {missing}: none lacks one."
    if keys is None or keys == "all":
        asked = "any of the keys asked for" if keys is None else "any key"
    else:
        asked = ", ".join([keys] if isinstance(keys, str) else keys)
    return f"No operator{where} has a kernel of its own for {asked}."


def kernels_call(
    namespace: str | None = None,
    keys: Sequence[str] | str | None = None,
    wide: bool = False,
    missing: str | None = None,
) -> str:
    """The ``opmagic.kernels(...)`` call that returns these rows, defaults left out."""
    arguments = [repr(namespace)] if namespace or keys is not None else []
    if keys is not None:
        arguments.append(repr(keys))
    if wide:
        arguments.append("wide=True")
    if missing:
        arguments.append(f"missing={missing!r}")
    return f"opmagic.kernels({', '.join(arguments)})"


@renders(KernelsView, "html")
def kernels_view_html(view: KernelsView) -> str:
    """The first rows coloured by kind, more (up to :data:`STYLED_ROWS`) folded below, and
    how many there are and how to get them all. A row per operator and a column per key
    when that fits a notebook's narrow pane; else, per operator, its keys grouped by kind."""
    frame = view.frame
    if frame.empty:
        return styled(f"<div>{escape(view.empty)}</div>")
    draw = _matrix_html if _fits_a_pane(frame) else _grouped_html
    shown = draw(frame.head(SHOWN_ROWS))
    folded = frame.iloc[SHOWN_ROWS:STYLED_ROWS]
    if len(folded):
        shown += (
            f"<details><summary>rows {SHOWN_ROWS + 1}–{SHOWN_ROWS + len(folded)} of "
            f"{len(frame):,}</summary>{draw(folded)}</details>"
        )
    if len(frame) > SHOWN_ROWS:
        shown += (
            f'<div class="dim">{len(frame):,} rows in all; every one: '
            f"<code>{escape(view.show_all)}</code></div>"
        )
    return styled(shown)


def _fits_a_pane(frame: pandas.DataFrame) -> bool:
    """Whether the key columns of a wide frame leave a notebook's narrow pane
    (:data:`NOTEBOOK_CHARS`) room for the operators' names (a long frame always fits: its
    last column wraps)."""
    if list(frame.columns) == KERNEL_LONG_COLUMNS:
        return True
    columns = [
        max(len(str(column)), *(len(str(value)) for value in frame[column]))
        for column in frame.columns
    ]
    return sum(width + 2 for width in columns) + _MIN_NAME <= NOTEBOOK_CHARS


def _matrix_html(frame: pandas.DataFrame) -> str:
    """The frame as pandas draws it, kinds coloured."""
    return style_kinds(frame).to_html()


def _grouped_html(frame: pandas.DataFrame) -> str:
    """A wide frame as a table of its operators, each with its keys grouped by the kind
    that serves them (coloured as the matrix colours it)."""
    rows = []
    for name, kinds in _by_kind(frame):
        for number, (kind, keys) in enumerate(kinds.items()):
            family = kind.split(":", 1)[0]
            colours = (
                f"background-color:{KIND_FILLS[family]};color:{KIND_COLOURS[family]}"
                if family in KIND_FILLS
                else ""
            )
            rows.append(
                f"<tr><td>{escape(name) if number == 0 else ''}</td>"
                f'<td style="{colours}">{escape(kind.replace("alias:", "via ", 1))}</td>'
                f"<td>{escape(', '.join(keys))}</td></tr>"
            )
    return f"<table><tr><th>op</th><th>kind</th><th>keys</th></tr>{''.join(rows)}</table>"


def _by_kind(frame: pandas.DataFrame) -> list[tuple[str, dict[str, list[str]]]]:
    """Per operator of a wide frame, its keys grouped by the kind that serves them, the
    operator's own kernels first, the keys without one last."""
    keys = [str(column) for column in frame.columns]
    order = list(KIND_COLOURS)  # kernel, alias, autograd, fallback, ..., missing

    def rank(kind: str) -> int:
        family = kind.split(":", 1)[0]
        return order.index(family) if family in order else len(order)

    grouped = []
    for index, values in zip(frame.index, frame.itertuples(index=False), strict=True):
        kinds: dict[str, list[str]] = {}
        for key, value in zip(keys, values, strict=True):
            kinds.setdefault(str(value), []).append(key)
        grouped.append((_row_name(index), dict(sorted(kinds.items(), key=lambda k: rank(k[0])))))
    return grouped


@renders(KernelsView, "text")
@renders(KernelsView, "pretty")
def kernels_view_text(view: KernelsView) -> str:
    """The first :data:`SHOWN_ROWS` rows as text that fits the terminal, then a count and
    the command that shows them all."""
    return frame_text(view.frame, SHOWN_ROWS, view.show_all, view.empty)


def frame_text(
    frame: pandas.DataFrame, limit: int | None, show_all: str, empty: str = "No kernel matches."
) -> str:
    """A kernels frame (long or wide) as left-aligned text fitting the terminal, its first
    ``limit`` rows (``None``: all), then how many more and ``show_all``; ``empty`` when
    there is no row.

    Long form: a heading per operator, then per kernel the keys it serves. Wide form:
    operators by keys when that fits the terminal, else a heading per operator and its
    keys' kinds as wrapped text.
    """
    shown = frame if limit is None else frame.head(limit)
    long = list(frame.columns) == KERNEL_LONG_COLUMNS
    lines = _long_lines(shown) if long else _wide_lines(shown)
    lines += more_note(len(frame), len(shown), "rows", show_all)
    return "\n".join(lines) if lines else "\n".join(fitted([empty]))


def _long_lines(frame: pandas.DataFrame) -> list[str]:
    """A heading per operator overload, then per kernel (kind and source) the keys it serves."""
    by_op: dict[str, dict[str, list[str]]] = {}
    for row in frame.itertuples(index=False):
        name = row.op if row.overload == "default" else f"{row.op}.{row.overload}"
        kind = f"via {row.alias}" if isinstance(row.alias, str) else row.kind
        served = joined(kind, row.source)
        by_op.setdefault(name, {}).setdefault(served, []).append(row.key)
    lines = []
    for name, kernels in by_op.items():
        lines.append(name)
        lines += fitted([f"  {', '.join(keys)}: {served}" for served, keys in kernels.items()])
    return lines


def _row_name(index: Any) -> str:
    """``aten::add.Tensor`` for an (op, overload) index, ``aten::sin`` for the default one."""
    if isinstance(index, tuple):
        op, overload = (str(part) for part in index)
        return op if overload == "default" else f"{op}.{overload}"
    return str(index)


def _wide_lines(frame: pandas.DataFrame) -> list[str]:
    """Operators by keys, left-aligned, when they fit; else per operator, its keys' kinds."""
    names = [_row_name(index) for index in frame.index]
    keys = [str(column) for column in frame.columns]
    cells = [[str(value) for value in values] for values in frame.itertuples(index=False)]
    widths = [max([len(key), *(len(row[i]) for row in cells)]) for i, key in enumerate(keys)]
    longest = max(map(len, ["op", *names]))
    room = terminal_width() - sum(w + 2 for w in widths)
    name_width = min(longest, room)
    if longest <= room or room >= _MIN_NAME:  # a matrix; a longer name gets a line of its own
        rows = []
        for name, row in [("op", keys), *zip(names, cells, strict=True)]:
            cells_text = "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
            if len(name) > name_width:
                rows += [name, " " * (name_width + 2) + cells_text]
            else:
                rows.append(f"{name.ljust(name_width)}  {cells_text}")
        return rows
    lines = []
    for name, by_kind in _by_kind(frame):
        lines.append(name)
        lines += fitted(
            [
                f"  {', '.join(served)}: {kind.replace('alias:', 'via ', 1)}"
                for kind, served in by_kind.items()
            ]
        )
    return lines
