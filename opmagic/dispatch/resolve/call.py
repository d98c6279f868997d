"""The call being resolved, as kernel handlers see it, and what a kernel does next.

The simulator owns one :class:`OperatorCall` per ``resolve``; handlers read it and answer
with a :class:`KernelOutcome`, which the simulator applies to :class:`DispatchState`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..keys import KeyCatalogue
from ..ops import OpRef
from ..table import OperatorTable, TableEntry
from .binding import BoundArgument, DispatchValue


@dataclass
class DispatchState:
    """The thread-local dispatcher state and the arguments, as the walk reaches a kernel."""

    values: list[DispatchValue]  # the tensors the next dispatch reads keys from
    included: int  # raw TLS include set
    excluded: int  # raw TLS exclude set
    modes: list[Any]  # the TorchDispatchMode stack, innermost last
    layers: list[tuple[str, int]]  # the torch.func transforms (name, level), innermost last
    saved_tls: list[tuple[int, int]] = field(default_factory=list)  # functorch front entries
    excluded_by: list[tuple[int, str]] = field(default_factory=list)  # (bits, kernel key)
    assumed: bool = False  # reached only if a Python handler calls the op again


@dataclass
class KernelOutcome:
    """What a kernel does after it runs, and the state the next dispatch sees."""

    action: str  # as Step.action: "ends" | "redispatch" | "call" | "python" | "error"
    note: str  # what it does, in one line (the error message for "error")
    keyset: int | None = None  # redispatch: the keyset passed on
    masked: int = 0  # redispatch: keys below the kernel that its mask drops
    include: int = 0  # call: keys added to the TLS include set
    uninclude: int = 0  # call: keys removed from the TLS include set
    exclude: int = 0  # keys the kernel's guard adds to the TLS exclude set
    tls: tuple[int, int] | None = None  # call: the TLS (include, exclude) to restore first
    values: list[DispatchValue] | None = None  # the tensors it passes on, when they change
    pop_mode: bool = False  # call: the innermost TorchDispatchMode is popped
    pop_layer: bool = False  # call: the innermost torch.func transform is left
    assumed: bool = False  # call: made by Python code that usually, not surely, does so
    start_at: str | None = None  # call: the kernel of this key runs first (callBoxedForKey)
    fails_after: str | None = None  # why the kernel raises once the rest of the path returns


@dataclass
class OperatorCall:
    """One call being resolved: the overload, its table and arguments, and the walk's state."""

    ref: OpRef
    table: OperatorTable
    arguments: list[BoundArgument]
    catalogue: KeyCatalogue
    state: DispatchState  # changes as the walk goes on
    custom_op: dict[str, Any] | None  # torch.library.custom_op's parts (fake, backward, ...)
    custom_op_sites: set[str]  # where an opmagic session recorded custom_op's kernels

    @property
    def schema(self) -> Any:
        """The overload's ``FunctionSchema``."""
        return self.table.schema_obj

    def python_arguments(self) -> tuple[tuple, dict[str, Any]]:
        """``(args, kwargs)`` as Python handlers get them: positional arguments in order,
        keyword-only ones by name."""
        pairs = list(zip(self.arguments, self.schema.arguments, strict=True))
        args = tuple(bound.value for bound, param in pairs if not param.kwarg_only)
        kwargs = {bound.name: bound.value for bound, param in pairs if param.kwarg_only}
        return args, kwargs

    def custom_op_kernel(self, entry: TableEntry) -> dict[str, Any] | None:
        """custom_op's parts when custom_op made the entry's kernel (an opmagic session
        records a cell line for it), else None."""
        site = entry.site or ""
        if "custom_ops.py" in site or site in self.custom_op_sites:
            return self.custom_op
        return None
