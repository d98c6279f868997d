"""What the session remembers of each cell besides its registrations: what the cell ran, and the
checks run in it. The export (:mod:`opmagic.package`) turns this into a package and its tests.

- :class:`CellSource`: what a cell ran. Every cell is ``"python"`` (its code, IPython syntax
  translated, as it was compiled) until a front end that makes operators from the cell notes
  what it made (``Session.note_source``): ``"custom_op"``, ``"triton_op"``, ``"torch_library"``,
  ``"cuda_kernel"``, each with the options the operator was made with.
- :class:`CheckRun`: a check the author ran (``Session.record_check``): ``"opcheck"`` (any
  ``torch.library.opcheck`` call in a cell, ``--check`` and ``check_op`` included),
  ``"gradcheck"`` (``check_op``'s), ``"compare"`` (``compare`` and ``--compare``, with the
  reference's results). Its samples are copies, taken when the check ran.
- :class:`CellEntry`: one cell of :meth:`Session.history`, a snapshot: its latest successful
  run's source, checks and state, and what became of later runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from .._torch import custom_op_state, dispatcher

CELL_KINDS = ("python", "custom_op", "triton_op", "torch_library", "cuda_kernel")
# tensors a recorded sample may hold, in bytes: samples are kept in memory and become test
# data files, so a large one is left out (its check is listed as not kept)
MAX_SAMPLE_BYTES = 16 << 20


@dataclass(frozen=True)
class CellSource:
    """What a cell ran: ``kind`` (one of :data:`CELL_KINDS`), the ``text`` it ran (Python, or the
    C++/CUDA source) and the ``options`` the operator was made with (a ``"custom_op"``'s
    ``name``, ``mutates_args``, ...; a C++ library's build flags); ``handle``: what the front end
    tracks for it (the :class:`~opmagic.native.LoadedLibrary` of a C++ cell)."""

    kind: str
    text: str
    options: Mapping[str, Any] = field(default_factory=dict)
    handle: Any = None


@dataclass(frozen=True)
class CheckSample:
    """One set of arguments a check ran on (copies); a comparison's also holds what the
    reference returned (``expected``) and its arguments after the call (``expected_args``)."""

    args: tuple
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    expected: Any = None
    expected_args: tuple | None = None


@dataclass(frozen=True)
class CheckRun:
    """A check run in a cell: ``kind`` (``"opcheck"``, ``"gradcheck"``, ``"compare"``, ...), the
    operator it checked (``"ns::name.overload"``, or ``"ns::name"`` for a packet), its
    samples, and what else the kind needs (``details``: a comparison's ``reference``, ``rtol``
    and ``atol``; opcheck's ``test_utils``). ``cell``: the label of the cell that ran it."""

    kind: str
    op: str
    samples: tuple[CheckSample, ...]
    details: Mapping[str, Any] = field(default_factory=dict)
    cell: str = ""


@dataclass
class CellRun:
    """One run of a cell, as the session keeps it for its history (internal)."""

    key: str
    label: str
    order: int  # the cell's place: its first run's, kept by its re-runs
    sources: list[CellSource] = field(default_factory=list)
    checks: list[CheckRun] = field(default_factory=list)
    statement_lines: set[int] = field(default_factory=set)  # top-level lines that registered
    unkept: list[str] = field(default_factory=list)  # checks whose samples were not kept
    error: str = ""
    detail: str = ""  # what to say of a run that registered nothing (it ran before the session)

    def source(self) -> tuple[CellSource, ...]:
        """The operator-making parts a front end noted, else the cell's Python code."""
        noted = [s for s in self.sources if s.kind != "python"]
        return tuple(noted or self.sources)


@dataclass(frozen=True)
class CellEntry:
    """A cell of the session's history (:meth:`Session.history`).

    ``state``: ``"in effect"`` (its registrations or loaded libraries are in effect),
    ``"nothing in effect"`` (it registered nothing, or all of it was replaced since),
    ``"failed"`` (no run of it succeeded) or ``"replaced"`` (a later cell re-ran it:
    ``detail`` names it). ``sources``, ``checks`` and ``statement_lines`` are its latest
    successful run's (for a failed cell, its failed run's); ``failed_rerun`` says when a later
    run of it failed (the earlier run stays in effect). ``defines``: ``("def", "ns::name")``
    and ``("namespace", ns)`` its run made with torch.library; ``defined_elsewhere``: those of
    them another cell's registration holds now (``(what, that cell's label)``).
    """

    key: str
    label: str
    order: int
    state: str
    detail: str
    sources: tuple[CellSource, ...]
    checks: tuple[CheckRun, ...]
    statement_lines: frozenset[int]
    defines: frozenset[tuple[str, str]] = frozenset()
    defined_elsewhere: tuple[tuple[str, str], ...] = ()
    handles: tuple[Any, ...] = ()
    failed_rerun: str = ""
    unkept: tuple[str, ...] = ()


class UnkeptValue(ValueError):
    """A check's argument the session cannot keep a copy of (the message says which)."""


def operator_label(op: Any) -> str | None:
    """``"ns::name.overload"`` (``.default`` for the default overload) of an OpOverload or a
    custom op, ``"ns::name"`` of a packet; ``None`` for anything else."""
    parts = dispatcher.operator_parts(op)
    if parts is None:
        return None
    namespace, name, overload = parts
    if overload is None and custom_op_state.is_custom_op_def(op):
        overload = ""
    if overload is None:
        return f"{namespace}::{name}"
    return f"{namespace}::{name}.{overload or 'default'}"


def kept_sample(sample: CheckSample) -> CheckSample:
    """A copy of ``sample`` that later changes to its tensors do not reach (tensors cloned,
    ``requires_grad`` kept); raises :class:`UnkeptValue` for what it cannot keep."""
    budget = [MAX_SAMPLE_BYTES]
    return CheckSample(
        tuple(_kept(value, budget) for value in sample.args),
        {str(name): _kept(value, budget) for name, value in dict(sample.kwargs).items()},
        _kept(sample.expected, budget),
        None
        if sample.expected_args is None
        else tuple(_kept(value, budget) for value in sample.expected_args),
    )


_PLAIN = (bool, int, float, complex, str, type(None), torch.dtype, torch.device)


def _kept(value: Any, budget: list[int]) -> Any:
    """``value`` copied: tensors cloned, containers of keepable values rebuilt."""
    if isinstance(value, torch.Tensor):
        if type(value) is not torch.Tensor and not isinstance(value, torch.nn.Parameter):
            raise UnkeptValue(f"a tensor subclass ({type(value).__name__})")
        if value.layout != torch.strided:
            raise UnkeptValue(f"a {value.layout} tensor")
        budget[0] -= value.numel() * value.element_size()
        if budget[0] < 0:
            raise UnkeptValue(f"tensors of over {MAX_SAMPLE_BYTES >> 20} MiB")
        copy = value.detach().clone()
        return copy.requires_grad_(True) if value.requires_grad else copy
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(_kept(item, budget) for item in value)
    if type(value) is dict and all(isinstance(key, str) for key in value):
        return {key: _kept(item, budget) for key, item in value.items()}
    raise UnkeptValue(f"a value of type {type(value).__name__}")
