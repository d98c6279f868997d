"""Reading what executed notebook cells showed."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import nbformat



def cell_text(cell: nbformat.NotebookNode) -> str:
    """The text a code cell printed or returned (its streams and plain-text results)."""
    parts = []
    for output in cell.outputs:
        if output.output_type == "stream":
            parts.append(output.text)
        elif "text/plain" in output.get("data", {}):
            parts.append(output.data["text/plain"])
    return "\n".join(parts)
