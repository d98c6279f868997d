"""How opmagic's results look: importing this package registers every renderer with
:mod:`opmagic.display` (``import opmagic`` does it).

Text fits terminals, HTML and SVG notebooks, DataFrames pandas; the explorer widget lives
in :mod:`opmagic.view.explorer` and is imported only when it is opened.
"""

from . import cells, compare, cuda, diff, frames, graph, html, library, text, trace

__all__ = [
    "cells",
    "compare",
    "cuda",
    "diff",
    "frames",
    "graph",
    "html",
    "library",
    "text",
    "trace",
]
