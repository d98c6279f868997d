"""The layout toolkit of every view: text that fits the terminal, and HTML rows.

Text fits the terminal (``shutil.get_terminal_size``: ``$COLUMNS``, else the terminal, else
80 columns) and is left-aligned: :func:`aligned` lays out columns and wraps the last one,
:func:`fitted` wraps long lines under their own indentation, :func:`more_note` ends a
listing cut after its first lines with a count and the command that shows them all.
HTML views wrap themselves with :func:`~opmagic.view.style.styled` (the one stylesheet).
"""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Sequence
from html import escape

_MIN_LAST = 24  # a last column narrower than this moves to its own line
# What an HTML view can take of a notebook's width, in characters of the stylesheet's 12 px
# monospace (7.2 px each): JupyterLab's output pane is 592 px wide in a 1024x768 window with
# the file browser open. A table cell's padding is two of them.
NOTEBOOK_CHARS = 80


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


def wrap(text: str, width: int) -> list[str]:
    """``textwrap.wrap(text, width)``, the same lines, at a fraction of its cost for plain
    single-spaced text without hyphens (a trace's headline and surprises, shown once per
    trace: showing one must not cost more than recording it)."""
    words = text.split(" ")
    plain = text.isprintable() and "-" not in text and all(words)
    if not plain or max(map(len, words)) > width:
        return textwrap.wrap(text, width)
    lines, line = [], words[0]
    for word in words[1:]:
        if len(line) + 1 + len(word) <= width:
            line += " " + word
        else:
            lines.append(line)
            line = word
    return [*lines, line]


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


def html_rows(rows: Sequence[Sequence[str]], header: Sequence[str] | None = None) -> str:
    """An HTML table of text cells, with an optional header row."""
    head = "<tr>" + "".join(f"<th>{escape(h)}</th>" for h in header) + "</tr>" if header else ""
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in row) + "</tr>" for row in rows
    )
    return f"<table>{head}{body}</table>"
