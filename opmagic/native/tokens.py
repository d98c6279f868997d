"""C++ (and CUDA C++) source as tokens: the lexical layer every scanner of sources reads.

Comments are dropped, string and character literals (raw strings included) are one token
each, and so is each preprocessor directive (with its continuation lines), so that no scanner
mistakes text in them for code. No semantic analysis: macros are not expanded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<comment>//[^\n]*|/\*.*?\*/)
  | (?P<raw>R"(?P<delim>[^()\\\s]{0,16})\(.*?\)(?P=delim)")
  | (?P<string>(?:u8|[uUL])?"(?:\\.|[^"\\\n])*")
  | (?P<char>(?:u8|[uUL])?'(?:\\.|[^'\\\n])*')
  | (?P<id>[A-Za-z_]\w*)
  | (?P<number>\.?\d(?:[eEpP][+-]|[\w.'])*)
  | (?P<launch><<<|>>>)
  | (?P<punct>::|->|.)
    """,
    re.S | re.X,
)
_DIRECTIVE = re.compile(r"#(?:[^\n\\]|\\.)*", re.S)


@dataclass(frozen=True)
class Token:
    """One token of the source: its kind, text, offsets and line."""

    kind: str  # "id", "number", "string", "char", "punct", "launch", "directive"
    text: str
    start: int
    end: int
    line: int


def tokenize(source: str) -> list[Token]:
    """The tokens of ``source``: comments dropped, each preprocessor directive one token."""
    tokens: list[Token] = []
    position, line = 0, 1
    while position < len(source):
        if source[position] == "#" and _only_blanks_before(source, position):
            directive = _DIRECTIVE.match(source, position)
            assert directive is not None  # "#" followed by anything matches
            end = directive.end()
            tokens.append(Token("directive", source[position:end], position, end, line))
        else:
            match = _TOKEN.match(source, position)
            assert match is not None  # "." matches any character
            kind = "string" if match.lastgroup in ("raw", "delim") else str(match.lastgroup)
            end = match.end()
            if kind not in ("space", "comment"):
                tokens.append(Token(kind, match.group(), position, end, line))
        line += source.count("\n", position, end)
        position = end
    return tokens


def _only_blanks_before(source: str, position: int) -> bool:
    """Whether only spaces and tabs precede ``position`` on its line (where directives start)."""
    line_start = source.rfind("\n", 0, position) + 1
    return not source[line_start:position].strip(" \t")
