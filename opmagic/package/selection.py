"""Which cells of a session go into the package, and why the others do not.

A cell is exported when its latest successful run left registrations (or a loaded C++
library) in effect; it is left out, with the reason, when no run of it succeeded, when a later
cell re-ran it, when nothing it made is in effect any more, when it needs opmagic at run time
(``%%cuda_kernel``'s NVRTC quick path), or when ``cells=`` does not name it. Cells that would
define the same operator or namespace in the package (torch keeps one definition: the package
would fail to import) are refused with the cells named.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..cells.history import CellEntry, CellSource
from ..errors import ExportError

_NUMBER = re.compile(r"\[(\d+)\]")


@dataclass(frozen=True)
class LeftOut:
    """A cell the package leaves out, and why."""

    label: str  # "[4]"
    reason: str


@dataclass(frozen=True)
class Selection:
    """The cells to export (in cell order) and the ones left out."""

    cells: tuple[CellEntry, ...]
    left_out: tuple[LeftOut, ...]


def cell_number(label: str) -> int | None:
    """``4`` for the label ``"[4]"`` (the In [n] of the cell's run), else ``None``."""
    match = _NUMBER.fullmatch(label)
    return int(match[1]) if match else None


def select(history: Sequence[CellEntry], cells: Iterable[int] | None) -> Selection:
    """The cells of ``history`` to export (``cells``: only those, by number) and the others.

    Raises :class:`ExportError` when ``cells`` names a cell that cannot be exported, when
    nothing is left to export, or when two exported cells define the same thing.
    """
    wanted = None if cells is None else set(cells)
    chosen: list[CellEntry] = []
    left_out: list[LeftOut] = []
    refused: dict[int, str] = {}
    for entry in history:
        reason = _why_not(entry)
        number = cell_number(entry.label)
        if reason is None and wanted is not None and number not in wanted:
            reason = "not among cells="
        if reason is None:
            chosen.append(entry)
            continue
        left_out.append(LeftOut(entry.label, reason))
        if number is not None:
            refused[number] = reason
    if wanted is not None:
        _check_wanted(wanted, refused, {cell_number(e.label) for e in chosen})
    if not chosen:
        raise ExportError(_nothing_message(left_out))
    _refuse_clashes(chosen)
    return Selection(tuple(chosen), tuple(left_out))


def _why_not(entry: CellEntry) -> str | None:
    """Why a cell is left out, or ``None`` when it is exported."""
    if entry.state == "failed":
        return f"it failed ({entry.detail})"
    if entry.state == "replaced":
        return entry.detail
    if entry.state != "in effect":
        reason = entry.detail or "it registered nothing"
        return reason + ("; its checks are tests of the package" if entry.checks else "")
    if any(_needs_opmagic(source) for source in entry.sources):
        return (
            "a %%cuda_kernel cell of extern \"C\" kernels (the NVRTC quick path) runs its "
            "launchers through opmagic; write it as a .cu with TORCH_LIBRARY_IMPL(ns, CUDA, m) "
            "blocks (the nvcc full path) to export it"
        )
    return None


def _needs_opmagic(source: CellSource) -> bool:
    """Whether what the cell made runs only with opmagic (NVRTC launchers)."""
    return source.kind == "cuda_kernel" and source.options.get("path") == "nvrtc"


def _check_wanted(wanted: set[int], refused: dict[int, str], chosen: set[int | None]) -> None:
    """Every cell ``cells=`` names must be one that can be exported."""
    for number in sorted(wanted):
        if number in chosen:
            continue
        if number in refused:
            raise ExportError(f"cells= names cell [{number}], which cannot be exported: "
                              f"{refused[number]}.")
        known = ", ".join(f"[{n}]" for n in sorted({*refused, *(c for c in chosen if c)}))
        raise ExportError(
            f"cells= names cell [{number}], which is not a cell of this session (its cells: "
            f"{known or 'none'}); cells are named by the number of their latest run, In [n]."
        )


def _nothing_message(left_out: list[LeftOut]) -> str:
    """The error for a session with nothing to export, saying what became of each cell."""
    if not left_out:
        return (
            "Nothing to export: no cell of this session has registered an operator yet. Define "
            "one (%%custom_op, %%torch_library, torch.library in a cell), then export."
        )
    listing = "; ".join(f"cell {cell.label}: {cell.reason}" for cell in left_out)
    return f"Nothing to export: no cell has operators in effect ({listing})."


def _refuse_clashes(chosen: list[CellEntry]) -> None:
    """Two exported cells must not define the same operator or namespace: torch keeps one
    definition, and the package, running both, would fail to import."""
    exported = {entry.label for entry in chosen}
    for entry in chosen:
        for what, other in entry.defined_elsewhere:
            if other in exported:
                raise ExportError(
                    f"cells {entry.label} and {other} both define {what}: the package would "
                    f"define it twice and fail to import (torch keeps one definition). Re-run "
                    f"cell {entry.label} without it, or leave one of them out with cells=."
                )
    seen: dict[str, str] = {}
    for entry in chosen:
        for name in sorted(defined_by(entry)):
            if name in seen and seen[name] != entry.label:
                raise ExportError(
                    f"cells {seen[name]} and {entry.label} both define {name}: the package would "
                    "define it twice and fail to import (torch keeps one definition). Leave one "
                    "of them out with cells=, or rename one."
                )
            seen.setdefault(name, entry.label)


def defined_by(entry: CellEntry) -> set[str]:
    """What a cell defines that torch keeps one of: ``namespace NS`` (a ``TORCH_LIBRARY``
    block, a ``Library(NS, "DEF")``) and ``operator NS::NAME``."""
    names = {
        f"namespace {name}" if kind == "namespace" else f"operator {name.partition('.')[0]}"
        for kind, name in entry.defines
    }
    for library in native_libraries(entry):
        names |= {f"namespace {b.namespace}" for b in library.blocks if b.kind == "DEF"}
        names |= {f"operator {op.name.partition('.')[0]}" for op in library.operators}
    return names


def native_libraries(entry: CellEntry) -> list:
    """The C++/CUDA libraries a cell loaded that are in effect (its LoadedLibrary handles)."""
    return [
        source.handle
        for source in entry.sources
        if source.kind in ("torch_library", "cuda_kernel") and source.handle is not None
        and source.handle in entry.handles
    ]
