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
from .tokens import function_definitions, plain_function_name, tokenize

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
_MARGIN = re.compile(r"^(?P<pad> *)(?P<number>\d+)(?P<rest> \|.*)$")  # GCC's "  12 | code"
_LINKER = re.compile(r"^(?:ld(?:\.\w+)?|mold)$")  # linkers that name themselves in messages
_LINK_FAILED = re.compile(r"\bld returned \d+ exit status")  # the driver's closing line
# what a linker could not resolve or found twice: GNU ld and gold quote it, lld and mold not
_LINK_SYMBOL = re.compile(
    r"(?:undefined reference to|multiple definition of) [`'‘]([^'’`]+)['’`]"
    r"|(?:undefined|duplicate) symbol: ([^\n]+)"
)
# the function whose code refers to it: ld's "in function `f'", gold's ":function f: error",
# lld's and mold's ">>> referenced by ... f.o:(f)"
_LINK_FUNCTION = re.compile(
    r"in function [`'‘]([^'’`]+)['’`]|:function (.+?): (?:error|warning)|>>> +\S+:\((.+)\)"
)
_TAB_STOP = 8  # GCC's -ftabstop default, by which it counts columns after a tab
ERRORS = ("error", "fatal error")
MAX_SHOWN_ERRORS = 10  # errors a message shows at their lines; the log has every one


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


def locate_link_errors(
    diagnostics: tuple[Diagnostic, ...], source: str
) -> tuple[Diagnostic, ...]:
    """Link errors given the source line they are about: where the function the linker names
    (``in function `f()'``) uses the symbol it could not resolve or found twice (``undefined
    reference to `g()'``, ``multiple definition of``, lld's and mold's ``undefined symbol:``),
    else that function's definition, else the symbol's first mention."""
    located = []
    for index, diagnostic in enumerate(diagnostics):
        if diagnostic.is_error and diagnostic.user_line is None and _is_link_error(diagnostic):
            # lld and mold say where the symbol is referenced on the lines after the error
            after = diagnostics[index + 1].context if index + 1 < len(diagnostics) else ()
            text = "\n".join([*diagnostic.context, diagnostic.message, *after])
            line = _link_error_line(text, source)
            diagnostic = dataclasses.replace(diagnostic, user_line=line)
        located.append(diagnostic)
    return tuple(located)


def _is_link_error(diagnostic: Diagnostic) -> bool:
    """Whether the linker (or the driver's ``collect2``, for it) reported it."""
    return diagnostic.file is not None and (
        diagnostic.file == "collect2" or _LINKER.match(diagnostic.file) is not None
    )


def _link_error_line(text: str, source: str) -> int | None:
    """The source line a linker's message is about (see :func:`locate_link_errors`)."""
    symbol = _LINK_SYMBOL.search(text)
    if symbol is None:
        return None
    name = plain_function_name(next(group for group in symbol.groups() if group))
    function = _LINK_FUNCTION.search(text)
    definitions = function_definitions(source)
    start = None
    if function is not None:
        start = definitions.get(plain_function_name(next(g for g in function.groups() if g)))
    mentions = [t.line for t in tokenize(source) if t.kind == "id" and t.text == name]
    after = [line for line in mentions if start is None or line >= start]
    return after[0] if after else start if start is not None else definitions.get(name)


def first_error(diagnostics: tuple[Diagnostic, ...]) -> Diagnostic | None:
    """The first error: the one to fix first (later errors often follow from it)."""
    return next((d for d in diagnostics if d.is_error), None)


def reported_errors(diagnostics: tuple[Diagnostic, ...]) -> list[Diagnostic]:
    """Every error of a build, in the compiler's order, each once (one message at one place).

    The compiler driver's closing "ld returned 1 exit status" is left out where the linker
    said why itself (lld and mold do; GCC's collect2 line then adds nothing).
    """
    seen: set[tuple] = set()
    errors = []
    for diagnostic in diagnostics:
        identity = (diagnostic.user_line, diagnostic.column, diagnostic.message)
        if diagnostic.is_error and identity not in seen:
            seen.add(identity)
            errors.append(diagnostic)
    if any(e.file is not None and _LINKER.match(e.file) for e in errors):
        errors = [e for e in errors if not _LINK_FAILED.search(e.message)]
    return errors


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


@dataclass(frozen=True)
class ExcerptLine:
    """One line of a source excerpt, as the user numbers it."""

    number: int
    text: str  # tabs expanded to the compiler's tab stops, so that columns line up
    is_it: bool  # the line the diagnostic is about
    caret: int | None = None  # on that line: the offset of the diagnostic's column


def source_excerpt(
    source: str, diagnostic: Diagnostic, first_line: int, radius: int = 2
) -> list[ExcerptLine]:
    """The lines around the source line ``diagnostic`` is about (none when it has none).

    ``first_line`` is the number the source's first line has where the user sees it (a cell
    body starts at line 2 of a ``%%torch_library`` cell). The caret is given when the
    compiler reported a column in the source itself (GCC counts a tab up to the next tab
    stop of 8, as the expanded text does).
    """
    line = diagnostic.user_line
    lines = source.splitlines()
    if line is None or not 1 <= line <= len(lines):
        return []
    start, stop = max(1, line - radius), min(len(lines), line + radius)
    caret = diagnostic.column - 1 if diagnostic.column and diagnostic.in_source else None
    return [
        ExcerptLine(
            n + first_line - 1,
            lines[n - 1].expandtabs(_TAB_STOP),
            n == line,
            caret if n == line else None,
        )
        for n in range(start, stop + 1)
    ]


def excerpt_text(excerpt: list[ExcerptLine], indent: str = "  ") -> list[str]:
    """An excerpt as text: ``> 9 | code``, and the caret under the column on the next line."""
    if not excerpt:
        return []
    width = len(str(excerpt[-1].number))
    lines = []
    for entry in excerpt:
        lines.append(
            f"{indent}{'>' if entry.is_it else ' '} {entry.number:>{width}} | {entry.text}"
        )
        if entry.caret is not None:
            lines.append(f"{indent}  {' ' * width} | {' ' * entry.caret}^")
    return lines


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
    """The message of a failed compile: every error at its source line (the first with more
    context), then the error count."""
    errors = reported_errors(diagnostics)
    warnings = sum(1 for d in diagnostics if d.severity == "warning")
    if not errors:
        return (
            f"{library}: the compiler failed without an error message; its output is in "
            "CompileError.log (or run with verbose=True)."
        )
    lines = []
    for index, error in enumerate(errors[:MAX_SHOWN_ERRORS]):
        place = where(label, error.user_line, first_line)
        head = f"{library}: compile error at {place}:" if index == 0 else f"and at {place}:"
        message = error.message
        if error.file == "collect2" and error.context:  # "ld returned 1 exit status": say why
            head = f"{library}: link error at {place}:"
            message = "\n  ".join(error.context)
        elif error.file is not None and _LINKER.match(error.file):  # ld.lld: error: ...
            head = f"{library}: link error at {place}:"
            message = f"{error.file}: {message}"
        if error.file is not None and error.line is not None and not error.in_source:
            message += f"  [reported in {shorten_path(error.file)}:{error.line}]"
        lines += [head, f"  {message}"]
        hint = hint_for(error.message)
        if hint:
            lines.append(f"  hint: {hint}")
        lines += excerpt_text(source_excerpt(source, error, first_line, 2 if index == 0 else 0))
    summary = f"{len(errors)} error{'s' if len(errors) != 1 else ''}"
    if len(errors) > MAX_SHOWN_ERRORS:
        summary += f" ({len(errors) - MAX_SHOWN_ERRORS} more not shown)"
    if warnings:
        summary += f", {warnings} warning{'s' if warnings != 1 else ''}"
    lines.append(f"{summary}; the full compiler output is in CompileError.log.")
    return "\n".join(lines)


def renumber_log(output: str, source_name: str, first_line: int) -> str:
    """Compiler output with the lines of ``source_name`` numbered as the user sees them.

    GCC (``file:12:5:``, and the ``  12 | code`` margins of its excerpts) and nvcc/NVRTC
    (``file(12):``, ``at line 12 of "file"``) number the lines of the file compiled; the
    user's numbering starts at ``first_line``, so the log agrees with the messages' cell lines.
    """
    shift = first_line - 1
    if not shift:
        return output
    name = re.escape(source_name)
    located = re.compile(rf"(?P<before>(?:^|[\s\"(]){name}(?::|\())(?P<line>\d+)")
    at_line = re.compile(rf"at line (?P<line>\d+) of (?P<file>\"?{name}\b)")
    in_source = False
    renumbered = []
    for line in output.split("\n"):
        margin = _MARGIN.match(line)
        if margin is not None and in_source:
            width = len(margin["pad"]) + len(margin["number"])
            line = f"{int(margin['number']) + shift:>{width}}{margin['rest']}"
        elif margin is None:
            diagnostic = _LOCATED.match(line)
            if diagnostic is not None:
                in_source = diagnostic["file"] == source_name
            line = located.sub(lambda m: f"{m['before']}{int(m['line']) + shift}", line)
            line = at_line.sub(lambda m: f"at line {int(m['line']) + shift} of {m['file']}", line)
        renumbered.append(line)
    return "\n".join(renumbered)
