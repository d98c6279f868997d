"""``snapshot()``: the dispatcher's whole registration state, cheap to take and to compare.

A snapshot keeps every operator's registration dump (``_dispatch_dump``) as the text torch
prints, unparsed: taking one costs what reading the dumps costs, and two snapshots are
compared string by string, so that only the operators whose text differs are parsed. Besides
the operators, it holds what no operator's dump shows: the backend fallbacks (one kernel per
key for every operator) and ``torch._native``'s override routes.
"""

from __future__ import annotations

import inspect
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from ..._torch import dispatcher
from ...display import Displayable
from ..keys import catalogue
from ..sites import label_callable
from ..table import Registration, parse_computed_table, parse_registrations


@dataclass(frozen=True)
class Fallback:
    """The backend fallback of one runtime key."""

    key: str
    site: str  # as torch records it ("registered at FILE:LINE"); "" when no op showed it
    fallthrough: bool  # the fallback skips the key (BackendSelect, ADInplaceOrView, ...)


@dataclass(frozen=True)
class NativeRoute:
    """One ``torch._native`` override route of an aten op: ``impl`` runs where ``condition``
    holds (the router kernel tries the routes of an ``(op, key)`` in order)."""

    op: str  # "aten::bmm" or "aten::add_.Tensor"
    key: str
    dsl: str  # the DSL that registered it ("triton", "cutedsl", "native", ...)
    node_id: str  # its ``_native::<node_id>`` operator
    active: bool  # False when torch._native's filters disabled it
    condition: str  # the condition function, named with its definition site
    impl: str  # the implementation function, named with its definition site
    by_torch: bool  # the implementation is torch's own (torch/_native/ops)

    @property
    def node_op(self) -> str:
        """The ``_native`` operator whose kernel is the route's implementation."""
        return f"_native::{self.node_id}"

    @property
    def text(self) -> str:
        """``triton: impl_fn (file:line) if cond_fn (file:line)``, ``[disabled]`` when off."""
        state = "" if self.active else " [disabled]"
        return f"{self.dsl}: {self.impl} if {self.condition}{state}"


@dataclass(frozen=True)
class OpState:
    """One operator's registrations, parsed from its dump."""

    schema: str | None  # None: kernels were registered but the operator is not defined
    definition: str | None  # where it was defined ("registered at FILE:LINE")
    alias_analysis: str | None
    stacks: Mapping[str, tuple[Registration, ...]]  # key -> kernels, the active one first

    @property
    def header(self) -> tuple[str | None, str | None, str | None]:
        """What defines the operator: schema, definition site and alias analysis."""
        return self.schema, self.definition, self.alias_analysis

    def active(self) -> dict[str, Registration]:
        """The kernel that serves each registered key (runtime or alias key)."""
        return {key: stack[0] for key, stack in self.stacks.items()}


_HEADER = {"schema": "schema", "debug": "definition", "alias analysis kind": "alias_analysis"}


def parse_op_state(text: str) -> OpState:
    """An operator's :class:`OpState` from its ``_dispatch_dump`` text."""
    header: dict[str, str | None] = dict.fromkeys(_HEADER.values())
    for line in text.split("\n", 4)[:4]:
        name, _, value = line.partition(": ")
        if name in _HEADER:
            header[_HEADER[name]] = None if value == "(none)" else value
    stacks: dict[str, list[Registration]] = {}
    for registration in parse_registrations(text):
        stacks.setdefault(registration.key, []).append(registration)
    return OpState(
        header["schema"],
        header["definition"],
        header["alias_analysis"],
        {key: tuple(stack) for key, stack in stacks.items()},
    )


@dataclass(frozen=True, eq=False)
class DispatchSnapshot(Displayable):
    """The dispatcher's registrations at one moment: every operator's dump, the backend
    fallbacks and the ``torch._native`` routes. ``opmagic.diff(snapshot)`` compares it with
    the dispatcher as it is then."""

    dumps: Mapping[str, str] = field(repr=False)  # operator -> its _dispatch_dump text
    fallbacks: Mapping[str, Fallback] = field(repr=False)  # runtime key -> its fallback
    routes: tuple[NativeRoute, ...] = field(repr=False)
    seconds: float = 0.0  # how long taking it took

    def state(self, op: str) -> OpState | None:
        """The parsed registrations of one operator (``None`` when it did not exist)."""
        text = self.dumps.get(op)
        return None if text is None else parse_op_state(text)


def snapshot() -> DispatchSnapshot:
    """The dispatcher's registration state now, for :func:`opmagic.diff` to compare against.

    Cheap enough to take around any piece of code (a quarter of a second for torch's 3,600
    operators): the dumps are kept as torch prints them and parsed only where they change.
    """
    started = time.perf_counter()
    names = dispatcher.all_op_names()
    dumps = dict(zip(names, dispatcher.dump_all_registrations(names), strict=True))
    return DispatchSnapshot(
        dumps, _fallbacks(dumps), _native_routes(), time.perf_counter() - started
    )


def _fallbacks(dumps: Mapping[str, str]) -> dict[str, Fallback]:
    """The backend fallback of every runtime key that has one.

    The dispatcher says which keys have a fallback; where each was registered, and whether
    it is a fallthrough, shows in the computed table of an operator with no kernel at all
    (every key it has an entry for is served by the fallback).
    """
    bare = next((name for name, text in dumps.items() if text.count("\n") <= 4), None)
    shown = parse_computed_table(dispatcher.dump_table(bare)) if bare is not None else {}
    fallbacks = {}
    for info in catalogue().runtime:
        if dispatcher.has_backend_fallback(info.name):
            site, _, fallthrough = shown.get(info.name, ("", "", False))
            fallbacks[info.name] = Fallback(info.name, site, fallthrough)
    return fallbacks


def _native_routes() -> tuple[NativeRoute, ...]:
    """``torch._native``'s override routes, their functions named now."""
    return tuple(
        NativeRoute(
            f"aten::{op_symbol}",
            key,
            dsl,
            node_id,
            active,
            label_callable(condition),
            label_callable(impl),
            defined_in_torch(impl),
        )
        for op_symbol, key, dsl, node_id, active, condition, impl in (
            dispatcher.native_override_routes()
        )
    )


def defined_in_torch(function: object) -> bool:
    """Whether a function's code lives in torch's own package."""
    code = getattr(inspect.unwrap(function), "__code__", None)  # type: ignore[arg-type]
    return code is not None and code.co_filename.startswith(os.path.dirname(torch.__file__))
