"""What ``opmagic.diff`` returns: every difference between two dispatcher states, named.

A :class:`DispatchDiff` is a snapshot like every opmagic result: its rows are words and
its per-operator tables are computed when it is made, so it displays the same after the
operators it names were changed again or removed.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ..._torch import dispatcher
from ...display import Displayable
from ...errors import UnknownOperatorError
from ..table import TableEntry
from .affected import AffectedCalls, affected_calls
from .labels import entry_text

if TYPE_CHECKING:
    import pandas

What = Literal["operator", "kernel", "fallback", "native route", "derived"]
ChangeKind = Literal["added", "removed", "replaced"]
FRAME_COLUMNS = [
    "op",
    "key",
    "change",
    "before",
    "after",
    "site",
    "what",
    "kind",
    "hides",
    "because",
]


@dataclass(frozen=True)
class Change:
    """One difference between two dispatcher states."""

    what: What
    op: str  # "ns::name[.overload]"; "" for a backend fallback
    key: str  # the dispatch key; "" for a whole operator
    change: ChangeKind
    before: str  # what was there (schema, kernel, table entry or route); "" for nothing
    after: str  # what is there now; "" for nothing
    site: str  # where the new (or the removed) one was registered
    kind: str = ""  # the kernel kind of the new (or the removed) one
    hides: str = ""  # kernels left inactive under the new one, newest first
    because: str = ""  # derived entries: the registrations of the op that changed
    by_torch: bool = False  # torch itself registered it (a lazily imported torch module)

    @property
    def namespace(self) -> str:
        """The operator's namespace (``""`` for a fallback)."""
        return self.op.partition("::")[0] if self.op else ""

    @property
    def overrides_aten(self) -> bool:
        """Whether this puts code other than torch's own in front of an aten operator."""
        return (
            self.what in ("kernel", "native route")
            and self.namespace == "aten"
            and self.change in ("added", "replaced")
            and not self.by_torch
        )


@dataclass(frozen=True)
class TableRow:
    """One runtime key of an operator's table, before and after."""

    key: str
    before: TableEntry  # kind "missing" when nothing served the key
    after: TableEntry

    @property
    def changed(self) -> bool:
        """Whether something else serves the key now."""
        old, new = self.before, self.after
        return (old.kind, old.alias, old.site) != (new.kind, new.alias, new.site)


@dataclass(frozen=True)
class OpTableDiff(Displayable):
    """One operator's dispatch table before and after, side by side: every runtime key an
    own kernel of the operator served on either side, and every key that changed."""

    op: str
    schema_before: str | None  # None: not defined
    schema_after: str | None
    rows: tuple[TableRow, ...]  # in priority order
    registrations: tuple[Change, ...]  # the operator's own changes (definition, kernels)

    @property
    def changed(self) -> tuple[TableRow, ...]:
        """The rows whose key is served differently now."""
        return tuple(row for row in self.rows if row.changed)

    def frame(self) -> pandas.DataFrame:
        """A row per key: kind and source before and after, and whether it changed."""
        return self.view("frame")


@dataclass
class DispatchDiff(Displayable):
    """What changed in the dispatcher between a snapshot and a later moment."""

    operators: tuple[Change, ...] = ()  # operators defined, removed or redefined
    kernels: tuple[Change, ...] = ()  # (operator, key) whose registrations changed
    fallbacks: tuple[Change, ...] = ()  # backend fallbacks (operator "")
    routes: tuple[Change, ...] = ()  # torch._native override routes
    derived: tuple[Change, ...] = ()  # entries changed by a registration at another key
    tables: Mapping[str, OpTableDiff] = field(default_factory=dict, repr=False)
    seconds: float = 0.0  # how long comparing took (the snapshot after included)

    @property
    def changes(self) -> tuple[Change, ...]:
        """Every change: operators, kernels, fallbacks, routes, then derived entries."""
        return self.operators + self.kernels + self.fallbacks + self.routes + self.derived

    @property
    def aten_overrides(self) -> tuple[Change, ...]:
        """Kernels and routes that code other than torch put in front of aten operators:
        they change what every model runs."""
        return tuple(change for change in self.changes if change.overrides_aten)

    def __len__(self) -> int:
        return len(self.changes)

    def __iter__(self) -> Iterator[Change]:
        return iter(self.changes)

    def frame(self) -> pandas.DataFrame:
        """A row per change: ``op``, ``key`` (empty for a whole operator), ``change``
        (added/removed/replaced), ``before``, ``after``, ``site``, and ``what``, ``kind``,
        ``hides``, ``because``."""
        return self.view("frame")

    def table(self, op: Any) -> OpTableDiff:
        """One changed operator's table before and after, side by side."""
        name = _op_name(op)
        found = self.tables.get(name) or self.tables.get(name.removesuffix(".default"))
        if found is None:
            changed = ", ".join(sorted(self.tables)[:8]) or "none"
            raise UnknownOperatorError(
                f"{name} did not change in this diff. Operators that changed: {changed}"
                f"{' ...' if len(self.tables) > 8 else ''}."
            )
        return found

    def affected(self, calls: Any) -> AffectedCalls:
        """The calls of an earlier :class:`~opmagic.Trace` (or a list of ``(op, args)`` or
        ``(op, args, kwargs)``) whose path or final kernel this diff changed, grouped by op
        and by what serves them now instead."""
        fallbacks = {
            c.key: (c.before or "no kernel", c.after or "no kernel") for c in self.fallbacks
        }
        changed = {
            op: {row.key: (entry_text(row.before), entry_text(row.after)) for row in table.changed}
            for op, table in self.tables.items()
        }
        return affected_calls(changed, fallbacks, calls)


def _op_name(op: Any) -> str:
    """``ns::name[.overload]`` of an operator given by name, OpOverload or custom op."""
    if isinstance(op, str):
        return op
    parts = dispatcher.operator_parts(op)
    if parts is None:
        raise UnknownOperatorError(
            f"table() takes an operator ('ns::name.overload' or an OpOverload), got {op!r}."
        )
    namespace, name, overload = parts
    return f"{namespace}::{name}" + (f".{overload}" if overload else "")
