"""What ``trace`` returns: the calls as a tree (:class:`TracedCall`), the :class:`Trace` holding
them, and the :class:`Surprises` worked out when the trace finished.

A trace is a snapshot: everything its views show was recorded or worked out while tracing, so
it displays the same after the traced operators are redefined or unregistered.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...display import Displayable
from ..resolve import Step
from .arguments import TensorInfo, logged_arguments, same_value, short_value

if TYPE_CHECKING:
    import pandas

    from ..ops import OpParameter
    from ..table import TableEntry


@dataclass(frozen=True)
class TracedCall(Displayable):
    """One operator call: its path through the dispatcher and the calls its kernels made."""

    op: str  # "ns::name.overload" ("ns::name" for the default overload), as resolve names it
    steps: tuple[Step, ...]  # as Resolution.steps, across the kernels that called the op again
    children: tuple[TracedCall, ...]  # calls made while this call's kernels ran, in order
    error: str | None  # why dispatch failed, or the exception the call raised
    raised: bool  # the call ended by raising (the exception may have been caught above it)
    context: tuple[str, ...]  # the thread-local state that mattered, in words
    time_ns: int  # wall time of the call, children included, tracer overhead taken out
    depth: int  # 0 for calls the traced code made itself
    recalls: int = 0  # times a kernel called the op again (those keys continue the path)
    # what code outside the dispatcher noted while this call's kernels ran (dispatch.notes),
    # e.g. the Triton kernels a triton_op's launcher launched, in order
    notes: tuple[Any, ...] = ()
    _log: Any = field(default=None, repr=False, compare=False)  # (op info, logged arguments)

    @functools.cached_property
    def arguments(self) -> tuple[Any, ...]:
        """Per schema argument: a TensorInfo (tensors are not kept), a tuple of them (tensor
        lists), or the value (dtypes, devices, numbers, sizes, ...)."""
        return () if self._log is None else logged_arguments(*self._log)

    @property
    def parameters(self) -> tuple[OpParameter, ...]:
        """The operator's schema arguments (name, type, default), in order."""
        return () if self._log is None else self._log[0].parameters

    @functools.cached_property
    def path(self) -> tuple[str, ...]:
        """The runtime keys whose kernels ran, in order (as ``Resolution.path``)."""
        return tuple(s.key for s in self.steps if s.entry.kind not in ("missing", "ambiguous"))

    @property
    def key(self) -> str | None:
        """The key the call dispatched to first, or ``None``."""
        return self.path[0] if self.path else None

    @property
    def kernel(self) -> TableEntry | None:
        """The table entry of the kernel that ended the path (its ``kind`` and ``source``)."""
        return self.steps[-1].entry if self.steps else None

    @property
    def kernel_kind(self) -> str:
        """``kernel``, ``via CompositeImplicitAutograd``, ``fallback``, ``python``, ``error``..."""
        if not self.steps:
            return "error" if self.error else "unknown"
        last = self.steps[-1]
        if last.action == "error":
            return "error"
        if last.action == "python":
            return "python"
        return last.entry.kind_label

    @property
    def source(self) -> str:
        """Where the kernel that ended the path came from (function or registration site)."""
        return self.kernel.source if self.kernel is not None else ""

    @functools.cached_property
    def inputs(self) -> str:
        """The arguments in short: tensors as ``f32[2,3]``, others as ``name=value`` when they
        differ from the schema's default."""
        shown = []
        for param, value in zip(self.parameters, self.arguments, strict=False):
            if isinstance(value, TensorInfo):
                shown.append(str(value))
            elif isinstance(value, tuple) and any(isinstance(v, TensorInfo) for v in value):
                shown.append("[" + ", ".join(str(v) for v in value) + "]")
            elif not (param.has_default and same_value(value, param.default)):
                shown.append(f"{param.name}={short_value(value)}")
        return ", ".join(shown)

    def walk(self) -> Iterator[TracedCall]:
        """This call, then every call under it, depth-first."""
        return walk_all((self,))


@dataclass(frozen=True)
class Surprise:
    """Something in a trace worth a second look, with how many calls showed it."""

    kind: str  # "fallback", "no batching rule", "decomposed", "autocast cast", ...
    op: str
    detail: str
    count: int = 1


@dataclass(frozen=True)
class Surprises(Displayable):
    """A trace's surprises: fallbacks that ran, ops without kernels of their own, casts, ..."""

    items: tuple[Surprise, ...]

    def __iter__(self) -> Iterator[Surprise]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


NO_RESULT = object()
"""``Trace``'s value when the traced code returned nothing of its own (a block)."""
NO_SURPRISES = Surprises(())


@dataclass
class Trace(Displayable):
    """Every operator call a piece of code made, as a tree in call order."""

    calls: tuple[TracedCall, ...] = ()  # the calls the traced code made itself, in order
    time_ns: int = 0  # wall time of the traced code, tracer overhead taken out
    overhead_ns: int = 0  # time the tracer spent recording
    exception: BaseException | None = field(default=None, repr=False)  # what the code raised
    notes: tuple[Any, ...] = ()  # noted while no operator call ran (dispatch.notes)
    _value: Any = field(default=NO_RESULT, repr=False, compare=False)
    _surprises: Surprises = field(default=NO_SURPRISES, repr=False, compare=False)

    @property
    def result(self) -> Any:
        """What the traced function returned (re-raises what it raised; ``None`` for a block)."""
        if self.exception is not None:
            raise self.exception
        return None if self._value is NO_RESULT else self._value

    def walk(self) -> Iterator[TracedCall]:
        """Every call, depth-first: each call, then the calls under it."""
        return walk_all(self.calls)

    def __len__(self) -> int:
        return sum(1 for _ in self.walk())

    def surprises(self) -> Surprises:
        """Fallbacks that ran, ops with no kernel of their own, autocast casts, CPU fallbacks,
        custom ops without a fake impl or autograd (worked out when the trace finished)."""
        return self._surprises

    def frame(self) -> pandas.DataFrame:
        """A row per call (depth, op, path, kernel kind, source, time, ...), depth-first."""
        return self.view("frame")

    def diagram(self) -> Displayable:
        """The call graph (a :class:`~opmagic.view.diagram.Diagram`): calls as nodes with their
        paths, decompositions nested."""
        return self.view("diagram")


def walk_all(calls: tuple[TracedCall, ...]) -> Iterator[TracedCall]:
    """Every call of ``calls`` and under them, depth-first (a stack, not nested generators:
    traces are walked as they finish and as they are shown)."""
    stack = list(reversed(calls))
    while stack:
        call = stack.pop()
        yield call
        stack.extend(reversed(call.children))
