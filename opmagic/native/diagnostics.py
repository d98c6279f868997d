"""Compiler output turned into diagnostics that point at the user's source lines.

GCC reports ``file:line:col: error: message``, preceded by context lines (``In function``,
``In instantiation of``, ``required from here``) and followed by notes. An error inside a
torch header is about the user line that instantiated the template: :attr:`Diagnostic.user_line`
is that line, so the message can point at the cell line to fix. nvcc and NVRTC (NVIDIA's EDG
front end) report ``file(line): error: message``, with the instantiation site after it
(``detected during ... at line 12 of "cell.cu"``), and their tools ``ptxas error : ...``.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass

from ..dispatch.keys import catalogue
from ..dispatch.sites import shorten_path

_LOCATED = re.compile(
    r"^(?P<file>[^\s:][^:]*):(?P<line>\d+):(?:(?P<column>\d+):)? "
    r"(?P<severity>fatal error|error|warning|note): (?P<message>.*)$"
)
_TOOL = re.compile(
    r"^(?P<file>[\w.+-]+): (?P<severity>fatal error|error|warning): (?P<message>.*)$"
)
_EDG = re.compile(
    r"^(?P<file>[^\s(][^(]*)\((?P<line>\d+)\): (?P<severity>catastrophic error|error|warning"
    r"|remark)(?: #[\w-]+)?: (?P<message>.*)$"
)
_NVIDIA_TOOL = re.compile(
    r"^(?P<file>nvcc|ptxas|nvlink|fatbinary|cicc) (?P<severity>fatal|error|warning)\s*: "
    r"(?P<message>.*)$"
)
_EDG_SITE = re.compile(r'at line (?P<line>\d+) of "?(?P<file>[^"\s]+)"?')
_SEVERITY = {"catastrophic error": "fatal error", "fatal": "fatal error", "remark": "note"}
_CONTEXT_SITE = re.compile(
    r"^(?:In file included from |\s+from )?(?P<file>[^\s:][^:]*):(?P<line>\d+)"
)
_SOURCE_EXCERPT = re.compile(r"^\s*\d*\s*\|")
_UNKNOWN_KEY = re.compile(r"['‘](\w+)['’] is not a member of ['‘]c10::DispatchKey['’]")
ERRORS = ("error", "fatal error")


@dataclass(frozen=True)
class Diagnostic:
    """One compiler message, with the context lines that led to it."""

    severity: str  # "fatal error", "error", "warning" or "note"
    message: str
    file: str | None  # as the compiler names it; None for driver messages ("g++: error: ...")
    line: int | None
    column: int | None
    context: tuple[str, ...] = ()  # "In function ...", "required from here", ... lines before it
    user_line: int | None = None  # the line of the user's source this message is about
    in_source: bool = False  # reported in the user's source itself (not in a header)

    @property
    def is_error(self) -> bool:
        """Whether this stops the build (an error or a fatal error)."""
        return self.severity in ERRORS


def parse_diagnostics(output: str, source_name: str) -> tuple[Diagnostic, ...]:
    """Every diagnostic in compiler ``output``; ``source_name`` is the user file as compiled."""
    found: list[Diagnostic] = []
    context: list[str] = []
    for raw in output.splitlines():
        line = raw.rstrip()
        if not line or _SOURCE_EXCERPT.match(line):
            continue
        match = (
            _LOCATED.match(line)
            or _TOOL.match(line)
            or _EDG.match(line)
            or _NVIDIA_TOOL.match(line)
        )
        if match is None:
            site = _EDG_SITE.search(line)
            if site and found and found[-1].user_line is None and site["file"] == source_name:
                found[-1] = dataclasses.replace(found[-1], user_line=int(site["line"]))
            context.append(line.strip())
            continue
        fields = match.groupdict()
        fields["severity"] = _SEVERITY.get(fields["severity"], fields["severity"])
        file = fields["file"]
        number = int(fields["line"]) if fields.get("line") else None
        column = int(fields["column"]) if fields.get("column") else None
        own = number if file == source_name else None
        found.append(
            Diagnostic(
                fields["severity"],
                fields["message"],
                file,
                number,
                column,
                tuple(context),
                own if own is not None else _user_line(context, source_name),
                own is not None,
            )
        )
        context = []
    return tuple(found)


def _user_line(context: list[str], source_name: str) -> int | None:
    """The last line of the user's file in the context chain (where a template was used)."""
    for entry in reversed(context):
        match = _CONTEXT_SITE.match(entry)
        if match and match["file"] == source_name:
            return int(match["line"])
    return None


def first_error(diagnostics: tuple[Diagnostic, ...]) -> Diagnostic | None:
    """The first error: the one to fix first (later errors often follow from it)."""
    return next((d for d in diagnostics if d.is_error), None)


def hint_for(message: str) -> str | None:
    """A plain-words explanation for compiler messages that are hard to read."""
    unknown_key = _UNKNOWN_KEY.search(message)
    if unknown_key:
        keys = catalogue()
        names = [*keys.by_name, *keys.aliases]
        close = difflib.get_close_matches(unknown_key[1], names, n=3)
        maybe = f" (did you mean {', '.join(close)}?)" if close else ""
        return (
            f"{unknown_key[1]} is not a dispatch key{maybe}. TORCH_LIBRARY_IMPL takes a key "
            "such as CPU, CUDA, Meta, Autograd, AutogradCPU, AutocastCPU, "
            "CompositeImplicitAutograd or CompositeExplicitAutograd."
        )
    return None


def source_excerpt(
    source: str, line: int, first_line: int, radius: int = 2
) -> list[tuple[int, str, bool]]:
    """``(displayed line number, text, is the line itself)`` around ``line`` of ``source``.

    ``first_line`` is the number the source's first line has where the user sees it (a cell
    body starts at line 2 of a ``%%torch_library`` cell).
    """
    lines = source.splitlines()
    start, stop = max(1, line - radius), min(len(lines), line + radius)
    return [(n + first_line - 1, lines[n - 1], n == line) for n in range(start, stop + 1)]


def where(label: str, line: int | None, first_line: int) -> str:
    """``cell [3], line 6`` for line 5 of a source labelled ``cell [3]`` starting at line 2."""
    if line is None:
        return label
    return f"{label}, line {line + first_line - 1}"


def failure_text(
    library: str,
    diagnostics: tuple[Diagnostic, ...],
    source: str,
    label: str,
    first_line: int,
) -> str:
    """The message of a failed compile: the first error, its source line, the error count."""
    error = first_error(diagnostics)
    errors = sum(1 for d in diagnostics if d.is_error)
    warnings = sum(1 for d in diagnostics if d.severity == "warning")
    if error is None:
        return (
            f"{library}: the compiler failed without an error message; its output is in "
            "CompileError.log (or run with verbose=True)."
        )
    lines = [f"{library}: compile error at {where(label, error.user_line, first_line)}:"]
    message = error.message
    if error.file == "collect2" and error.context:  # "ld returned 1 exit status": say why
        lines[0] = f"{library}: link error:"
        message = "\n  ".join(error.context)
    if error.file is not None and error.line is not None and not error.in_source:
        message += f"  [reported in {shorten_path(error.file)}:{error.line}]"
    lines.append(f"  {message}")
    hint = hint_for(error.message)
    if hint:
        lines.append(f"  hint: {hint}")
    if error.user_line is not None:
        width = len(str(error.user_line + first_line + 2))
        for number, text, is_it in source_excerpt(source, error.user_line, first_line):
            lines.append(f"  {'>' if is_it else ' '} {number:>{width}} | {text}")
            if is_it and error.column and error.in_source:
                lines.append(f"    {' ' * width} | {' ' * (error.column - 1)}^")
    summary = f"{errors} error{'s' if errors != 1 else ''}"
    if warnings:
        summary += f", {warnings} warning{'s' if warnings != 1 else ''}"
    lines.append(f"{summary}; the full compiler output is in CompileError.log.")
    return "\n".join(lines)
