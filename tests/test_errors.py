"""How opmagic's errors show in IPython: the message alone, wrapped to the terminal."""

from __future__ import annotations

from opmagic.errors import OpmagicError, UnknownOperatorError, wrap_to_terminal

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
