"""Styled kernel tables: kind cells are coloured, nothing else is."""

from __future__ import annotations

import re

import pandas as pd

from opmagic.view.frames import KernelsView, kernels_view, style_kinds


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


def _wide(keys: int) -> pd.DataFrame:
    """A wide kernels frame of one operator and ``keys`` keys, as opmagic.kernels makes it."""
    kinds = ["kernel", "autograd", "missing", "alias:CompositeExplicitAutograd"]
    frame = pd.DataFrame(
        [["mylib::scale", "default", *(kinds[i % 4] for i in range(keys))]],
        columns=["op", "overload", *(f"Key{i}" for i in range(keys))],
    )
    return frame.set_index(["op", "overload"])


def test_a_matrix_too_wide_for_a_notebook_pane_groups_each_operator_s_keys_by_kind() -> None:
    """17 key columns were a 2,674 px table: the keys of each kind go in one cell instead."""
    html = KernelsView(_wide(17))._repr_html_()
    assert "<th>op</th><th>kind</th><th>keys</th>" in html and "Key16" in html
    assert ">via CompositeExplicitAutograd</td><td>Key3, Key7, Key11, Key15</td>" in html
    assert html.count("<tr>") == 1 + 4  # the header, a row per kind
    narrow = KernelsView(_wide(2))._repr_html_()
    assert "<th>kind</th>" not in narrow and "Key1" in narrow  # two keys: the matrix


def test_no_rows_is_a_sentence_that_says_what_was_looked_for() -> None:
    empty = pd.DataFrame(columns=["op", "overload", "key", "kind", "alias", "source"])
    view = kernels_view(empty, "mylib", ["Meta"], False, None)
    assert str(view) == "No operator of namespace mylib has a kernel of its own for Meta."
    assert "<div>No operator of namespace mylib has a kernel" in view._repr_html_()
    assert "<table" not in view._repr_html_()
    missing = kernels_view(empty, "mylib", None, True, "CPU")
    assert " ".join(str(missing).split()) == (  # wrapped to the terminal
        "Every operator of namespace mylib has a kernel of its own for CPU: none lacks one."
    )
