"""Text and HTML for Triton: a ``%%triton_op`` cell's summary and one kernel launch (as a trace
lists it under the call that made it)."""

from __future__ import annotations

from html import escape
from typing import Any

from ..cells.triton_op import TritonOpResult
from ..display import renders
from ..native.triton import INTERPRETER, TritonLaunch
from .cells import custom_op_html, custom_op_text
from .layout import aligned, fitted, html_rows

_OPAQUE = (
    "torch.compile and export see the op as one call: they cannot trace interpreted kernels"
)


def _mode_line(result: TritonOpResult) -> str:
    """How the kernels run, and why that way."""
    how = "Triton's interpreter" if result.mode == INTERPRETER else "compiled for the GPU"
    return f"kernels: {how} ({result.why})"


def _kernel_rows(result: TritonOpResult) -> list[tuple[str, str, str]]:
    """(kernel, how the op uses it, where) per Triton kernel of the cell."""
    return [(k.name, k.role, k.where) for k in result.triton_kernels]


@renders(TritonOpResult, "text")
def triton_op_text(result: TritonOpResult) -> str:
    """The custom-op summary with how the kernels run and each kernel at its cell line."""
    details = fitted([f"  {_mode_line(result)}"])
    if result.mode == INTERPRETER:
        details += fitted([f"  note: {_OPAQUE}"])
    if result.triton_kernels:
        details.append("  Triton kernels of the cell:")
        details += aligned(_kernel_rows(result), "    ")
    else:
        details.append("  Triton kernels of the cell: none (the launcher's come from elsewhere)")
    return custom_op_text(result, details)


@renders(TritonOpResult, "html")
def triton_op_html(result: TritonOpResult) -> str:
    """:func:`triton_op_text` as HTML."""
    note = f'<div class="dim">note: {escape(_OPAQUE)}</div>' if result.mode == INTERPRETER else ""
    kernels = (
        html_rows(_kernel_rows(result), ("Triton kernel", "used", "where"))
        if result.triton_kernels
        else '<div class="dim">no Triton kernel in the cell</div>'
    )
    return custom_op_html(result, f"<div>{escape(_mode_line(result))}</div>{note}{kernels}")


def _grid(launch: TritonLaunch) -> str:
    """``(4,)`` as ``grid (4,)``, or why it is unknown."""
    return f"grid {launch.grid}" if isinstance(launch.grid, tuple) else launch.grid


def _values(pairs: tuple[tuple[str, Any], ...]) -> str:
    """``BLOCK=256, num_warps=4``."""
    return ", ".join(f"{name}={value}" for name, value in pairs)


@renders(TritonLaunch, "text")
def launch_text(launch: TritonLaunch) -> str:
    """``launch add_kernel grid (4,) BLOCK=256 (x_ptr=float32[1000], ...) · where · mode``."""
    meta = f" {_values(launch.meta)}" if launch.meta else ""
    return (
        f"launch {launch.kernel} {_grid(launch)}{meta} ({_values(launch.arguments)})"
        f" · {launch.where} · {launch.mode}"
    )


@renders(TritonLaunch, "html")
def launch_html(launch: TritonLaunch) -> str:
    """:func:`launch_text` as one HTML line, the kernel's arguments dimmed."""
    meta = f" {escape(_values(launch.meta))}" if launch.meta else ""
    return (
        f'<span class="op">launch {escape(launch.kernel)}</span> {escape(_grid(launch))}{meta} '
        f'<span class="dim">({escape(_values(launch.arguments))}) · {escape(launch.where)} · '
        f"{escape(launch.mode)}</span>"
    )
