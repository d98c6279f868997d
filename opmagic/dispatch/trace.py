"""``trace(fn, *args, **kwargs)``: every operator call a piece of code makes, with its path.

How it sees the calls: the dispatcher's own observer hook (RecordFunction, what torch.profiler
uses) reports each operator call on this thread (a call from Python, from a C++ kernel, from
a ``__torch_dispatch__`` handler) after the call's keys are computed and before its first
kernel runs. The hook adds no dispatch key and changes no thread-local state, so every call
dispatches as it would untraced.

How it knows the path: at each reported call, under the thread-local state of that moment,
:func:`opmagic.resolve` gives the keys whose kernels run until a kernel calls the operator
again (an autocast wrapper, a functorch layer, a mode's handler); that call is reported too,
and its keys continue the path. Calls that run while a call's kernels run are its children.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from .._torch import custom_op_state, dispatcher, op_observer
from ..display import Displayable
from ..errors import ArgumentTypeError, OpmagicError
from .ops import OpParameter, op_parameters, op_ref
from .resolve import Step, resolve
from .sites import parse_site
from .table import dispatch_table

if TYPE_CHECKING:
    import pandas

    from ..view.graph import Diagram
    from .table import TableEntry

# Keys whose backend fallback is plumbing that runs for every call in its context
ROUTINE_FALLBACKS = frozenset(
    {
        "Python",
        "PythonTLSSnapshot",
        "PythonDispatcher",
        "PreDispatch",
        "FuncTorchDynamicLayerFrontMode",
        "FuncTorchDynamicLayerBackMode",
        "FuncTorchGradWrapper",
        "Functionalize",
        "Tracer",
    }
)
BATCHING_FALLBACKS = frozenset({"FuncTorchBatched", "BatchedNestedTensor", "Batched"})
CAST_OPS = frozenset(
    {
        "aten::to.dtype",
        "aten::to.dtype_layout",
        "aten::to.device",
        "aten::_to_copy",
        "aten::_autocast_to_reduced_precision",
        "aten::_autocast_to_full_precision",
    }
)
_TORCH_SITES = ("/pytorch/pytorch/", "/site-packages/torch/", "/dist-packages/torch/")
_DTYPE_SHORT = {
    "float32": "f32",
    "float64": "f64",
    "float16": "f16",
    "bfloat16": "bf16",
    "int64": "i64",
    "int32": "i32",
    "int16": "i16",
    "int8": "i8",
    "uint8": "u8",
    "bool": "b8",
    "complex64": "c64",
    "complex128": "c128",
}


class TensorInfo(NamedTuple):
    """What a tensor argument looked like: the trace keeps no tensors alive."""

    type: str  # "Tensor", or the subclass's name
    dtype: str  # "float32"
    device: str  # "cpu", "meta", ...
    shape: tuple[int, ...] | None  # None for a nested tensor (no one shape)
    requires_grad: bool

    def __str__(self) -> str:
        shape = "nested" if self.shape is None else ",".join(map(str, self.shape))
        text = f"{_DTYPE_SHORT.get(self.dtype, self.dtype)}[{shape}]"
        if self.device != "cpu":
            text += f"@{self.device}"
        if self.requires_grad:
            text += " grad"
        return text if self.type == "Tensor" else f"{self.type}({text})"


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
    _log: Any = field(default=None, repr=False, compare=False)  # (op info, logged arguments)

    @functools.cached_property
    def arguments(self) -> tuple[Any, ...]:
        """Per schema argument: a TensorInfo (tensors are not kept), a tuple of them (tensor
        lists), or the value (dtypes, devices, numbers, sizes, ...)."""
        return () if self._log is None else _logged_arguments(*self._log)

    @property
    def parameters(self) -> tuple[OpParameter, ...]:
        """The operator's schema arguments (name, type, default), in order."""
        return () if self._log is None else self._log[0].parameters

    @property
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

    @property
    def inputs(self) -> str:
        """The arguments in short: tensors as ``f32[2,3]``, others as ``name=value`` when they
        differ from the schema's default."""
        shown = []
        for param, value in zip(self.parameters, self.arguments, strict=False):
            if isinstance(value, TensorInfo):
                shown.append(str(value))
            elif isinstance(value, tuple) and any(isinstance(v, TensorInfo) for v in value):
                shown.append("[" + ", ".join(str(v) for v in value) + "]")
            elif not (param.has_default and _same_value(value, param.default)):
                shown.append(f"{param.name}={_short_value(value)}")
        return ", ".join(shown)

    def walk(self) -> Iterator[TracedCall]:
        """This call, then every call under it, depth-first."""
        yield self
        for child in self.children:
            yield from child.walk()


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


_NO_RESULT = object()


@dataclass
class Trace(Displayable):
    """Every operator call a piece of code made, as a tree in call order."""

    calls: tuple[TracedCall, ...] = ()  # the calls the traced code made itself, in order
    time_ns: int = 0  # wall time of the traced code, tracer overhead taken out
    overhead_ns: int = 0  # time the tracer spent recording
    exception: BaseException | None = field(default=None, repr=False)  # what the code raised
    _value: Any = field(default=_NO_RESULT, repr=False, compare=False)

    @property
    def result(self) -> Any:
        """What the traced function returned (re-raises what it raised; ``None`` for a block)."""
        if self.exception is not None:
            raise self.exception
        return None if self._value is _NO_RESULT else self._value

    def walk(self) -> Iterator[TracedCall]:
        """Every call, depth-first: each call, then the calls under it."""
        return _walk_all(self.calls)

    def __len__(self) -> int:
        return sum(1 for _ in self.walk())

    def surprises(self) -> Surprises:
        """Fallbacks that ran, ops with no kernel of their own, autocast casts, CPU fallbacks,
        custom ops without a fake impl or autograd."""
        return find_surprises(self)

    def frame(self) -> pandas.DataFrame:
        """A row per call (depth, op, path, kernel kind, source, time, ...), depth-first."""
        return self.view("frame")

    def diagram(self) -> Diagram:
        """The call graph: calls as nodes with their paths, decompositions nested."""
        return self.view("diagram")


def trace(fn: Callable[..., Any] | None = None, /, *args: Any, **kwargs: Any) -> Any:
    """Run ``fn(*args, **kwargs)`` once and return its :class:`Trace`.

    Every operator call it makes is recorded with the dispatch keys whose kernels ran and the
    calls those kernels made. ``Trace.result`` is what ``fn`` returned; if ``fn`` raises, the
    trace keeps the exception and ``Trace.result`` raises it. Without ``fn``, a context
    manager: ``with opmagic.trace() as t: ...`` fills ``t`` when the block ends (the block's
    exceptions propagate).
    """
    if fn is None:
        if args or kwargs:
            raise ArgumentTypeError("trace() takes arguments only after the function to trace")
        return _TraceBlock()
    if not callable(fn):
        raise ArgumentTypeError(
            f"trace() needs a function to run, got {type(fn).__name__}. Pass the function and "
            "its arguments, trace(model, x), or use the block form: with opmagic.trace() as t:"
        )
    recording = _Recording()
    recording.start()
    try:
        value = fn(*args, **kwargs)
    except Exception as exc:
        return recording.finish(exc)
    except BaseException as exc:  # KeyboardInterrupt: stop tracing, let it through
        recording.finish(exc)
        raise
    return recording.finish(None, value)


def prepare_in_background() -> None:
    """Start compiling trace's C++ operator observer on a daemon thread, if it is not built
    yet (once per torch version), so that the first trace need not wait for the compiler;
    that trace waits for this build instead of starting another. Returns at once and never
    raises: a failed build is reported by the first trace."""
    op_observer.build_in_background()


class _TraceBlock:
    """``with opmagic.trace() as t:``: ``t`` is filled in when the block ends."""

    def __init__(self) -> None:
        self.trace = Trace()
        self._recording: _Recording | None = None

    def __enter__(self) -> Trace:
        self._recording = _Recording()
        self._recording.start()
        return self.trace

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        assert self._recording is not None
        done = self._recording.finish(exc)
        for name in ("calls", "time_ns", "overhead_ns", "exception"):
            setattr(self.trace, name, getattr(done, name))


# ------------------------------------------------------------------ recording


class _OpInfo(NamedTuple):
    """What the tracer needs of one operator overload, looked up once."""

    overload: Any  # the OpOverload
    label: str  # "aten::add.Tensor"
    parameters: tuple[OpParameter, ...]
    selectors: tuple[int, ...]  # positions of device/dtype/layout arguments (BackendSelect)
    enums: tuple[tuple[int, tuple[Any, ...]], ...]  # (position, objects by value) of enum args


class _Segment(NamedTuple):
    """The kernels one dispatch of a call runs, until one calls the op again."""

    op: str
    steps: tuple[Step, ...]
    error: str | None
    recalls: bool  # the last kernel calls the op again
    context: tuple[str, ...]


@dataclass
class _PathCache:
    """Segments of one operator's calls whose path Python code decides, by dispatch state;
    valid while the fingerprint of its registrations stays the same."""

    fingerprint: tuple[str, str]
    segments: dict[tuple, _Segment] = field(default_factory=dict)


_ops: dict[tuple[str, str], _OpInfo] = {}
_paths: dict[tuple[str, str], _PathCache] = {}
# Every segment handed to the observer, by the id it knows it by (it keeps them across traces)
_segments: list[_Segment] = []
_segment_ids: dict[int, int] = {}  # id(segment) -> its index in _segments
_FRONT_BIT = dispatcher.single_key_raw("FuncTorchDynamicLayerFrontMode") or 0


@dataclass
class _Open:
    """A call whose kernels are running."""

    info: _OpInfo
    steps: list[Step]
    error: str | None
    recalls_pending: bool
    context: tuple[str, ...]
    logged: Any  # the arguments as the observer logged them
    start_ns: int
    overhead_at_start: int  # the observer's time spent so far when the call began
    depth: int
    children: list[TracedCall] = field(default_factory=list)
    recalls: int = 0
    unwound: bool = False

    def close(self, time_ns: int) -> TracedCall:
        """The finished call."""
        return TracedCall(
            op=self.info.label,
            steps=tuple(self.steps),
            children=tuple(self.children),
            error=self.error,
            raised=self.unwound,
            context=self.context,
            time_ns=max(0, time_ns),
            depth=self.depth,
            recalls=self.recalls,
            _log=(self.info, self.logged),
        )


@dataclass
class _Recall:
    """A kernel of ``target`` called its op again: this dispatch continues target's path."""

    target: _Open


class _Summarised(tuple):
    """Argument summaries Python made (a call whose path Python code decides)."""


class _Recording:
    """One trace on this thread: the observer's log, described and then built into a tree."""

    def __init__(self) -> None:
        self.checked: set[tuple[str, str]] = set()  # operators checked during this trace
        self.started_ns = 0
        # torch 2.14's custom_op calls skip the observer's hook: off while tracing
        self.shortcuts_back_on: Callable[[], None] = lambda: None

    def start(self) -> None:
        if op_observer.running():
            raise OpmagicError(
                "opmagic.trace is already tracing on this thread: a trace cannot run inside "
                "another. Trace the outer code once; its trace holds the inner calls too."
            )
        op_observer.start(self.describe, self.check, __name__)
        self.shortcuts_back_on = custom_op_state.dispatch_shortcuts_off()
        self.started_ns = time.perf_counter_ns()

    def finish(self, exception: BaseException | None, value: Any = _NO_RESULT) -> Trace:
        ended = time.perf_counter_ns()
        ops, events, failure = op_observer.stop()
        self.shortcuts_back_on()
        if failure is not None:
            raise OpmagicError(
                f"opmagic's tracer failed while recording ({type(failure).__name__}: "
                f"{failure}); the traced code ran to the end untraced from there. Please "
                "report this with the code you traced."
            ) from failure
        with dispatcher.torch_function_disabled():
            calls = _mark_failures(self._tree(ops, events), exception)
        observed = events[-1][3] if events else 0  # the observer's own time during the run
        return Trace(
            calls=calls,
            time_ns=max(0, ended - self.started_ns - observed),
            overhead_ns=observed + time.perf_counter_ns() - ended,
            exception=exception,
            _value=value,
        )

    def check(self, op: int, name: str, overload: str) -> bool:
        """Whether the paths worked out earlier for the operator still hold: its registrations
        (and custom-op parts) are as they were. Asked once per trace and operator."""
        with dispatcher.torch_function_disabled():
            return self._checked(_op_info(name, overload), (name, overload))

    def describe(
        self, op: int, name: str, overload: str, inputs: tuple[Any, ...], python_decides: bool
    ) -> tuple[int, Any]:
        """The observer's question about a call: its segment id (and argument summaries when
        Python code decides its path), worked out under the call's own thread-local state."""
        with dispatcher.torch_function_disabled():
            info = _op_info(name, overload)
            inputs = _arguments(info, inputs)
            if python_decides:  # the observer does not cache these: Python does
                self._checked(info, (name, overload))
                cache = _paths[(name, overload)]
                state = _dispatch_state(info, inputs)
                segment = cache.segments.get(state)
                if segment is None:
                    segment = cache.segments[state] = _resolve_segment(info, inputs)
            else:
                segment = _resolve_segment(info, inputs)
            index = _segment_ids.get(id(segment))
            if index is None:
                index = _segment_ids[id(segment)] = len(_segments)
                _segments.append(segment)
            return index, _Summarised(_summaries(inputs)) if python_decides else None

    def _checked(self, info: _OpInfo, op_key: tuple[str, str]) -> bool:
        """Check the operator's fingerprint once per trace; on a change, forget its paths."""
        if op_key in self.checked:
            return True
        self.checked.add(op_key)
        fingerprint = _fingerprint(info.label)
        cache = _paths.get(op_key)
        if cache is not None and cache.fingerprint == fingerprint:
            return True
        _paths[op_key] = _PathCache(fingerprint)
        return False

    def _tree(self, ops: list[tuple[str, str]], events: list[tuple[Any, ...]]) -> tuple:
        """The calls of the log as a tree; a kernel's call of its own op continues its path."""
        infos = [_op_info(name, overload) for name, overload in ops]
        stack: list[_Open | _Recall] = []
        calls: list[TracedCall] = []

        def owner() -> _Open | None:
            top = stack[-1] if stack else None
            return top.target if isinstance(top, _Recall) else top

        for op, detail, at_ns, overhead_ns, arguments in events:
            if op >= 0:
                info, segment, parent = infos[op], _segments[detail], owner()
                if parent is not None and parent.recalls_pending and parent.info is info:
                    parent.steps.extend(segment.steps)
                    parent.error = parent.error or segment.error
                    parent.recalls_pending = segment.recalls
                    parent.recalls += 1
                    stack.append(_Recall(parent))
                    continue
                stack.append(
                    _Open(
                        info=info,
                        steps=list(segment.steps),
                        error=segment.error,
                        recalls_pending=segment.recalls,
                        context=segment.context,
                        logged=arguments,
                        start_ns=at_ns,
                        overhead_at_start=overhead_ns,
                        depth=0 if parent is None else parent.depth + 1,
                    )
                )
                continue
            if not stack:  # the exit of a call that began before this trace
                continue
            frame = stack.pop()
            if isinstance(frame, _Recall):
                frame.target.unwound = frame.target.unwound or detail
                continue
            frame.unwound = frame.unwound or detail
            call = frame.close(at_ns - frame.start_ns - (overhead_ns - frame.overhead_at_start))
            parent = owner()
            (parent.children if parent is not None else calls).append(call)
        while stack:  # calls the code never returned from (it was interrupted inside them)
            frame = stack.pop()
            if isinstance(frame, _Open):
                frame.unwound = True
                parent = owner()
                (parent.children if parent is not None else calls).append(frame.close(0))
        return tuple(calls)


def _op_info(name: str, overload: str) -> _OpInfo:
    """The operator behind a reported call (looked up once per overload)."""
    found = _ops.get((name, overload))
    if found is None:
        namespace, _, short = name.partition("::")
        packet = getattr(getattr(torch.ops, namespace), short)
        op = getattr(packet, overload or "default")
        parameters = op_parameters(op_ref(op))
        selectors = tuple(
            i for i, p in enumerate(parameters) if p.name in ("device", "dtype", "layout")
        )
        tables = op_observer.enum_tables()
        schema = dispatcher.find_schema(name, overload)
        real_types = [str(arg.real_type) for arg in schema.arguments] if schema else []
        enums = tuple(  # the schema says "int" for these; the real type names the enum
            (i, tables[kind])
            for i, real in enumerate(real_types)
            for kind in tables
            if real in (kind, f"Optional[{kind}]")
        )
        found = _ops[(name, overload)] = _OpInfo(
            op, f"{name}.{overload}" if overload else name, parameters, selectors, enums
        )
    return found


def _arguments(info: _OpInfo, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """The call's arguments from what the observer reported: a boxed call reports its whole
    stack (a fallback's own values below the call's), so the arguments are the last ones;
    dtype, layout and memory-format ints become torch objects again."""
    if len(inputs) > len(info.parameters):
        inputs = inputs[len(inputs) - len(info.parameters) :]
    if not info.enums:
        return inputs
    values = list(inputs)
    for position, objects in info.enums:
        value = values[position] if position < len(values) else None
        if isinstance(value, int) and 0 <= value < len(objects):
            values[position] = objects[value]
    return tuple(values)


def _fingerprint(label: str) -> tuple[str, str]:
    """What a cached path of the op depends on: its registrations and its Python-side parts."""
    qualname = label.partition(".")[0]
    opdef = custom_op_state.custom_op_def(qualname)
    python_side = (
        repr(custom_op_state.custom_op_parts(opdef))
        if opdef is not None
        else repr(custom_op_state.registered_fake_impl(qualname))
    )
    return dispatcher.dump_registrations(label), python_side


def _dispatch_state(info: _OpInfo, inputs: tuple[Any, ...]) -> tuple:
    """Everything a call's path depends on besides the op: a cache key for its segment."""
    included = dispatcher.tls_included_raw()
    layers = tuple(dispatcher.functorch_layers()) if included & _FRONT_BIT else ()
    tensors = []
    for value in inputs:
        if isinstance(value, torch.Tensor):
            tensors.append(_tensor_state(value, layers))
        elif isinstance(value, (list, tuple)):
            tensors.extend(_tensor_state(v, layers) for v in value if isinstance(v, torch.Tensor))
        else:
            tensors.append(None)
    return (
        included,
        dispatcher.tls_excluded_raw(),
        torch.is_grad_enabled(),
        torch.is_inference_mode_enabled(),
        tuple(type(mode) for mode in dispatcher.dispatch_modes()),
        layers,
        tuple(tensors),
        tuple(repr(inputs[i]) for i in info.selectors if i < len(inputs)),
    )


def _tensor_state(tensor: torch.Tensor, layers: tuple) -> tuple:
    """A tensor's part of the cache key: its keys and type (and functorch levels)."""
    if not layers:
        return dispatcher.tensor_keyset_raw(tensor), type(tensor)
    return (
        dispatcher.tensor_keyset_raw(tensor),
        type(tensor),
        dispatcher.batched_level(tensor),
        dispatcher.grad_wrapper_level(tensor),
    )


def _resolve_segment(info: _OpInfo, inputs: tuple[Any, ...]) -> _Segment:
    """``resolve`` under the live state, cut where a kernel calls the op again."""
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for param, value in zip(info.parameters, inputs, strict=False):
        if param.kwarg_only:
            kwargs[param.name] = value
        else:
            args.append(value)
    try:
        resolution = resolve(info.overload, *args, **kwargs)
    except Exception as exc:  # never break the traced code: say what could not be modelled
        return _Segment(
            info.label, (), f"opmagic could not work out this call's path: {exc}", False, ()
        )
    steps: list[Step] = []
    for step in resolution.steps:
        steps.append(step)
        if step.action == "call":  # the re-call is reported itself and continues the path
            return _Segment(resolution.op, tuple(steps), None, True, resolution.context)
    return _Segment(resolution.op, tuple(steps), resolution.error, False, resolution.context)


def _logged_arguments(info: _OpInfo, logged: Any) -> tuple[Any, ...]:
    """Arguments as the trace keeps them, from the log: Python's summaries as they are, the
    observer's (``(kinds, values)``, ``t`` a tensor, ``l`` a tensor list, ``v`` a value)
    turned into TensorInfo and plain values."""
    if isinstance(logged, _Summarised):
        return tuple(logged)
    kinds, values = logged
    arguments = _arguments(
        info,
        tuple(
            _logged_tensor(value)
            if kind == "t"
            else tuple(_logged_tensor(v) for v in value)
            if kind == "l"
            else value
            for kind, value in zip(kinds, values, strict=True)
        ),
    )
    return tuple(_summary(value) for value in arguments)


def _logged_tensor(logged: tuple[Any, ...] | None) -> TensorInfo | None:
    if logged is None:
        return None
    dtype, device, shape, requires_grad = logged
    return TensorInfo("Tensor", str(dtype).removeprefix("torch."), device, shape, requires_grad)


def _summaries(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """The arguments as the trace keeps them: tensors summarised, small values as they are."""
    return tuple(_summary(value) for value in inputs)


def _summary(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        try:
            shape: tuple[int, ...] | None = tuple(value.shape)
        except RuntimeError:  # nested tensors have no single shape
            shape = None
        kind = type(value)
        return TensorInfo(
            "Tensor" if kind is torch.Tensor else kind.__name__,
            str(value.dtype).removeprefix("torch."),
            value.device.type,
            shape,
            value.requires_grad,
        )
    if isinstance(value, TensorInfo):
        return value
    if isinstance(value, (list, tuple)):
        return tuple(_summary(v) for v in value)
    if value is None or isinstance(
        value,
        (
            bool,
            int,
            float,
            complex,
            str,
            torch.dtype,
            torch.device,
            torch.layout,
            torch.memory_format,
        ),
    ):
        return value
    return f"<{type(value).__name__}>"


def _same_value(value: Any, default: Any) -> bool:
    try:
        return bool(value == default) or (isinstance(default, list) and value == tuple(default))
    except Exception:  # values that do not compare (e.g. a summary with a tensor default)
        return False


def _short_value(value: Any) -> str:
    if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
        return str(value).removeprefix("torch.")
    if isinstance(value, tuple):
        return "[" + ",".join(_short_value(v) for v in value) + "]"
    return str(value)


def _mark_failures(calls: tuple[TracedCall, ...], exception: BaseException | None) -> tuple:
    """Say why calls raised: the exception the traced code raised, on the calls it came out
    of; raises that a caller caught, as such. A predicted dispatch failure is kept."""
    if exception is None and not any(call.raised for call in _walk_all(calls)):
        return calls
    message = f"{type(exception).__name__}: {exception}" if exception is not None else None

    def mark(call: TracedCall, on_chain: bool) -> TracedCall:
        below = _last_raised(call.children) if on_chain else None
        children = tuple(mark(c, c is below) for c in call.children)
        error = call.error
        if call.raised and error is None:
            error = message if on_chain else "raised an exception that its caller caught"
        if children == call.children and error == call.error:
            return call
        return dataclasses.replace(call, children=children, error=error)

    failing = _last_raised(calls) if message is not None else None
    return tuple(mark(c, c is failing) for c in calls)


def _walk_all(calls: tuple[TracedCall, ...]) -> Iterator[TracedCall]:
    """Every call of ``calls`` and under them, depth-first."""
    for call in calls:
        yield from call.walk()


def _last_raised(calls: tuple[TracedCall, ...]) -> TracedCall | None:
    """The last of ``calls`` if it raised: the one an exception still propagating left."""
    return calls[-1] if calls and calls[-1].raised else None


# ------------------------------------------------------------------ surprises


SURPRISE_ORDER = (
    "no fake impl",
    "no autograd",
    "no autograd kernel",
    "no batching rule",
    "CPU fallback",
    "fallback",
    "autocast cast",
    "decomposed",
    "generic kernel",
)


def find_surprises(trace: Trace) -> Surprises:
    """What in ``trace`` deserves a second look, one entry per (kind, op) with how many calls
    showed it, most consequential kinds first."""
    found: dict[tuple[str, str], list] = {}  # (kind, op) -> [count, detail, called ops]
    for call in trace.walk():
        for kind, detail in _call_surprises(call):
            entry = found.setdefault((kind, call.op), [0, detail, {}])
            entry[0] += 1
            if kind == "decomposed":
                entry[2].update(dict.fromkeys(c.op for c in _decomposition(call)))
    for op, kind, detail in _custom_op_gaps({call.op for call in trace.walk()}):
        found[(kind, op)] = [1, detail, {}]
    items = []
    for (kind, op), (count, detail, called) in found.items():
        if kind == "decomposed":
            detail += ", calling " + (", ".join(called) or "no other operator")
        items.append(Surprise(kind, op, detail, count))
    items.sort(key=lambda item: SURPRISE_ORDER.index(item.kind))
    return Surprises(tuple(items))


def _call_surprises(call: TracedCall) -> Iterator[tuple[str, str]]:
    """The surprises one call shows on its own path. Decompositions are reported for the
    calls the traced code made itself and for custom operators; torch's own kernels call
    composite operators all the time."""
    devices = {a.device for a in _tensor_infos(call.arguments)}
    custom = _is_custom(call.op)
    for step in call.steps:
        entry = step.entry
        custom_gap = custom and step.key.startswith("Autograd")  # the custom-op gap says it
        if entry.kind == "fallback" and step.key not in ROUTINE_FALLBACKS and not custom_gap:
            yield _fallback_surprise(call, step.key, devices)
        if entry.kind == "alias" and (call.depth == 0 or custom):
            if entry.alias == "CompositeImplicitAutograd":
                yield (
                    "decomposed",
                    f"no {_backend(step.key, devices)} kernel of its own: its "
                    f"CompositeImplicitAutograd kernel ran (at {step.key})",
                )
            elif entry.category == "backend" and custom:
                yield (
                    "generic kernel",
                    f"no {step.key} kernel of its own: its {entry.alias} kernel ran",
                )
        if entry.category == "autocast" and step.action == "call":
            casts = [c for c in call.children if c.op in CAST_OPS]
            if casts:
                dtypes = sorted(
                    {
                        _short_value(value)
                        for cast in casts
                        for value in cast.arguments
                        if isinstance(value, torch.dtype)
                    }
                )
                yield (
                    "autocast cast",
                    f"{step.key} cast {len(casts)} input(s)"
                    + (f" to {', '.join(dtypes)}" if dtypes else "")
                    + " before running it",
                )


def _decomposition(call: TracedCall) -> list[TracedCall]:
    """The calls a composite kernel made: the children, less an autocast wrapper's casts."""
    autocast = any(s.entry.category == "autocast" and s.action == "call" for s in call.steps)
    return [c for c in call.children if not (autocast and c.op in CAST_OPS)]


def _backend(key: str, devices: set[str]) -> str:
    """The backend a call ran for: its key when that is one, else its tensors' device."""
    if not key.startswith("Autograd") and key not in ("Undefined",):
        return key
    if len(devices) == 1:
        return dispatcher.dispatch_key_for_device(next(iter(devices)))
    return key.removeprefix("Autograd") or key


def _fallback_surprise(call: TracedCall, key: str, devices: set[str]) -> tuple[str, str]:
    if key in BATCHING_FALLBACKS:
        return (
            "no batching rule",
            f"vmap's {key} fallback ran the op once per batch element (a slow loop)",
        )
    if key.startswith("Autograd"):
        return (
            "no autograd kernel",
            f"the {key} fallback ran it below autograd: backward through its outputs warns or "
            "fails",
        )
    if key in ("Conjugate", "Negative", "ZeroTensor"):
        return "fallback", f"the {key} fallback materialised flagged inputs (a copy)"
    if key == "Meta":
        return "fallback", "no Meta kernel: the Meta fallback ran and raised"
    foreign = sorted(devices - {"cpu", "meta"})
    if foreign and any(
        c.path and c.path[-1] == "CPU" for child in call.children for c in child.walk()
    ):
        return (
            "CPU fallback",
            f"the {key} backend fallback ran it on CPU for {', '.join(foreign)} inputs",
        )
    return "fallback", f"the {key} backend fallback ran (no {key} kernel of its own)"


def _tensor_infos(values: tuple[Any, ...]) -> Iterator[TensorInfo]:
    for value in values:
        if isinstance(value, TensorInfo):
            yield value
        elif isinstance(value, tuple):
            yield from _tensor_infos(value)


def _custom_op_gaps(ops: set[str]) -> Iterator[tuple[str, str, str]]:
    """Operators defined outside torch that have no fake impl or no autograd support."""
    for op in sorted(ops):
        if not _is_custom(op):
            continue
        qualname = op.partition(".")[0]
        opdef = custom_op_state.custom_op_def(qualname)
        table = dispatch_table(op)
        if opdef is not None:
            parts = custom_op_state.custom_op_parts(opdef)
            fake = parts["fake"] is not None or custom_op_state.custom_op_can_fake_trivially(
                op_ref(op).op_overload()
            )
            autograd = parts["backward"] is not None
        else:
            meta = table["Meta"]
            fake = (
                meta.kind in ("kernel", "alias") and not meta.is_fallback
            ) or custom_op_state.registered_fake_impl(qualname) is not None
            autograd = table["AutogradCPU"].kind not in ("fallback", "missing")
        if not fake:
            yield (
                op,
                "no fake impl",
                "custom op without a fake impl or Meta kernel: FakeTensorMode and "
                "torch.compile cannot run it (add one with register_fake)",
            )
        if not autograd:
            yield (
                op,
                "no autograd",
                "custom op without autograd support: backward through it fails or warns "
                "(add a formula with register_autograd)",
            )


@functools.lru_cache(maxsize=4096)
def _is_custom(op: str) -> bool:
    """Whether an operator was defined outside torch (custom_op, torch.library, C++)."""
    if custom_op_state.custom_op_def(op.partition(".")[0]) is not None:
        return True
    for line in dispatcher.dump_registrations(op).splitlines():
        if line.startswith("debug: "):
            located = parse_site(line.removeprefix("debug: "))
            where = located[0] if located else line
            return not any(root in where for root in _TORCH_SITES)
    return False
