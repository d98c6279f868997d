"""How opmagic's errors show in IPython: the message alone, wrapped to the terminal."""

from __future__ import annotations

import pytest
import torch

from opmagic.errors import (
    OpmagicError,
    UnknownOperatorError,
    is_list_of_values,
    wrap_to_terminal,
)

_LONG = (
    "Unknown operator 'mylib::scale'. No operator is registered in namespace 'mylib': define one "
    "first (torch.library.custom_op, %%custom_op or %%torch_library) or check the spelling."
)


def test_a_message_wraps_between_words_at_the_terminal_width(monkeypatch):
    monkeypatch.setenv("COLUMNS", "50")
    (shown,) = UnknownOperatorError(_LONG)._render_traceback_()
    lines = shown.splitlines()
    assert len(lines) > 3 and all(len(line) <= 50 for line in lines)
    assert " ".join(lines) == f"UnknownOperatorError: {_LONG}"


def test_short_lines_and_indented_excerpts_are_kept_whole():
    excerpt = "CellSourceError: line 2\n    " + "x" * 80 + "\n" + "y" * 90
    assert wrap_to_terminal(excerpt, 40).splitlines() == excerpt.splitlines()  # no spaces in y
    assert OpmagicError("short")._render_traceback_() == ["OpmagicError: short"]


@pytest.mark.parametrize(
    "value",
    [[1, 2], (1,), {1, 2}, range(3), iter([1]), torch.Size([2, 3]), [torch.ones(2)]],
    ids=["list", "tuple", "set", "range", "iterator", "torch.Size", "list-of-tensors"],
)
def test_collections_are_lists_of_values(value):
    assert is_list_of_values(value)


@pytest.mark.parametrize(
    "value",
    ["ab", b"ab", bytearray(b"ab"), {"a": 1}, torch.ones(2), torch.nn.Parameter(torch.ones(2)), 3],
    ids=["str", "bytes", "bytearray", "dict", "tensor", "parameter", "int"],
)
def test_text_bytes_mappings_tensors_and_scalars_are_not(value):
    """What iterates as characters, keys or slices is not a list of values a user meant."""
    assert not is_list_of_values(value)
