"""Text and HTML forms of a loaded library (what it registered) and of a compile error."""

from __future__ import annotations

from collections.abc import Iterator
from html import escape
from typing import TYPE_CHECKING

from ..dispatch.sites import label_site
from ..display import renders
from ..errors import CompileError
from ..native.diagnostics import first_error, hint_for, source_excerpt, where
from ..native.library import LoadedLibrary
from .style import FAIL_COLOUR, styled
from .text import aligned, fitted

if TYPE_CHECKING:
    from ..native.snapshots import NewKernel


def build_summary(library: LoadedLibrary) -> str:
    """One line: where the library came from and what building and registering took."""
    build = library.build
    if build.cached:
        how = "from the cache"
    else:
        how = f"built in {build.seconds:.1f} s"
        if build.headers_seconds:
            how += f" (of which {build.headers_seconds:.1f} s precompiling headers, once)"
        if build.repaired:
            how += f" again, as the cache's copy was damaged ({build.repaired})"
    headers = (
        f"precompiled {build.header_set} headers"
        if build.precompiled
        else f"no precompiled headers: {build.note}"
    )
    state = (
        "unregistered" if library.closed else f"registered in {library.load_seconds * 1000:.0f} ms"
    )
    return f"lib{library.name}.so ({library.label}): {how}, {headers}; {state}"


def _kernels_by_key(kernels: tuple[NewKernel, ...]) -> Iterator[tuple[str, list[NewKernel]]]:
    """Kernels grouped by their key (``Autograd [alias]`` for alias keys), in order."""
    by_key: dict[str, list[NewKernel]] = {}
    for kernel in kernels:
        by_key.setdefault(kernel.key + (" [alias]" if kernel.is_alias else ""), []).append(kernel)
    yield from by_key.items()


def _overrides(kernel: NewKernel) -> str:
    """``overrides aten/src/ATen/RegisterCPU.cpp:12`` when the kernel replaced another."""
    return f"overrides {label_site(kernel.overrides)}" if kernel.overrides else ""


@renders(LoadedLibrary, "text")
def library_text(library: LoadedLibrary) -> str:
    """What the library registered: operators, kernels per key, then each operator's table."""
    lines = fitted([build_summary(library)])
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
    tables = "".join(table._repr_html_() for table in library.tables())
    return styled("".join(parts)) + tables


@renders(CompileError, "html")
def compile_error_html(error: CompileError) -> str:
    """The first error beside its source line (highlighted), the full log collapsed."""
    first = first_error(error.diagnostics)
    head = escape(str(error).splitlines()[0])
    body = ""
    if first is not None:
        body += f'<div style="color:{FAIL_COLOUR}"><b>{escape(first.message)}</b></div>'
        hint = hint_for(first.message)
        if hint:
            body += f"<div>hint: {escape(hint)}</div>"
        if first.user_line is not None:
            rows = "".join(
                f'<tr style="background:{"#ffebee" if is_it else "transparent"}">'
                f'<td class="dim">{number}</td><td><pre style="margin:0">{escape(text)}</pre></td>'
                "</tr>"
                for number, text, is_it in source_excerpt(
                    error.source, first.user_line, error.first_line
                )
            )
            body += f"<table>{rows}</table>"
        elif first.file is None:
            body += f'<div class="dim">{escape(where(error.label, None, error.first_line))}</div>'
    count = len(error.log.splitlines())
    log = (
        f"<details><summary>full compiler output ({count} lines)</summary>"
        f"<pre>{escape(error.command)}\n\n{escape(error.log)}</pre></details>"
    )
    return styled(f"<div><b>{head}</b></div>{body}{log}")
