"""Outputs that show at once and change in place: a build's or a sweep's progress, and the
placeholder of something slow to draw.

In a Jupyter kernel a :class:`LiveOutput` is one output of the running cell (a display with
an id), replaced each time it is shown again; it can also be told what to show once the cell
has ended (after IPython has drawn the cell's result), so that a line saying what is still
being drawn does not outlive the drawing.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


def in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (which shows rich outputs)."""
    if "IPython" not in sys.modules:
        return False
    from IPython import get_ipython

    return getattr(get_ipython(), "kernel", None) is not None


class LiveOutput:
    """One notebook output, shown when first asked and replaced in place after."""

    def __init__(self) -> None:
        self.handle: Any = None

    def show(self, obj: Any, raw: bool = False) -> None:
        """Show ``obj`` (a mime bundle with ``raw=True``) instead of what was shown."""
        from IPython.display import display

        if self.handle is None:
            self.handle = display(obj, raw=raw, display_id=True)
        else:
            self.handle.update(obj, raw=raw)

    def text(self, text: str, html: str | None = None) -> None:
        """Show a line of text (and its HTML form for notebooks)."""
        bundle = {"text/plain": text}
        if html is not None:
            bundle["text/html"] = html
        self.show(bundle, raw=True)

    def clear(self) -> None:
        """Show nothing (the output stays, empty)."""
        self.show({}, raw=True)

    def after_cell(self, then: Callable[[LiveOutput], None]) -> None:
        """Call ``then(self)`` once the running cell has ended, its result drawn."""
        from IPython import get_ipython

        shell = get_ipython()

        def ended(*_: Any) -> None:
            shell.events.unregister("post_execute", ended)
            then(self)

        shell.events.register("post_execute", ended)
