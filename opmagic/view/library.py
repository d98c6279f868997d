"""Text and HTML forms of a loaded library (what it registered) and of a compile error."""

from __future__ import annotations

from collections.abc import Iterator
from html import escape
from typing import TYPE_CHECKING

from ..dispatch.sites import shorten_path
from ..display import format_duration, renders
from ..errors import CompileError
from ..native.diagnostics import (
    MAX_SHOWN_ERRORS,
    ExcerptLine,
    hint_for,
    reported_errors,
    source_excerpt,
    where,
)
from ..native.library import LoadedLibrary
from .layout import aligned, fitted
from .style import FAIL_COLOUR, FAIL_FILL, styled

if TYPE_CHECKING:
    from ..native.snapshots import NewKernel


def build_summary(library: LoadedLibrary) -> str:
    """One line: where the library came from and what building and registering took."""
    build = library.build
    if build.cached:
        how = "from the cache"
    else:
        how = f"built in {format_duration(build.seconds, 2)}"
        if build.headers_seconds:
            headers_took = format_duration(build.headers_seconds, 2)
            how += f" (of which {headers_took} precompiling headers, once)"
        if build.repaired:
            how += f" (found damaged in the cache: {build.repaired})"
    headers = (
        f"precompiled {build.header_set} headers"
        if build.precompiled
        else f"no precompiled headers: {build.note}"
    )
    registered = f"registered in {format_duration(library.load_seconds, 2)}"
    state = "unregistered" if library.closed else registered
    return f"lib{library.name}.so ({library.label}): {how}, {headers}; {state}"


def _kernels_by_key(kernels: tuple[NewKernel, ...]) -> Iterator[tuple[str, list[NewKernel]]]:
    """Kernels grouped by their key (``Autograd [alias]`` for alias keys), in order."""
    by_key: dict[str, list[NewKernel]] = {}
    for kernel in kernels:
        by_key.setdefault(kernel.key + (" [alias]" if kernel.is_alias else ""), []).append(kernel)
    yield from by_key.items()


def _overrides(kernel: NewKernel) -> str:
    """``overrides aten/src/ATen/RegisterCPU.cpp:12`` when the kernel replaced another."""
    return f"overrides {kernel.overrides_source}" if kernel.overrides else ""


@renders(LoadedLibrary, "text")
def library_text(library: LoadedLibrary) -> str:
    """What the library registered: operators, kernels per key, then each operator's table."""
    lines = fitted([build_summary(library), *(f"  note: {note}" for note in library.notes)])
    if library.operators:
        lines.append("new operators:")
        lines += aligned([(op.schema, library.where(op.line)) for op in library.operators])
    if library.kernels:
        lines.append("kernels added, per dispatch key:")
        lines += aligned(
            [
                (key, kernel.op, library.where(kernel.line) + overrides)
                for key, kernels in _kernels_by_key(library.kernels)
                for kernel in kernels
                for overrides in [f" ({_overrides(kernel)})" if kernel.overrides else ""]
            ]
        )
    if not library.operators and not library.kernels and not library.closed:
        lines.append("no per-operator registrations (fallbacks only, or empty blocks)")
    for table in library.tables():
        lines += ["", str(table)]
    return "\n".join(lines)


@renders(LoadedLibrary, "html")
def library_html(library: LoadedLibrary) -> str:
    """The same as :func:`library_text`, as HTML tables (dispatch tables included)."""
    parts = [f"<b>{escape(build_summary(library))}</b>"]
    parts += [f'<div class="dim">note: {escape(note)}</div>' for note in library.notes]
    if library.operators:
        rows = "".join(
            f"<tr><td>{escape(op.schema)}</td><td>{escape(library.where(op.line))}</td></tr>"
            for op in library.operators
        )
        parts.append(f"<div>new operators</div><table>{rows}</table>")
    if library.kernels:
        rows = "".join(
            f"<tr><td>{escape(key)}</td><td>{escape(k.op)}</td>"
            f"<td>{escape(library.where(k.line))}</td>"
            f"<td class='dim'>{escape(_overrides(k))}</td></tr>"
            for key, kernels in _kernels_by_key(library.kernels)
            for k in kernels
        )
        parts.append(f"<div>kernels added, per dispatch key</div><table>{rows}</table>")
    tables = "".join(table._repr_html_() or "" for table in library.tables())
    return styled("".join(parts)) + tables


@renders(CompileError, "html")
def compile_error_html(error: CompileError) -> str:
    """Every error at its source line (highlighted, the caret under the column), the full
    compiler output folded below."""
    errors = reported_errors(error.diagnostics)
    library = str(error).split(":", 1)[0]
    count = f"{len(errors)} error{'s' if len(errors) != 1 else ''}" if errors else "failed"
    parts = [f"<div><b>{escape(library)}: {count}</b></div>"]
    for index, diagnostic in enumerate(errors[:MAX_SHOWN_ERRORS]):
        place = where(error.label, diagnostic.user_line, error.first_line)
        message = diagnostic.message
        if diagnostic.file is not None and diagnostic.line is not None and not diagnostic.in_source:
            message += f"  [reported in {shorten_path(diagnostic.file)}:{diagnostic.line}]"
        parts.append(
            f'<div style="color:{FAIL_COLOUR};margin-top:6px"><b>{escape(place)}:</b> '
            f"{escape(message)}</div>"
        )
        hint = hint_for(diagnostic.message)
        if hint:
            parts.append(f"<div>hint: {escape(hint)}</div>")
        excerpt = source_excerpt(error.source, diagnostic, error.first_line, 2 if index == 0 else 0)
        if excerpt:
            parts.append(f"<pre>{_excerpt_html(excerpt)}</pre>")
    if len(errors) > MAX_SHOWN_ERRORS:
        parts.append(f"<div class='dim'>{len(errors) - MAX_SHOWN_ERRORS} more in the log</div>")
    if not errors:
        parts.append(f"<pre>{escape(str(error))}</pre>")
    lines = len(error.log.splitlines())
    parts.append(
        f"<details><summary>full compiler output ({lines} lines)</summary>"
        f"<pre>{escape(error.command)}\n\n{escape(error.log)}</pre></details>"
    )
    return styled("".join(parts))


def _excerpt_html(excerpt: list[ExcerptLine]) -> str:
    """Excerpt lines as the text form has them, the line at fault highlighted."""
    width = len(str(excerpt[-1].number))
    rows = []
    for entry in excerpt:
        row = f"{entry.number:>{width}} | {escape(entry.text)}"
        if entry.is_it:
            row = f'<span style="background:{FAIL_FILL}">{row}</span>'
        rows.append(row)
        if entry.caret is not None:
            caret = f'<span style="color:{FAIL_COLOUR}">^</span>'
            rows.append(f"{' ' * width} | {' ' * entry.caret}{caret}")
    return "\n".join(rows)
