"""Styled kernel tables: kind cells are coloured, nothing else is."""

from __future__ import annotations

import re

import pandas as pd

from opmagic.view.frames import KernelsView, style_kinds


def _coloured_cells(html: str) -> set[str]:
    return set(re.findall(r"_(row\d+_col\d+) \{\s*background-color", html))


def test_long_frames_colour_only_the_kind_column() -> None:
    frame = pd.DataFrame(
        [("AutogradCPU", "autograd", "autograd"), ("CPU", "backend", "kernel")],
        columns=["key", "category", "kind"],
    )
    assert _coloured_cells(style_kinds(frame).to_html()) == {"row0_col2", "row1_col2"}


def test_wide_frames_colour_every_kind_cell() -> None:
    frame = pd.DataFrame(
        [("kernel", "alias:CompositeExplicitAutograd"), ("missing", "fallback")],
        columns=["CPU", "Meta"],
    )
    assert len(_coloured_cells(KernelsView(frame)._repr_html_())) == 4
    assert str(KernelsView(frame)).splitlines() == [
        "op  CPU      Meta",
        "0   kernel   alias:CompositeExplicitAutograd",
        "1   missing  fallback",
    ]
