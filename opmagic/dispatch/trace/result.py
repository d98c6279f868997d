"""What ``trace`` returns: the calls as a tree (:class:`TracedCall`), the groups that ran some
of them (:class:`AutogradNode`, :class:`CompiledRegion`, :class:`Compilation`), the
:class:`Trace` holding them, and the :class:`Surprises` worked out when the trace finished.

A trace is a snapshot: everything its views show was recorded or worked out while tracing, so
it displays the same after the traced operators are redefined or unregistered. The links
between a backward call, its autograd node and the forward call that made the node are set
while the trace is finished, before it is handed out.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from ...display import Displayable
from ..resolve import Step
from .arguments import TensorInfo, logged_arguments, same_value, short_value

if TYPE_CHECKING:
    import pandas

    from ...view.diagram import Diagram
    from ..ops import OpParameter
    from ..table import TableEntry


@dataclass(frozen=True)
class TracedCall(Displayable):
    """One operator call: its path through the dispatcher and the calls its kernels made."""

    op: str  # "ns::name.overload" ("ns::name" for the default overload), as resolve names it
    steps: tuple[Step, ...]  # as Resolution.steps, across the kernels that called the op again
    children: tuple[TracedItem, ...]  # calls (and groups) made while its kernels ran, in order
    error: str | None  # why dispatch failed, or the exception the call raised
    raised: bool  # the call ended by raising (the exception may have been caught above it)
    context: tuple[str, ...]  # the thread-local state that mattered, in words
    time_ns: int  # wall time of the call, children included, tracer overhead taken out
    depth: int  # 0 for calls the traced code made itself
    recalls: int = 0  # times a kernel called the op again (those keys continue the path)
    # what code outside the dispatcher noted while this call's kernels ran (dispatch.notes),
    # e.g. the Triton kernels a triton_op's launcher launched, in order
    notes: tuple[Any, ...] = ()
    called_from: CodeLocation | None = None  # the frame of the user's code that made it
    module: str | None = None  # the nn.Module path running it ("" the outermost), or None
    module_type: str | None = None  # that module's class name
    thread: str | None = None  # the thread it ran on, None for the thread that traced
    outputs: tuple[Output, ...] | None = None  # per output, with trace(..., values=True)
    first_call: str | None = None  # a one-time cost it paid ("loaded 897 Python modules")
    _log: Any = field(default=None, repr=False, compare=False)  # (op info, logged arguments)
    # links, set when the trace is finished:
    node: AutogradNode | None = field(default=None, repr=False, compare=False)
    backward: tuple[AutogradNode, ...] = field(default=(), repr=False, compare=False)

    @property
    def phase(self) -> str:
        """``"backward"`` for a call an autograd node made, else ``"forward"``."""
        return "forward" if self.node is None else "backward"

    @property
    def backward_of(self) -> TracedCall | None:
        """For a backward call: the forward call whose autograd node made it (if traced)."""
        return None if self.node is None else self.node.forward

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
        """This call, then every call under it, depth-first (through the groups under it)."""
        return walk_calls((self,))


class CodeLocation(NamedTuple):
    """A line of Python code: where a call came from, where a formula is defined."""

    file: str
    line: int
    function: str
    label: str  # ``cell [3], line 2`` or ``train.py:14``, named when the trace was made

    def __str__(self) -> str:
        if self.function in ("<module>", ""):
            return self.label
        return f"{self.label} in {self.function}"


class ValueSummary(NamedTuple):
    """What an output tensor held (``trace(..., values=True)``): min, max and mean (of the
    magnitudes for complex tensors), ``None`` where they could not be read (meta, fake,
    sparse or empty tensors)."""

    tensor: TensorInfo
    low: float | None
    high: float | None
    mean: float | None

    def __str__(self) -> str:
        if self.low is None:
            return str(self.tensor)
        return f"{self.tensor} min {self.low:.4g} max {self.high:.4g} mean {self.mean:.4g}"


# one output of a call: a tensor's summary, a tensor list's, or None (not a tensor)
Output = ValueSummary | tuple[ValueSummary | None, ...] | None


@dataclass(frozen=True)
class TracedGroup:
    """Calls that something other than an operator ran: the base of :class:`AutogradNode`,
    :class:`CompiledRegion` and :class:`Compilation` (views draw them alike)."""

    kind: ClassVar[str] = "group"
    name: str
    children: tuple[TracedItem, ...]  # the calls (and groups) it ran, in order
    time_ns: int  # wall time, tracer overhead taken out
    depth: int
    thread: str | None = None  # the thread it ran on, None for the thread that traced
    raised: bool = False
    called_from: CodeLocation | None = None

    @property
    def op(self) -> str:
        """What the group is, as a call's ``op`` says what the call is."""
        return f"{self.kind} {self.name}"

    @property
    def error(self) -> str | None:
        """Groups do not fail themselves: the call that failed inside says why."""
        return None

    def walk(self) -> Iterator[TracedCall]:
        """Every operator call under the group, depth-first."""
        return walk_calls(self.children)


@dataclass(frozen=True)
class AutogradNode(TracedGroup, Displayable):
    """An autograd node running its backward (``AddmmBackward0``): the calls its formula made
    and those the engine made to add up the gradients it produced."""

    kind: ClassVar[str] = "autograd node"
    sequence_nr: int = -1  # the autograd sequence number it shares with its forward call
    formula: CodeLocation | None = None  # a formula written in Python: where it is defined
    forward: TracedCall | None = field(default=None, repr=False, compare=False)  # link


@dataclass(frozen=True)
class CompiledRegion(TracedGroup, Displayable):
    """One graph torch.compile compiled, running: the operators the compiled code called at
    run time (extern kernels, fallbacks, custom ops; fused kernels call none)."""

    kind: ClassVar[str] = "compiled region"
    compile_id: str = ""  # dynamo's frame/compile id, ``0/0``
    function: CodeLocation | None = None  # the Python function (or resume) it compiled
    graph_breaks: int | None = None  # graph breaks of that function, when dynamo says
    # (custom op, what ran of it at run time) for the custom ops its graph holds
    custom_ops: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Compilation(TracedGroup, Displayable):
    """torch.compile compiling a graph: the operator calls it made while tracing the code
    (on fake tensors) are counted, not recorded."""

    kind: ClassVar[str] = "compiling"
    compile_id: str = ""
    calls: int = 0  # operator calls left out


TracedItem = TracedCall | TracedGroup


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

    # the calls the traced code made itself, in order, and the groups (autograd nodes,
    # compiled regions) that ran the others
    calls: tuple[TracedItem, ...] = ()
    time_ns: int = 0  # wall time of the traced code, tracer overhead taken out
    overhead_ns: int = 0  # time the tracer spent recording
    exception: BaseException | None = field(default=None, repr=False)  # what the code raised
    notes: tuple[Any, ...] = ()  # noted while no operator call ran (dispatch.notes)
    values: bool = False  # outputs were summarised (trace(..., values=True))
    _value: Any = field(default=NO_RESULT, repr=False, compare=False)
    _surprises: Surprises = field(default=NO_SURPRISES, repr=False, compare=False)

    @property
    def result(self) -> Any:
        """What the traced function returned (re-raises what it raised; ``None`` for a block)."""
        if self.exception is not None:
            raise self.exception
        return None if self._value is NO_RESULT else self._value

    def walk(self) -> Iterator[TracedCall]:
        """Every operator call, depth-first: each call, then the calls under it (through the
        autograd nodes and compiled regions that ran them)."""
        return walk_calls(self.calls)

    def nodes(self) -> tuple[AutogradNode, ...]:
        """The autograd nodes that ran, in order (each with its calls and forward call)."""
        return tuple(item for item in walk_all(self.calls) if isinstance(item, AutogradNode))

    def regions(self) -> tuple[CompiledRegion, ...]:
        """The compiled graphs that ran, in order, with the operators they called."""
        return tuple(item for item in walk_all(self.calls) if isinstance(item, CompiledRegion))

    def __len__(self) -> int:
        return sum(1 for _ in self.walk())

    def surprises(self) -> Surprises:
        """Fallbacks that ran, ops with no kernel of their own, autocast casts, CPU fallbacks,
        custom ops without a fake impl or autograd (worked out when the trace finished)."""
        return self._surprises

    def frame(self) -> pandas.DataFrame:
        """A row per call (depth, op, path, kernel kind, source, time, ...), depth-first."""
        return self.view("frame")

    def diagram(self) -> Diagram:
        """The call graph: calls as nodes with their paths, decompositions nested."""
        return self.view("diagram")


def walk_all(items: tuple[TracedItem, ...]) -> Iterator[TracedItem]:
    """Every call and group of ``items`` and under them, depth-first (a stack, not nested
    generators: traces are walked as they finish and as they are shown)."""
    stack = list(reversed(items))
    while stack:
        item = stack.pop()
        yield item
        stack.extend(reversed(item.children))


def walk_calls(items: tuple[TracedItem, ...]) -> Iterator[TracedCall]:
    """Every operator call of ``items`` and under them, depth-first."""
    return (item for item in walk_all(items) if isinstance(item, TracedCall))
