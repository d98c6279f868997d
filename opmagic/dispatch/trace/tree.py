"""The observer's log as a tree: each thread's events become calls and groups (autograd nodes,
compiled regions, compilations), the threads torch handed work to are grafted where they ran,
and backward calls are linked to their autograd node and the forward call that made it.

A call's path continues across a kernel's call of its own operator (an autograd kernel, an
autocast wrapper, a mode's handler calling the op again): that call is reported itself and its
keys continue the caller's path. Calls that run while a call's kernels run are its children.

An autograd node is tied to its forward call by the autograd sequence number: the dispatcher
gives every call that starts at an autograd key (in grad mode) the number the next node will
take, the node that call's autograd kernel makes takes it, and the node carries it and the
forward thread into its backward. The call that made node N on a thread is the last call
entered there with number N and an input that requires grad (calls whose kernels make no node
leave the number to the next).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..._torch import dynamo, op_observer
from ..resolve import Step
from .arguments import OpInfo, Summarised, TensorInfo
from .origins import Origins
from .result import (
    AutogradNode,
    CodeLocation,
    Compilation,
    CompiledRegion,
    Output,
    TracedCall,
    TracedGroup,
    TracedItem,
    ValueSummary,
    walk_all,
    walk_calls,
)

EVALUATE_FUNCTION = "autograd::engine::evaluate_function: "  # the engine's range per node
COMPILED_REGION = "Torch-Compiled Region: "  # dynamo's range around a compiled graph's run
RANGES = (EVALUATE_FUNCTION, COMPILED_REGION)


class Segment(NamedTuple):
    """The kernels one dispatch of a call runs, until one calls the op again."""

    op: str
    steps: tuple[Step, ...]
    error: str | None
    recalls: bool  # the last kernel calls the op again
    context: tuple[str, ...]
    compiling: str | None = None  # describe hid the call: torch.compile compiles this graph


Resolved = tuple[CodeLocation | None, str | None, str | None]  # (called from, module, type)


@dataclass
class _Open:
    """A call whose kernels are running."""

    info: OpInfo
    steps: list[Step]
    error: str | None
    recalls_pending: bool
    context: tuple[str, ...]
    logged: Any  # the arguments as the observer logged them
    start_ns: int
    overhead_at_start: int  # the observer's time spent so far when the call began
    depth: int
    origin: Resolved
    origin_code: Any  # the code object the call's origin frame runs (None: inherited)
    loaded_before: int  # Python modules loaded when it began (-1: not counted)
    children: list[TracedItem] = field(default_factory=list)
    notes: list[Any] = field(default_factory=list)
    recalls: int = 0
    unwound: bool = False
    loaded: int = 0  # modules loaded while it ran (its children's included)
    call: TracedCall | None = None  # what it became


@dataclass
class _Group:
    """A node, region or compilation whose calls are running."""

    kind: int  # op_observer.RANGE, NODE or HIDDEN
    name: str
    start_ns: int
    overhead_at_start: int
    depth: int
    origin: Resolved
    sequence_nr: int = -1
    forward_thread: int = 0
    compiling: str = ""
    children: list[TracedItem] = field(default_factory=list)
    unwound: bool = False
    node_entered: bool = False  # an evaluate_function range: its node's record was seen
    formula_code: Any = None  # the code of the first call Python code inside it made


@dataclass
class _Recall:
    """A kernel of ``target`` called its op again: this dispatch continues target's path."""

    target: _Open


@dataclass
class _NodeRecord:
    """The node's own record inside the engine's evaluate_function range (which groups)."""

    target: _Group


_Frame = _Open | _Group | _Recall | _NodeRecord
NO_ORIGIN: Resolved = (None, None, None)


@dataclass
class ThreadTree:
    """One thread's events as a tree (:meth:`build`), and what linking needs of it."""

    infos: list[OpInfo]
    segments: list[Segment]
    origins: Origins
    thread: str | None  # its label; None for the thread that traced
    record_function_id: int
    noted: Iterator[tuple[int, Any]] = field(default_factory=lambda: iter(()))
    items: list[TracedItem] = field(default_factory=list)
    unowned: list[Any] = field(default_factory=list)  # notes made while no call ran
    spans: dict[int, tuple[int, int]] = field(default_factory=dict)  # id(item) -> start, end
    # forward calls that may have made a node, by sequence number (the last one entered)
    forward: dict[int, _Open] = field(default_factory=dict)
    nodes: list[tuple[AutogradNode, int, int]] = field(default_factory=list)  # node, nr, thread
    compiled: dict[str, dynamo.CompiledFrame] | None = None  # read at the first region

    def build(self, events: list[tuple[Any, ...]]) -> None:
        """Turn the thread's events into :attr:`items`."""
        stack: list[_Frame] = []
        pending = next(self.noted, None)

        def owner() -> _Open | _Group | None:
            top = stack[-1] if stack else None
            return top.target if isinstance(top, (_Recall, _NodeRecord)) else top

        def innermost_call() -> _Open | None:
            for frame in reversed(stack):
                if isinstance(frame, _Open):
                    return frame
            return None

        def attach_notes(position: int | None) -> None:
            """Give the notes made before event ``position`` (all: None) to their call."""
            nonlocal pending
            while pending is not None and (position is None or pending[0] <= position):
                running = innermost_call()
                (running.notes if running is not None else self.unowned).append(pending[1])
                pending = next(self.noted, None)

        for index, event in enumerate(events):
            attach_notes(index)
            kind = event[0]
            if kind == op_observer.EXIT:
                self._exit(stack, owner, event)
            elif kind >= 0:
                self._enter_call(stack, owner(), event)
            else:
                self._enter_group(stack, owner(), event)
        attach_notes(None)
        while stack:  # calls the code never returned from (it was interrupted inside them)
            frame = stack.pop()
            if isinstance(frame, (_Open, _Group)):
                frame.unwound = True
                self._close(frame, owner(), frame.start_ns, frame.overhead_at_start, None, -1)

    # ---------------------------------------------------------------- events

    def _enter_call(self, stack: list[_Frame], parent: _Open | _Group | None, event: tuple) -> None:
        op, detail, at_ns, overhead_ns, arguments, sequence_nr, origin, loaded = event
        info, segment = self.infos[op], self.segments[detail]
        if isinstance(parent, _Open) and parent.recalls_pending and parent.info is info:
            parent.steps.extend(segment.steps)
            parent.error = parent.error or segment.error
            parent.recalls_pending = segment.recalls
            parent.recalls += 1
            stack.append(_Recall(parent))
            return
        frame = _Open(
            info=info,
            steps=list(segment.steps),
            error=segment.error,
            recalls_pending=segment.recalls,
            context=segment.context,
            logged=arguments,
            start_ns=at_ns,
            overhead_at_start=overhead_ns,
            depth=0 if parent is None else parent.depth + 1,
            origin=self._origin(origin, parent),
            origin_code=origin[0] if origin is not None else None,
            loaded_before=loaded,
        )
        if sequence_nr >= 0 and _requires_grad(arguments):
            self.forward[sequence_nr] = frame
        stack.append(frame)

    def _enter_group(
        self, stack: list[_Frame], parent: _Open | _Group | None, event: tuple
    ) -> None:
        kind, detail, at_ns, overhead_ns, _, sequence_nr, origin, extra = event
        if (
            kind == op_observer.NODE
            and isinstance(parent, _Group)
            and parent.kind == op_observer.RANGE
            and parent.name == EVALUATE_FUNCTION + detail
            and not parent.node_entered
        ):
            parent.node_entered = True  # the node runs inside the engine's range: one group
            parent.sequence_nr, parent.forward_thread = sequence_nr, extra
            stack.append(_NodeRecord(parent))
            return
        group = _Group(
            kind=kind,
            name=detail,
            start_ns=at_ns,
            overhead_at_start=overhead_ns,
            depth=0 if parent is None else parent.depth + 1,
            origin=self._origin(origin, parent),
            sequence_nr=sequence_nr,
            forward_thread=extra,
        )
        if kind == op_observer.HIDDEN:
            group.compiling = self.segments[detail].compiling or ""
        stack.append(group)

    def _exit(self, stack: list[_Frame], owner: Callable[[], Any], event: tuple) -> None:
        _, unwinding, at_ns, overhead_ns, outputs, extra = event
        if not stack:  # the exit of a call that began before this trace
            return
        frame = stack.pop()
        if isinstance(frame, (_Recall, _NodeRecord)):
            frame.target.unwound = frame.target.unwound or unwinding
            return
        frame.unwound = frame.unwound or unwinding
        self._close(frame, owner(), at_ns, overhead_ns, outputs, extra)

    def _close(
        self,
        frame: _Open | _Group,
        parent: _Open | _Group | None,
        at_ns: int,
        overhead_ns: int,
        outputs: Any,
        extra: int,
    ) -> None:
        """The finished call or group, added to its parent (or the top level)."""
        time_ns = max(0, at_ns - frame.start_ns - (overhead_ns - frame.overhead_at_start))
        item = (
            self._call(frame, time_ns, outputs, extra)
            if isinstance(frame, _Open)
            else self._group(frame, time_ns, extra)
        )
        siblings = parent.children if parent is not None else self.items
        if isinstance(item, Compilation) and siblings and _same_compilation(siblings[-1], item):
            item = _merged(siblings.pop(), item)  # one compilation, not a row per fake call
        siblings.append(item)
        self.spans[id(item)] = (frame.start_ns, at_ns)
        if isinstance(frame, _Open) and isinstance(parent, _Open):
            parent.loaded += frame.loaded
        if (
            isinstance(frame, _Open)
            and isinstance(parent, _Group)
            and parent.formula_code is None
            and frame.origin_code is not None
            and frame.origin[0] != parent.origin[0]
        ):
            parent.formula_code = frame.origin_code  # Python code inside the node made it

    def _call(self, frame: _Open, time_ns: int, outputs: Any, loaded_after: int) -> TracedCall:
        first_call = None
        if frame.loaded_before >= 0 and loaded_after >= 0:
            total = loaded_after - frame.loaded_before
            own = total - frame.loaded
            frame.loaded = max(frame.loaded, total)
            if own > 0:
                first_call = f"Python loaded {own} module{'s' if own != 1 else ''} during it"
        called_from, module, module_type = frame.origin
        frame.call = TracedCall(
            op=frame.info.label,
            steps=tuple(frame.steps),
            children=tuple(frame.children),
            error=frame.error,
            raised=frame.unwound,
            context=frame.context,
            time_ns=time_ns,
            depth=frame.depth,
            recalls=frame.recalls,
            notes=tuple(frame.notes),
            called_from=called_from,
            module=module,
            module_type=module_type,
            thread=self.thread,
            outputs=None if outputs is None else _outputs(outputs),
            first_call=first_call,
            _log=(frame.info, frame.logged),
        )
        return frame.call

    def _group(self, frame: _Group, time_ns: int, extra: int) -> TracedGroup:
        common = {
            "children": tuple(frame.children),
            "time_ns": time_ns,
            "depth": frame.depth,
            "thread": self.thread,
            "raised": frame.unwound,
            "called_from": frame.origin[0],
        }
        if frame.kind == op_observer.HIDDEN:
            return Compilation(
                name=f"graph {frame.compiling}",
                compile_id=frame.compiling,
                calls=extra + 1,
                **common,
            )
        if frame.kind == op_observer.RANGE and frame.name.startswith(COMPILED_REGION):
            return self._region(frame.name.removeprefix(COMPILED_REGION), common)
        name = frame.name.removeprefix(EVALUATE_FUNCTION)
        formula = frame.formula_code
        node = AutogradNode(
            name=name,
            sequence_nr=frame.sequence_nr,
            formula=self.origins.definition(formula) if formula is not None else None,
            **common,
        )
        self.nodes.append((node, frame.sequence_nr, frame.forward_thread))
        return node

    def _region(self, compile_id: str, common: dict[str, Any]) -> CompiledRegion:
        """A compiled graph that ran: what dynamo recorded of it, and its custom ops' fate."""
        if self.compiled is None:
            self.compiled = dynamo.compiled_frames()
        compiled = self.compiled.get(compile_id)
        if compiled is None:
            return CompiledRegion(name=f"graph {compile_id}", compile_id=compile_id, **common)
        called = {}
        for call in walk_calls(common["children"]):
            called.setdefault(call.op.partition(".")[0], call)
        custom_ops = tuple(
            (op, _custom_op_fate(called.get(op))) for op in sorted(compiled.custom_ops)
        )
        where = self.origins.named(compiled.filename, compiled.line, compiled.name)
        name = compiled.name
        if compiled.resumes_at is not None:
            name += f" after the graph break at line {compiled.resumes_at}"
        return CompiledRegion(
            name=f"{name} (graph {compile_id})",
            compile_id=compile_id,
            function=where,
            graph_breaks=compiled.graph_breaks,
            custom_ops=custom_ops,
            **common,
        )

    def _origin(self, origin: Any, parent: _Open | _Group | None) -> Resolved:
        """The call's origin named, or its caller's when the observer did not read one."""
        if origin is None:
            return parent.origin if parent is not None else NO_ORIGIN
        code, line, modules = origin
        location = self.origins.location(code, line) if code is not None else None
        path, module_type = self.origins.module(modules)
        return location, path, module_type


def _requires_grad(logged: Any) -> bool:
    """Whether a tensor argument of a logged call requires grad (then its autograd kernel
    can have made a node)."""
    if isinstance(logged, Summarised):
        return any(_info_requires_grad(value) for value in logged)
    kinds, values = logged
    for kind, value in zip(kinds, values, strict=True):
        if kind == "t" and value is not None and value[3]:
            return True
        if kind == "l" and any(v is not None and v[3] for v in value):
            return True
    return False


def _info_requires_grad(value: Any) -> bool:
    if isinstance(value, TensorInfo):
        return value.requires_grad
    return isinstance(value, tuple) and any(_info_requires_grad(v) for v in value)


def _outputs(outputs: tuple[Any, ...]) -> tuple[Output, ...]:
    """The observer's summaries of a call's outputs (a tensor's, or a list of them for a
    tensor list) as :class:`ValueSummary` objects."""
    return tuple(
        tuple(_value(v) for v in output) if isinstance(output, list) else _value(output)
        for output in outputs
    )


def _value(logged: Any) -> ValueSummary | None:
    if logged is None:
        return None
    (dtype, device, shape, requires_grad), numbers = logged
    tensor = TensorInfo("Tensor", str(dtype).removeprefix("torch."), device, shape, requires_grad)
    return ValueSummary(tensor, *(numbers if numbers is not None else (None, None, None)))


def _custom_op_fate(call: TracedCall | None) -> str:
    """What ran of a custom op a compiled graph holds: its real kernel, or nothing."""
    if call is None:
        return (
            "not called at run time: the compiled code does its work itself (decomposed or fused)"
        )
    if call.error:
        return f"called, and failed: {call.error}"
    kernel = call.path[-1] if call.path else "no kernel"
    return f"called: its real {kernel} kernel ran"


def _same_compilation(previous: TracedItem, item: Compilation) -> bool:
    return isinstance(previous, Compilation) and previous.compile_id == item.compile_id


def _merged(previous: Compilation, item: Compilation) -> Compilation:
    return dataclasses.replace(
        previous,
        time_ns=previous.time_ns + item.time_ns,
        calls=previous.calls + item.calls,
        raised=previous.raised or item.raised,
    )


# ------------------------------------------------------------------ threads and links


def graft(
    items: tuple[TracedItem, ...],
    foreign: list[tuple[int, TracedItem]],
    spans: dict[int, tuple[int, int]],
    replaced: dict[int, tuple[Any, Any]],
) -> tuple[TracedItem, ...]:
    """``items`` with ``foreign`` (start time, item) put where they ran: under the innermost
    item whose span holds their start, else among ``items`` in time order. Items given new
    children are recorded in ``replaced``: ``id(old) -> (old, new)``."""
    if not foreign:
        return items
    inside: dict[int, list[tuple[int, TracedItem]]] = {}
    loose: list[tuple[int, TracedItem]] = []
    for start, item in foreign:
        holder = next(
            (
                i
                for i, mine in enumerate(items)
                if spans[id(mine)][0] <= start <= spans[id(mine)][1]
            ),
            None,
        )
        (inside.setdefault(holder, []) if holder is not None else loose).append((start, item))
    merged = []
    for i, mine in enumerate(items):
        if i in inside:
            children = graft(mine.children, inside[i], spans, replaced)
            grafted = dataclasses.replace(mine, children=children)
            spans[id(grafted)] = spans[id(mine)]
            replaced[id(mine)] = (mine, grafted)
            mine = grafted
        merged.append((spans[id(items[i])][0], mine))
    merged.extend(loose)
    merged.sort(key=lambda pair: pair[0])
    return tuple(item for _, item in merged)


def link(
    items: tuple[TracedItem, ...],
    trees: list[ThreadTree],
    final: Callable[[Any], Any],
) -> None:
    """Tie each autograd node to the forward call that made it and each backward call to its
    node; backward calls take their forward call's module. ``final(obj)`` is what ``obj``
    became in ``items`` (failures named, threads grafted)."""
    forward = {
        (tree.record_function_id, number): frame.call
        for tree in trees
        for number, frame in tree.forward.items()
        if frame.call is not None
    }
    for tree in trees:
        for node, number, thread in tree.nodes:
            node = final(node)
            made_by = forward.get((thread, number))
            made_by = final(made_by) if made_by is not None else None
            _complete(node, forward=made_by)
            if made_by is not None:
                _complete(made_by, backward=(*made_by.backward, node))
            for call in walk_all(node.children):
                if isinstance(call, TracedCall) and call.node is None:
                    _complete(call, node=node)
                    if made_by is not None and made_by.module is not None:
                        _complete(call, module=made_by.module, module_type=made_by.module_type)


def _complete(snapshot: Any, **fields: Any) -> None:
    """Set the links of a snapshot being finished: objects that refer to each other (a node
    and its forward call) cannot both be made whole in one go."""
    for name, value in fields.items():
        object.__setattr__(snapshot, name, value)


def mark_failures(
    items: tuple[TracedItem, ...],
    exception: BaseException | None,
    replaced: dict[int, tuple[Any, Any]],
) -> tuple[TracedItem, ...]:
    """Say why calls raised: the exception the traced code raised, on the calls it came out
    of; raises that a caller caught, as such. A predicted dispatch failure is kept. Items
    changed are recorded in ``replaced``: ``id(old) -> (old, new)``."""
    if exception is None and not any(item.raised for item in walk_all(items)):
        return items
    message = f"{type(exception).__name__}: {exception}" if exception is not None else None

    def mark(item: TracedItem, on_chain: bool) -> TracedItem:
        below = _last_raised(item.children) if on_chain else None
        children = tuple(mark(c, c is below) for c in item.children)
        changes: dict[str, Any] = {}
        if any(new is not old for new, old in zip(children, item.children, strict=True)):
            changes["children"] = children
        if isinstance(item, TracedCall) and item.raised and item.error is None:
            changes["error"] = message if on_chain else "raised an exception that its caller caught"
        if not changes:
            return item
        marked = dataclasses.replace(item, **changes)
        replaced[id(item)] = (item, marked)
        return marked

    failing = _last_raised(items) if message is not None else None
    return tuple(mark(item, item is failing) for item in items)


def _last_raised(items: tuple[TracedItem, ...]) -> TracedItem | None:
    """The last of ``items`` if it raised: the one an exception still propagating left."""
    return items[-1] if items and items[-1].raised else None
