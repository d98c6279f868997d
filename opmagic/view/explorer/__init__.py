"""The dispatch explorer (``opmagic.explore()``): :mod:`.model` answers, :mod:`.widgets` draws.

Opening one takes seconds the first time in a kernel (ipywidgets, torch's lazy imports, the
first diagram), so a notebook shows a placeholder at once, gone when the explorer is drawn.
"""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING, Any

from ..live import LiveOutput, in_notebook
from ..style import styled

if TYPE_CHECKING:
    from .widgets import Explorer


def open_explorer(op: Any = None) -> Explorer:
    """The explorer of ``op``; in a notebook a line says it is opening until it is ready."""
    placeholder = LiveOutput() if in_notebook() else None
    if placeholder is not None:
        what = f" of {op}" if isinstance(op, str) else ""
        text = f"opening the dispatch explorer{what}… (the first one in a kernel takes seconds)"
        placeholder.text(text, styled(f'<span class="dim">{escape(text)}</span>'))
    try:
        from .widgets import Explorer

        return Explorer(op)
    finally:
        if placeholder is not None:
            placeholder.clear()
