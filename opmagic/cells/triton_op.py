"""``triton_op_from_source``: a ``torch.library.triton_op`` from the Python source of one cell.

The source holds ``@triton.jit`` kernels and one type-hinted launcher that launches them
through ``wrap_triton``, as PyTorch recommends for a kernel ``torch.compile`` can see into::

    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask)
        tl.store(out_ptr + offsets, x + tl.load(y_ptr + offsets, mask=mask), mask=mask)

    def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:     # the launcher: the op
        out = torch.empty_like(x)
        n = out.numel()
        wrap_triton(add_kernel)[(triton.cdiv(n, 256),)](x, y, out, n, BLOCK=256)
        return out

The launcher is found as ``%%custom_op`` finds its function, and the companions
(``@fake``, ``@setup_context``/``@backward``, ``@vmap``, ...) are ``%%custom_op``'s: this is
its machinery (:func:`~opmagic.cells.custom_op.define_op_from_source`) with
``torch.library.triton_op`` making the op. The kernels are made for the GPU, or for Triton's
interpreter when there is none (or ``interpret=True``): see :mod:`opmagic.native.triton`.
In a session the kernels belong to the cell: a re-run's new kernels replace them, and what
Triton compiled for the old ones is dropped.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import ArgumentTypeError
from ..native.triton import (
    INTERPRETER,
    TritonKernels,
    choose_mode,
    instrument_cell_kernels,
    keep_interpreted_op_whole,
    kernels_made_for,
    referenced_names,
    require_triton,
)
from .custom_op import (
    CustomOpResult,
    KernelRow,
    define_op_from_source,
    note_op_source,
    parse_operator_name,
    source_file,
)
from .session import active_session

_sources = itertools.count(1)  # numbers the file names of sources that come without one
_FUNCTIONALIZATION = "FunctionalTensorMode"  # the mode triton_op registers its own rule for


@dataclass(frozen=True)
class TritonKernelRow:
    """One Triton kernel the cell defined, and how the op uses it."""

    name: str
    role: str  # "launched by add", "called by add_kernel", "not launched by add"
    where: str  # "cell [3], line 2"


@dataclass(eq=False)
class TritonOpResult(CustomOpResult):
    """What ``%%triton_op`` made: a :class:`CustomOpResult` for a ``triton_op``, with its
    Triton kernels and how they run."""

    mode: str = INTERPRETER  # "interpreter" or "device"
    why: str = ""  # why that mode: "this torch is a CPU build: ...", "compiled for H100"
    triton_kernels: tuple[TritonKernelRow, ...] = ()

    def __post_init__(self) -> None:
        """The custom op's table and kernels; the rule ``triton_op`` itself registers for
        functionalization said in words instead of naming torch's (or opmagic's) code."""
        super().__post_init__()
        what = (
            "keeps the op whole (interpreted kernels cannot be traced)"
            if self.mode == INTERPRETER
            else "decomposes into the launcher (torch.compile sees the kernels)"
        )
        self.kernels = tuple(
            KernelRow(row.key, row.role, f"(triton_op: {what})", "")
            if row.role == f"rule under {_FUNCTIONALIZATION}"
            else row
            for row in self.kernels
        )


def triton_op_from_source(
    source: str,
    name: str,
    *,
    mutates_args: Iterable[str] | str = (),
    namespace: dict[str, Any] | None = None,
    filename: str | None = None,
    interpret: bool | None = None,
) -> TritonOpResult:
    """Make ``torch.library.triton_op(name)`` from the launcher and kernels in ``source``.

    ``source`` runs in ``namespace`` (a fresh one when ``None``) with ``%%custom_op``'s
    companion decorators; ``mutates_args`` is ``triton_op``'s. ``interpret``: ``None`` makes
    the kernels for the GPU when there is one and for Triton's interpreter otherwise; ``True``
    always for the interpreter; ``False`` always for the GPU. ``filename`` names the source
    in tracebacks and tables (IPython passes the cell's). The op is bound in ``namespace``
    under the launcher's name. Problems with the source raise
    :class:`~opmagic.errors.CellSourceError` at its line; a Triton error in a kernel, found
    when the op runs, raises :class:`~opmagic.errors.TritonKernelError` at the kernel's line.
    """
    _check_arguments(source, name, namespace, filename, interpret, mutates_args)
    require_triton()
    mode, why = choose_mode(interpret)
    qualname = parse_operator_name(name)
    if filename is None:  # unique: kernels read their source from the line cache when they run
        filename = source_file(f"<triton_op {qualname} #{next(_sources)}>", source)
    namespace = {} if namespace is None else namespace
    made: list[tuple[TritonKernels, Callable[..., Any]]] = []

    def make_op(launcher: Callable[..., Any]) -> Any:
        """The cell's kernels instrumented (and owned by its run), then the triton_op."""
        kernels = instrument_cell_kernels(namespace, filename, mode)
        made.append((kernels, launcher))
        session = active_session()
        if session is not None:
            session.track(kernels, kernels.description)
        op = torch.library.triton_op(qualname, mutates_args=mutates_args)(launcher)
        if mode == INTERPRETER:
            keep_interpreted_op_whole(op)
        return op

    op, launcher_name, notes = define_op_from_source(
        source,
        qualname,
        filename,
        namespace,
        make_op,
        mutates_args=mutates_args,
        schema=None,
        schema_option=False,  # triton_op infers it
        running=lambda: kernels_made_for(mode),
    )
    rows = _kernel_rows(*made[-1], launcher_name)
    note_op_source("triton_op", source, qualname, launcher_name, {"mutates_args": mutates_args})
    return TritonOpResult(
        op, qualname, launcher_name, notes, mode=mode, why=why, triton_kernels=rows
    )


def _check_arguments(
    source: Any, name: Any, namespace: Any, filename: Any, interpret: Any, mutates_args: Any
) -> None:
    """Arguments of :func:`triton_op_from_source` of the wrong type, named."""
    expected = (
        ("source", source, str, "the cell's Python source"),
        ("name", name, str, "'namespace::name'"),
        ("namespace", namespace, (dict, type(None)), "a dict or None"),
        ("filename", filename, (str, type(None)), "a str or None"),
        ("interpret", interpret, (bool, type(None)), "True, False or None"),
        ("mutates_args", mutates_args, (str, list, tuple, set, frozenset), "argument names"),
    )
    for what, value, kind, takes in expected:
        if not isinstance(value, kind):
            raise ArgumentTypeError(
                f"triton_op_from_source: {what} must be {takes}, got {type(value).__name__} "
                f"{value!r:.60}."
            )


def _kernel_rows(
    kernels: TritonKernels, function: Callable[..., Any], launcher: str
) -> tuple[TritonKernelRow, ...]:
    """How the op uses each kernel of the cell: launched by the launcher, called by another
    kernel, or neither."""
    launched = referenced_names(function)
    callers = {k.name: referenced_names(k.function) for k in kernels.kernels}
    rows = []
    for kernel in kernels.kernels:
        by = [name for name, uses in callers.items() if name != kernel.name and kernel.name in uses]
        if kernel.name in launched and not by:
            role = f"launched by {launcher}"
        elif by:
            role = f"called by {', '.join(by)}"
        else:
            role = f"not launched by {launcher}"
        rows.append(TritonKernelRow(kernel.name, role, kernel.where))
    return tuple(rows)


__all__ = ["TritonKernelRow", "TritonOpResult", "triton_op_from_source"]
