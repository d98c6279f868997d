"""The layout toolkit: left alignment, fitting the terminal's width, folding."""

from __future__ import annotations

import textwrap

from hypothesis import given, settings
from hypothesis import strategies as st

from opmagic.view.layout import aligned, fitted, more_note, wrap


def test_aligned_puts_what_does_not_fit_below_its_row():
    rows = [("key", "kind", "source"), ("CPU", "kernel", "a/b.cpp:1"), ("Meta", "x", "word " * 8)]
    assert aligned(rows, width=40) == [
        "  key   kind    source",
        "  CPU   kernel  a/b.cpp:1",
        "  Meta  x",
        "        word word word word word word",  # below its row, wrapped to the width
        "            word word",
    ]
    long_word = aligned([("CPU", "kernel", "x" * 50)], width=40)
    assert long_word == ["  CPU  kernel", "        " + "x" * 50]  # a path: its own line, whole
    records = aligned([("k" * 30, "v" * 30, "z")], width=40)
    assert records == ["  " + "k" * 30, "        " + "v" * 30, "        z"]  # nothing cut


def test_fitted_and_the_fold_note():
    assert fitted(["    one two three four"], width=14) == [
        "    one two",
        "        three",
        "        four",
    ]
    assert more_note(10, 10, "rows", "x") == []
    note = more_note(1234, 20, "rows", "python -m opmagic kernels --rows all")
    assert " ".join(" ".join(note).split()) == (
        "... 1,214 more rows (1,234 in all); all of them: python -m opmagic kernels --rows all"
    )


@settings(max_examples=300, deadline=None)
@given(
    text=st.lists(st.text("ab:.(", min_size=1, max_size=12), max_size=10).map(" ".join)
    | st.text(st.sampled_from("ab:.()/- \t\n"), max_size=60),
    width=st.integers(min_value=1, max_value=30),
)
def test_wrap_gives_textwraps_lines(text: str, width: int) -> None:
    """The fast path for plain text and textwrap's own for the rest: the same lines."""
    assert wrap(text, width) == textwrap.wrap(text, width)
