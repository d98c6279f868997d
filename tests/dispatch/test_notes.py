"""``opmagic.dispatch.notes``: what code outside the dispatcher notes lands on the call that was
running (a Triton launch under its triton_op's call), or on the trace when none was."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import opmagic
from opmagic.dispatch import notes


@pytest.fixture
def noting_ops() -> Iterator[None]:
    """``notes_test::inner`` notes "inner"; ``notes_test::outer`` notes "before", calls inner,
    then notes "after"."""
    lib = torch.library.Library("notes_test", "FRAGMENT")
    lib.define("inner(Tensor x) -> Tensor")
    lib.define("outer(Tensor x) -> Tensor")

    def inner(x):
        notes.note("inner")
        return x.clone()

    def outer(x):
        notes.note("before")
        y = torch.ops.notes_test.inner(x)
        notes.note("after")
        return y

    lib.impl("inner", inner, "CompositeExplicitAutograd")
    lib.impl("outer", outer, "CompositeExplicitAutograd")
    yield
    lib._destroy()


def test_a_note_goes_to_the_call_running_when_it_was_made(noting_ops: None) -> None:
    def code(x):
        notes.note("top")
        return torch.ops.notes_test.outer(x)

    result = opmagic.trace(code, torch.randn(2))
    assert result.notes == ("top",)
    (outer,) = result.calls
    assert outer.op == "notes_test::outer" and outer.notes == ("before", "after")
    inner = next(c for c in outer.children if c.op == "notes_test::inner")
    assert inner.notes == ("inner",)


def test_the_block_form_keeps_notes_and_nothing_is_kept_without_a_trace(noting_ops) -> None:
    x = torch.randn(2)
    with opmagic.trace() as result:
        torch.ops.notes_test.inner(x)
    assert [(c.op, c.notes) for c in result.calls] == [("notes_test::inner", ("inner",))]
    assert not notes.recording() and notes.note("lost") is False
    assert opmagic.trace(torch.ops.notes_test.inner, torch.randn(2)).notes == ()


def test_the_trace_text_shows_notes_under_their_call(noting_ops: None) -> None:
    text = str(opmagic.trace(torch.ops.notes_test.outer, torch.randn(2)))
    lines = text.splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith("notes_test::outer"))
    assert lines[row + 1].strip() == "▸ before" and lines[row + 2].strip() == "▸ after"
    assert "▸ inner" in text
    assert "▸ before" in opmagic.trace(torch.ops.notes_test.outer, torch.randn(2))._repr_html_()
