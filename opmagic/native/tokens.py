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


def plain_function_name(function: str) -> str:
    """``foo`` of ``ns::foo(int) const`` or of ``foo()::{lambda()#1}::operator()() const``."""
    function = function.split("::{lambda", 1)[0]
    depth, cut = 0, len(function)
    for index, char in enumerate(function):  # drop the parameters (and template arguments)
        if char in "<(":
            if depth == 0 and char == "(":
                cut = index
                break
            depth += 1
        elif char in ">)":
            depth -= 1
    name = re.sub(r"<.*>", "", function[:cut])
    return name.rsplit("::", 1)[-1].strip()


def function_definitions(source: str) -> dict[str, int]:
    """The line of each function the source defines (``name(...) ... {``), first one wins."""
    tokens = tokenize(source)
    found: dict[str, int] = {}
    for index, token in enumerate(tokens[:-1]):
        if token.kind != "id" or tokens[index + 1].text != "(" or token.text in found:
            continue
        depth, position = 0, index + 1
        while position < len(tokens):
            text = tokens[position].text
            depth += text == "("
            depth -= text == ")"
            position += 1
            if depth == 0:
                break
        for follower in tokens[position : position + 12]:
            if follower.text in ("{", ":"):
                found[token.text] = token.line
                break
            if follower.text in (";", ",", ")", "=", "}"):
                break
    return found
