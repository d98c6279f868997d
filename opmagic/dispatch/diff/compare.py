"""``diff(before)``: compare a snapshot with the dispatcher now, operator by operator.

Only operators whose dump text differs are parsed. For each, the registrations of every key
are compared as stacks (the active kernel first, the ones it hides after it), its table is
computed on both sides (:mod:`.computed`) to find the entries that changed without a
registration at their own key, and the kernels are named (:mod:`.labels`).
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from ..._torch import custom_op_state
from ...errors import ArgumentTypeError
from ..sites import label_callable, label_site
from ..table import Registration
from .computed import Computed, computed_table, table_keys
from .labels import Kernel, KernelNamer, LiveFunctions, entry_text, registered_by_torch
from .result import Change, ChangeKind, DispatchDiff, OpTableDiff, TableRow
from .state import (
    DispatchSnapshot,
    Fallback,
    NativeRoute,
    OpState,
    defined_in_torch,
    snapshot,
)


def diff(before: DispatchSnapshot | None = None) -> Any:
    """What changed in the dispatcher since ``before`` (an :func:`opmagic.snapshot`).

    Without ``before``, a context manager: ``with opmagic.diff() as d: ...`` snapshots the
    dispatcher on entry and fills ``d`` (a :class:`DispatchDiff`) when the block ends, also
    when it raises.
    """
    if before is None:
        return _DiffBlock()
    if not isinstance(before, DispatchSnapshot):
        raise ArgumentTypeError(
            f"diff() compares the dispatcher with a snapshot: pass what opmagic.snapshot() "
            f"returned, or use the block form `with opmagic.diff() as d:`; got "
            f"{type(before).__name__}."
        )
    started = time.perf_counter()
    found = compare(before, snapshot())
    found.seconds = time.perf_counter() - started
    return found


class _DiffBlock:
    """``with opmagic.diff() as d:``: ``d`` is filled in when the block ends."""

    def __init__(self) -> None:
        self.diff = DispatchDiff()
        self._before: DispatchSnapshot | None = None

    def __enter__(self) -> DispatchDiff:
        self._before = snapshot()
        return self.diff

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        assert self._before is not None
        found = diff(self._before)
        for item in dataclasses.fields(found):
            setattr(self.diff, item.name, getattr(found, item.name))


def compare(before: DispatchSnapshot, after: DispatchSnapshot) -> DispatchDiff:
    """Every difference between two snapshots."""
    old_dumps = before.dumps
    touched = sorted(
        [name for name, text in after.dumps.items() if old_dumps.get(name) != text]
        + [name for name in old_dumps if name not in after.dumps]
    )
    routes_before, routes_after = _by_op(before.routes), _by_op(after.routes)
    operators: list[Change] = []
    kernels: list[Change] = []
    derived: list[Change] = []
    tables: dict[str, OpTableDiff] = {}
    for name in touched:
        old, new = before.state(name), after.state(name)
        sides = _Sides(name, old, new, routes_before.get(name, ()), routes_after.get(name, ()))
        own = sides.operator_changes() + sides.kernel_changes()
        operators += [c for c in own if c.what == "operator"]
        kernels += [c for c in own if c.what == "kernel"]
        before_table = computed_table(sides.old_active, before.fallbacks)
        after_table = computed_table(sides.new_active, after.fallbacks)
        if old is not None and new is not None and old.schema and new.schema:
            derived += sides.derived_changes(
                computed_table(sides.old_active, after.fallbacks), after_table, own
            )
        tables[name] = sides.table(before_table, after_table, tuple(own))
    return DispatchDiff(
        operators=tuple(operators),
        kernels=tuple(kernels),
        fallbacks=_fallback_changes(before.fallbacks, after.fallbacks),
        routes=_route_changes(routes_before, routes_after),
        derived=tuple(derived),
        tables=tables,
    )


class _Sides:
    """One operator before and after, with a namer for the kernels of each side."""

    def __init__(
        self,
        op: str,
        old: OpState | None,
        new: OpState | None,
        old_routes: Sequence[NativeRoute],
        new_routes: Sequence[NativeRoute],
    ) -> None:
        self.op, self.old, self.new = op, old, new
        self.old_active = old.active() if old is not None else {}
        self.new_active = new.active() if new is not None else {}
        self.live = new is not None and new.schema is not None
        functions = LiveFunctions(op, self.new_active, self.live)
        opdef = custom_op_state.custom_op_def(op.partition(".")[0]) if self.live else None
        impl = custom_op_state.custom_op_parts(opdef)["impl"] if opdef is not None else None
        self.custom_impl = custom_op_state.unwrap_registered_function(impl) if impl else None
        # a custom op that torch's own modules define: what they register is torch's too
        self.torch_custom_op = self.custom_impl is not None and defined_in_torch(self.custom_impl)
        self.old_names = KernelNamer(op, self.old_active, old_routes, functions)
        self.new_names = KernelNamer(op, self.new_active, new_routes, functions)

    def operator_changes(self) -> list[Change]:
        """The definition added, removed or changed (schema, site or alias analysis)."""
        old = self.old.header if self.old is not None else (None, None, None)
        new = self.new.header if self.new is not None else (None, None, None)
        if old == new or (old[0] is None and new[0] is None):
            return []
        change: ChangeKind
        if old[0] is None:
            change, site = "added", new[1]
        elif new[0] is None:
            change, site = "removed", old[1]
        else:
            change, site = "replaced", new[1]
        return [
            Change(
                "operator",
                self.op,
                "",
                change,
                old[0] or "",
                new[0] or "",
                self._definition(site or ""),
                "definition",
                by_torch=registered_by_torch(site or "") or self.torch_custom_op,
            )
        ]

    def _definition(self, site: str) -> str:
        """Where the operator was defined; for a custom op defined inside torch's machinery,
        the user's function instead."""
        if self.custom_impl is not None and "custom_ops.py" in site:
            return f"custom_op {label_callable(self.custom_impl)}"
        return label_site(site)

    def kernel_changes(self) -> list[Change]:
        """Every key whose stack of kernels differs, in the dispatcher's key order."""
        old_stacks = self.old.stacks if self.old is not None else {}
        new_stacks = self.new.stacks if self.new is not None else {}
        keys = list(dict.fromkeys([*new_stacks, *old_stacks]))
        changes = []
        for key in keys:
            old_stack, new_stack = old_stacks.get(key, ()), new_stacks.get(key, ())
            if [_identity(r) for r in old_stack] != [_identity(r) for r in new_stack]:
                changes.append(self._kernel_change(key, old_stack, new_stack))
        return changes

    def _kernel_change(
        self, key: str, old: tuple[Registration, ...], new: tuple[Registration, ...]
    ) -> Change:
        """added: the key had no kernel; replaced: a new kernel sits on top (the ones under
        it stay, inactive); removed: kernels went and nothing new came."""
        added = Counter(map(_identity, new)) - Counter(map(_identity, old))
        gone = Counter(map(_identity, old)) - Counter(map(_identity, new))
        change: ChangeKind
        if not old:
            change, subject = "added", self.new_names.kernel(new[0])
        elif not new:
            change, subject = "removed", self.old_names.kernel(old[0])
        elif added:
            first_new = next(r for r in new if _identity(r) in added)
            change, subject = "replaced", self.new_names.kernel(first_new)
        else:
            first_gone = next(r for r in old if _identity(r) in gone)
            change, subject = "removed", self.old_names.kernel(first_gone)
        return Change(
            "kernel",
            self.op,
            key,
            change,
            self.old_names.kernel(old[0]).text if old else "",
            self.new_names.kernel(new[0]).text if new else "",
            subject.where,
            subject.kind,
            "; ".join(self.new_names.kernel(r).text for r in new[1:]),
            by_torch=subject.by_torch or self.torch_custom_op,
        )

    def derived_changes(
        self, old_table: Computed, new_table: Computed, own: Sequence[Change]
    ) -> list[Change]:
        """Entries that changed without a registration at their own key: filled from an alias
        key now (or no longer), or given up by CompositeImplicitAutograd for a backend
        kernel. Both tables use the fallbacks of now: fallback changes are listed apart."""
        causes = [c for c in own if c.what == "kernel"]
        registered = {c.key for c in causes}
        because = ", ".join(f"{c.key} {c.change}" for c in causes)
        by_torch = bool(causes) and all(c.by_torch for c in causes)
        changes = []
        for key in table_keys():
            if key in registered or old_table.get(key) == new_table.get(key):
                continue
            before = self.old_names.entry(key, old_table)
            after = self.new_names.entry(key, new_table)
            change: ChangeKind = (
                "added"
                if before.kind == "missing" or before.is_fallback
                else "removed"
                if after.kind == "missing" or after.is_fallback
                else "replaced"
            )
            changes.append(
                Change(
                    "derived",
                    self.op,
                    key,
                    change,
                    entry_text(before),
                    entry_text(after),
                    (after if change != "removed" else before).source,
                    (after if change != "removed" else before).kind_label,
                    because=because,
                    by_torch=by_torch,
                )
            )
        return changes

    def table(
        self, old_table: Computed, new_table: Computed, own: tuple[Change, ...]
    ) -> OpTableDiff:
        """The operator's table on both sides: keys with a kernel of its own on either side,
        and keys served differently."""
        rows = []
        for key in table_keys():
            row = TableRow(
                key, self.old_names.entry(key, old_table), self.new_names.entry(key, new_table)
            )
            if row.changed or row.before.is_own or row.after.is_own:
                rows.append(row)
        return OpTableDiff(
            self.op,
            self.old.schema if self.old is not None else None,
            self.new.schema if self.new is not None else None,
            tuple(rows),
            own,
        )


def _identity(registration: Registration) -> tuple[str, str | None, bool]:
    """What tells two kernels of one key apart in a dump (its position aside)."""
    return registration.site, registration.signature, registration.fallthrough


def _by_op(routes: Sequence[NativeRoute]) -> dict[str, tuple[NativeRoute, ...]]:
    """The routes of each aten operator, and for each route's own ``_native`` operator the
    route it implements."""
    grouped: dict[str, list[NativeRoute]] = {}
    for route in routes:
        grouped.setdefault(route.op, []).append(route)
        grouped.setdefault(route.node_op, []).append(route)
    return {op: tuple(found) for op, found in grouped.items()}


def _fallback_changes(
    before: Mapping[str, Fallback], after: Mapping[str, Fallback]
) -> tuple[Change, ...]:
    """Backend fallbacks added, removed or replaced, in key order."""
    changes = []
    for key in dict.fromkeys([*before, *after]):
        old, new = before.get(key), after.get(key)
        if old == new:
            continue
        change: ChangeKind = "added" if old is None else "removed" if new is None else "replaced"
        subject = new if new is not None else old
        assert subject is not None
        changes.append(
            Change(
                "fallback",
                "",
                key,
                change,
                _fallback_kernel(old).text if old else "",
                _fallback_kernel(new).text if new else "",
                label_site(subject.site),
                _fallback_kernel(subject).kind,
                by_torch=_fallback_kernel(subject).by_torch,
            )
        )
    return tuple(changes)


def _fallback_kernel(fallback: Fallback) -> Kernel:
    kind = "fallthrough fallback" if fallback.fallthrough else "backend fallback"
    return Kernel(
        kind, label_site(fallback.site), fallback.site, registered_by_torch(fallback.site)
    )


def _route_changes(
    before: Mapping[str, tuple[NativeRoute, ...]], after: Mapping[str, tuple[NativeRoute, ...]]
) -> tuple[Change, ...]:
    """``torch._native`` routes per (op, key) added, removed or changed."""
    changes = []
    for op in sorted(before.keys() | after.keys()):
        old_routes = [r for r in before.get(op, ()) if r.op == op]
        new_routes = [r for r in after.get(op, ()) if r.op == op]
        for key in sorted({r.key for r in old_routes} | {r.key for r in new_routes}):
            old = [r for r in old_routes if r.key == key]
            new = [r for r in new_routes if r.key == key]
            if old == new:
                continue
            change: ChangeKind = "added" if not old else "removed" if not new else "replaced"
            subject = (new or old)[0]
            changes.append(
                Change(
                    "native route",
                    op,
                    key,
                    change,
                    _routes_text(old),
                    _routes_text(new),
                    subject.impl,
                    "torch._native route",
                    by_torch=subject.by_torch,
                )
            )
    return tuple(changes)


def _routes_text(routes: Sequence[NativeRoute]) -> str:
    """``torch._native route · triton: impl (file:line) if cond (file:line)``; "" for none."""
    return f"torch._native route · {'; '.join(r.text for r in routes)}" if routes else ""
