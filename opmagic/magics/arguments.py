"""Helpers for the cell magics' option values."""

from __future__ import annotations


def unquote(text: str | None) -> str | None:
    """An option value without the quotes IPython's argument splitting leaves on it."""
    if text is not None and len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text
