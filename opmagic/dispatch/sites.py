"""Readable names for the places kernels were registered.

torch records a registration site as ``registered at FILE:LINE``. This module shortens
paths inside torch, names Python callables by their definition, and lets a front end
(the notebook session) add labelers that turn cell filenames into ``cell [n], line k``.
"""

from __future__ import annotations

import functools
import inspect
import os
import re
from collections.abc import Callable
from typing import Any

Labeler = Callable[[str, int], "str | None"]

_labelers: list[Labeler] = []

_SITE = re.compile(r"^(?:registered at )?(?P<file>.+?):(?P<line>\d+)$")
_TORCH_ROOTS = ("/pytorch/pytorch/", "/site-packages/", "/dist-packages/")


def add_labeler(labeler: Labeler) -> None:
    """Let ``labeler(filename, line)`` name sites first (return ``None`` to pass)."""
    if labeler not in _labelers:
        _labelers.append(labeler)


def remove_labeler(labeler: Labeler) -> None:
    """Undo :func:`add_labeler` (a no-op when it was not added)."""
    if labeler in _labelers:
        _labelers.remove(labeler)


def label_location(filename: str, line: int) -> str:
    """``file:line`` shortened for display, or what a labeler calls it."""
    for labeler in _labelers:
        named = labeler(filename, line)
        if named:
            return named
    return f"{shorten_path(filename)}:{line}"


@functools.lru_cache(maxsize=4096)
def shorten_path(path: str) -> str:
    """Drop build and install prefixes (``.../pytorch/pytorch/aten/x.cpp`` -> ``aten/x.cpp``)."""
    for root in _TORCH_ROOTS:
        if root in path:
            path = path.split(root, 1)[1]
    if path.startswith("build/"):
        path = path[len("build/") :]
    return path


def label_site(site: str | None) -> str:
    """Display form of a site string as torch records it (``registered at FILE:LINE``)."""
    if not site:
        return ""
    located = parse_site(site)
    if located is None:
        return site.strip().removeprefix("registered at ")
    return label_location(*located)


@functools.lru_cache(maxsize=4096)
def parse_site(site: str | None) -> tuple[str, int] | None:
    """``(file, line)`` of a site as torch records it (``registered at FILE:LINE``), or None
    (remembered: every table names its sites when it is made, and they repeat)."""
    match = _SITE.match(site.strip()) if site else None
    return None if match is None else (match["file"], int(match["line"]))


def label_callable(fn: Any) -> str:
    """``name (file:line)`` for a Python function, following ``functools.wraps`` chains."""
    fn = inspect.unwrap(fn) if callable(fn) else fn
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    code = getattr(fn, "__code__", None)
    if code is None:
        return name
    filename = code.co_filename
    if not os.path.isabs(filename) and not filename.startswith("<"):
        filename = os.path.abspath(filename)
    return f"{name} ({label_location(filename, code.co_firstlineno)})"
