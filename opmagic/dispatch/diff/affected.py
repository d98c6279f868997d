"""``DispatchDiff.affected(calls)``: which calls of a model run something else now.

A call's path depends on its operator's table at the keys it visits: the keys whose kernels
ran and the fallthrough keys the dispatcher passed over on the way. A call is affected when
one of those keys is served differently after the change; the first such key is where its
path leaves the old one. The keys come from the calls of a :class:`~opmagic.Trace` as
recorded, or from resolving ``(op, args)`` now.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...display import Displayable
from ...errors import ArgumentTypeError, OpmagicError, is_list_of_values
from ..ops import op_ref
from ..resolve import Step, resolve
from ..table import OperatorTable
from ..trace import Trace, TracedCall

if TYPE_CHECKING:
    import pandas

Entries = Mapping[str, tuple[str, str]]  # key -> (what served it before, what serves it now)


@dataclass(frozen=True)
class AffectedCall:
    """Calls of one operator whose path reaches a key that is served differently now."""

    op: str
    key: str  # the first key of the path (or one it passed over) that changed
    before: str  # what served it before
    after: str  # what serves it now
    count: int  # how many of the calls given
    inputs: str  # the arguments of the first such call, in short


@dataclass(frozen=True)
class AffectedCalls(Displayable):
    """The calls whose path or final kernel a diff changed, grouped by what changed."""

    calls: tuple[AffectedCall, ...]
    checked: int  # how many calls were checked
    skipped: tuple[str, ...] = ()  # calls that could not be checked, and why

    def __iter__(self) -> Iterator[AffectedCall]:
        return iter(self.calls)

    def __len__(self) -> int:
        return len(self.calls)

    def frame(self) -> pandas.DataFrame:
        """A row per group of calls: op, key, before, after, count, inputs."""
        return self.view("frame")


def affected_calls(changed: Mapping[str, Entries], fallbacks: Entries, calls: Any) -> AffectedCalls:
    """Group the calls whose visited keys are served differently now.

    ``changed``: per operator the diff touched, its keys that changed; ``fallbacks``: the
    keys whose backend fallback changed (they matter for every operator without a kernel
    of its own there).
    """
    groups: dict[tuple[str, str, str, str], list[Any]] = {}
    skipped: list[str] = []
    checked = 0
    served_by_fallback = _FallbackUse()
    for op, steps, inputs in _visits(calls, skipped):
        checked += 1
        own = changed.get(op, {})
        for key in _visited_keys(steps):
            if key in own:
                before, after = own[key]
            elif key in fallbacks and op not in changed and served_by_fallback(op, key):
                before, after = fallbacks[key]
            else:
                continue
            groups.setdefault((op, key, before, after), []).append(inputs)
            break
    return AffectedCalls(
        tuple(
            AffectedCall(op, key, before, after, len(inputs), inputs[0])
            for (op, key, before, after), inputs in groups.items()
        ),
        checked,
        tuple(skipped),
    )


def _visits(calls: Any, skipped: list[str]) -> Iterator[tuple[str, tuple[Step, ...], str]]:
    """``(op, steps, inputs)`` of every call: a trace's calls at every depth as recorded,
    ``(op, args[, kwargs])`` pairs resolved now (one that cannot be is listed in
    ``skipped``)."""
    if isinstance(calls, Trace):
        for call in calls.walk():
            yield call.op, call.steps, call.inputs
        return
    if isinstance(calls, TracedCall):
        yield from _visits_of_call(calls)
        return
    if not is_list_of_values(calls):
        raise ArgumentTypeError(_USAGE.format(type(calls).__name__))
    for item in calls:
        if isinstance(item, TracedCall):
            yield from _visits_of_call(item)
            continue
        if not isinstance(item, tuple) or not 2 <= len(item) <= 3:
            raise ArgumentTypeError(_USAGE.format(f"an item {item!r}"))
        op, args, *rest = item
        kwargs = rest[0] if rest else {}
        if not isinstance(args, (tuple, list)) or not isinstance(kwargs, dict):
            raise ArgumentTypeError(_USAGE.format(f"an item {item!r}"))
        try:
            resolution = resolve(op, *args, **kwargs)
        except OpmagicError as exc:
            skipped.append(f"{op}: {exc}")
            continue
        inputs = "; ".join(f"{i.name}: {i.description}" for i in resolution.inputs)
        yield resolution.op, resolution.steps, inputs


_USAGE = (
    "affected() takes a Trace (opmagic.trace), or a list of (op, args) or (op, args, kwargs) "
    "tuples, e.g. [('aten::sin', (torch.randn(3),))]; got {}."
)


def _visits_of_call(call: TracedCall) -> Iterator[tuple[str, tuple[Step, ...], str]]:
    """A traced call and every call under it."""
    for inner in call.walk():
        yield inner.op, inner.steps, inner.inputs


def _visited_keys(steps: tuple[Step, ...]) -> Iterator[str]:
    """The keys a call's dispatch looked up in its table, in order: the fallthrough keys
    passed over before each step, then the step's own key."""
    for step in steps:
        for skip in step.skipped:
            if skip.reason == "fallthrough":
                yield skip.key
        yield step.key


class _FallbackUse:
    """Whether an operator the diff left alone has its key served by the backend fallback
    (or by nothing), so that a change of that fallback reaches its calls."""

    def __init__(self) -> None:
        self._known: dict[tuple[str, str], bool] = {}

    def __call__(self, op: str, key: str) -> bool:
        if (op, key) not in self._known:
            entry = OperatorTable(op_ref(op)).entry(key)
            self._known[(op, key)] = entry.is_fallback or entry.kind == "missing"
        return self._known[(op, key)]
