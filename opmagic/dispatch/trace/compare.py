"""``compare_traces(a, b)``: the first call whose outputs differ between two traces recorded with
``values=True`` (eager against compiled, CPU against GPU, before against after an edit).

The calls compared are those whose outputs ``values=True`` summarised: the values the code
computed (see :func:`opmagic.trace`), less the calls that only allocate (``empty``). The two
traces' calls are matched in order by operator and output shapes (the longest matching runs
first, so a call only one side made does not shift the rest); the first matched pair whose
outputs' min, max or mean differ beyond the tolerance is the divergence.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ...display import Displayable
from ...errors import ArgumentTypeError
from .result import (
    AutogradNode,
    Output,
    Trace,
    TracedCall,
    TracedGroup,
    TracedItem,
    ValueSummary,
)

# calls whose outputs hold whatever memory they got: their values mean nothing
UNINITIALISED = frozenset(
    {
        "aten::empty.memory_format",
        "aten::empty_like",
        "aten::empty_strided",
        "aten::empty_permuted",
        "aten::new_empty",
        "aten::new_empty_strided",
    }
)


@dataclass(frozen=True)
class TracedValue:
    """A call of one trace as a comparison shows it: where it sits and what it returned."""

    call: TracedCall
    index: int  # its position among the calls compared
    where: tuple[str, ...]  # the phase, the groups and calls around it, then its op


@dataclass(frozen=True)
class TraceComparison(Displayable):
    """Two traces' outputs compared call by call: the first divergence, if any."""

    labels: tuple[str, str]
    compared: int  # matched pairs whose outputs were compared
    only: tuple[int, int]  # calls with values that only one trace made, per side
    rtol: float
    atol: float
    first: tuple[TracedValue, TracedValue] | None  # the first pair that diverges
    difference: str | None  # what differs in it (``mean 0.5 vs 0.53``)

    @property
    def same(self) -> bool:
        """Whether every compared output agrees within the tolerance."""
        return self.first is None


def compare_traces(
    a: Trace,
    b: Trace,
    *,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    labels: tuple[str, str] = ("a", "b"),
) -> TraceComparison:
    """Compare two traces recorded with ``values=True`` call by call and name the first
    call whose outputs diverge (min, max or mean further apart than ``atol + rtol * |x|``),
    with where it sits in each trace, its dispatch path and its outputs side by side."""
    for name, value in (("a", a), ("b", b)):
        if not isinstance(value, Trace):
            raise ArgumentTypeError(
                f"compare_traces() needs two traces; {name} is a {type(value).__name__}. "
                "Record them with opmagic.trace(fn, ..., values=True)."
            )
        if not value.values:
            raise ArgumentTypeError(
                f"trace {name} was recorded without its outputs' values: record it with "
                "opmagic.trace(fn, ..., values=True) to compare it."
            )
    for name, tolerance in (("rtol", rtol), ("atol", atol)):
        if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)):
            raise ArgumentTypeError(f"{name} must be a number, got {type(tolerance).__name__}")
        if not tolerance >= 0:
            raise ArgumentTypeError(f"{name} must be 0 or more, got {tolerance}")
    if (
        not isinstance(labels, tuple)
        or len(labels) != 2
        or not all(isinstance(label, str) for label in labels)
    ):
        raise ArgumentTypeError("labels must be two strings, e.g. ('eager', 'compiled')")
    left, right = list(comparable(a)), list(comparable(b))
    keys = [[_key(value.call) for value in side] for side in (left, right)]
    matcher = difflib.SequenceMatcher(None, keys[0], keys[1], autojunk=False)
    pairs = [
        (left[block.a + i], right[block.b + i])
        for block in matcher.get_matching_blocks()
        for i in range(block.size)
    ]
    first, difference = None, None
    for pair in pairs:
        difference = _difference(pair[0].call.outputs, pair[1].call.outputs, rtol, atol)
        if difference is not None:
            first = pair
            break
    return TraceComparison(
        labels=labels,
        compared=len(pairs),
        only=(len(left) - len(pairs), len(right) - len(pairs)),
        rtol=float(rtol),
        atol=float(atol),
        first=first,
        difference=difference,
    )


def comparable(trace: Trace) -> Iterator[TracedValue]:
    """The calls of ``trace`` whose outputs were summarised, in order, each with where it sits."""
    index = 0
    stack: list[tuple[TracedItem, tuple[str, ...]]] = [
        (item, (_phase(item),)) for item in reversed(trace.calls)
    ]
    while stack:
        item, where = stack.pop()
        here = (*where, _name(item))
        if (
            isinstance(item, TracedCall)
            and item.op not in UNINITIALISED
            and _has_values(item.outputs)
        ):
            yield TracedValue(item, index, here)
            index += 1
        stack.extend((child, here) for child in reversed(item.children))


def _phase(item: TracedItem) -> str:
    if isinstance(item, AutogradNode):
        return "backward"
    return item.phase if isinstance(item, TracedCall) else "forward"


def _name(item: TracedItem) -> str:
    if isinstance(item, TracedCall):
        return item.op
    assert isinstance(item, TracedGroup)
    return item.name


def _has_values(outputs: tuple[Output, ...] | None) -> bool:
    return bool(outputs) and any(v is not None for v in _flat(outputs))


def _flat(outputs: tuple[Output, ...] | None) -> Iterator[ValueSummary | None]:
    for output in outputs or ():
        if isinstance(output, tuple) and not isinstance(output, ValueSummary):
            yield from output
        else:
            yield output


def _key(call: TracedCall) -> tuple[Any, ...]:
    """What two calls share to be matched: the op and their outputs' shapes."""
    return (call.op, tuple(None if v is None else v.tensor.shape for v in _flat(call.outputs)))


def _difference(
    left: tuple[Output, ...] | None, right: tuple[Output, ...] | None, rtol: float, atol: float
) -> str | None:
    """What differs between two calls' outputs beyond the tolerance, or None."""
    for position, (x, y) in enumerate(zip(_flat(left), _flat(right), strict=False)):
        if x is None or y is None or x.low is None or y.low is None:
            continue
        named = f"output {position}: " if len(list(_flat(left))) > 1 else ""
        if x.tensor.dtype != y.tensor.dtype:
            return f"{named}dtype {x.tensor.dtype} vs {y.tensor.dtype}"
        for stat in ("low", "high", "mean"):
            p, q = getattr(x, stat), getattr(y, stat)
            if not _close(p, q, rtol, atol):
                label = {"low": "min", "high": "max", "mean": "mean"}[stat]
                return f"{named}{label} {p:.6g} vs {q:.6g}"
    return None


def _close(p: float, q: float, rtol: float, atol: float) -> bool:
    if math.isnan(p) or math.isnan(q):
        return math.isnan(p) and math.isnan(q)
    if math.isinf(p) or math.isinf(q):
        return p == q
    return abs(p - q) <= atol + rtol * max(abs(p), abs(q))
