"""Text and HTML for quick-path CUDA kernels: the launchers, the op, whether a GPU can run them."""

from __future__ import annotations

from html import escape

from ..cells.cuda_kernel import CudaKernelResult
from ..display import format_duration, renders
from ..native.cuda.nvrtc import CudaKernels
from .cells import own_kernel_rows
from .layout import aligned, html_rows, joined
from .style import styled
from .table import table_html


def _summary(kernels: CudaKernels) -> str:
    """One line: what NVRTC made, for which architecture, and how long it took."""
    binary = kernels.binary
    took = format_duration(kernels.compile_seconds, 2)
    how = "from the cache" if kernels.cached else f"in {took}"
    return f"{kernels.label}: NVRTC compiled {binary.kind.upper()} for {binary.arch} {how}"


def _kernel_rows(kernels: CudaKernels) -> list[tuple[str, str]]:
    """(how to launch it, where it is written) per kernel."""
    return [
        (
            f"{k.name}[grid, block](" + ", ".join(p.name for p in k.parameters) + ")",
            kernels.where(k.line),
        )
        for k in kernels.signatures
    ]


def _gpu_note(kernels: CudaKernels) -> str:
    """What launching does here, when no GPU could run the kernels as they were compiled."""
    return f"{kernels.no_gpu} Launching raises NoGPUError." if kernels.no_gpu else ""


@renders(CudaKernels, "text")
def kernels_text(kernels: CudaKernels) -> str:
    """The launchers the source compiled to."""
    lines = [_summary(kernels), "  launch as (also [grid, block, shared_mem, stream]):"]
    lines += aligned(_kernel_rows(kernels), "    ")
    if kernels.binary.log.strip():
        lines += ["  NVRTC warnings:", *("    " + line for line in kernels.binary.log.splitlines())]
    note = _gpu_note(kernels)
    if note:
        lines.append(f"  note: {note}")
    return "\n".join(lines)


@renders(CudaKernels, "html")
def kernels_html(kernels: CudaKernels) -> str:
    """:func:`kernels_text` as HTML."""
    note = _gpu_note(kernels)
    warnings = (
        f"<details><summary>NVRTC warnings</summary><pre>{escape(kernels.binary.log)}</pre>"
        "</details>"
        if kernels.binary.log.strip()
        else ""
    )
    return styled(
        f"<b>{escape(_summary(kernels))}</b>"
        + html_rows(_kernel_rows(kernels), ("launch as", "where"))
        + warnings
        + (f'<div class="dim">note: {escape(note)}</div>' if note else "")
    )


def _op_line(result: CudaKernelResult) -> str:
    """How the cell's kernels became the op's CUDA kernel."""
    op = result.op
    assert op is not None
    how = "defined here" if op.defined else "added to the existing operator"
    return f"CUDA kernel of {op.schema} ({how}); torch.ops.{op.qualname.replace('::', '.')}(...)"


@renders(CudaKernelResult, "text")
def result_text(result: CudaKernelResult) -> str:
    """The kernels and, with an op, its schema and the keys its own kernels serve."""
    lines = [kernels_text(result.kernels)]
    if result.op is not None:
        lines += [_op_line(result), f"  launch: {result.op.launch}"]
        lines.append("  dispatch table (keys the operator's own kernels serve):")
        lines += aligned(
            [
                (keys, joined(kind, source))
                for keys, kind, source in own_kernel_rows(result.op.table)
            ],
            "    ",
        )
    return "\n".join(lines)


@renders(CudaKernelResult, "html")
def result_html(result: CudaKernelResult) -> str:
    """:func:`result_text` as HTML, the op's dispatch table folded away."""
    parts = [kernels_html(result.kernels)]
    if result.op is not None:
        parts.append(
            styled(
                f"<b>{escape(_op_line(result))}</b>"
                f'<div class="dim">launch: {escape(result.op.launch)}</div>'
                + html_rows(own_kernel_rows(result.op.table), ("keys", "kind", "source"))
                + f"<details><summary>dispatch table</summary>{table_html(result.op.table)}"
                "</details>"
            )
        )
    return "".join(parts)
