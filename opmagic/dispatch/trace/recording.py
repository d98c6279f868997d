"""Recording a trace: the operator observer logs each call of the traced code, each call's
path is worked out with ``resolve`` under that call's own thread-local state (cached per
operator and dispatch state while the operator's registrations stay the same), and the log is
built into a tree when the code returns.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from ..._torch import custom_op_state, dispatcher, op_observer
from ...errors import ArgumentTypeError, OpmagicError
from .. import notes
from ..resolve import Step, resolve
from .arguments import OpInfo, Summarised, call_arguments, op_info, summaries
from .result import NO_RESULT, Trace, TracedCall, walk_all
from .surprises import find_surprises


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
        for name in ("calls", "time_ns", "overhead_ns", "exception", "notes", "_surprises"):
            setattr(self.trace, name, getattr(done, name))


# ------------------------------------------------------------------ recording


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


_paths: dict[tuple[str, str], _PathCache] = {}
# Every segment handed to the observer, by the id it knows it by (it keeps them across traces)
_segments: list[_Segment] = []
_segment_ids: dict[int, int] = {}  # id(segment) -> its index in _segments
_FRONT_BIT = dispatcher.single_key_raw("FuncTorchDynamicLayerFrontMode") or 0


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
    children: list[TracedCall] = field(default_factory=list)
    notes: list[Any] = field(default_factory=list)
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
            notes=tuple(self.notes),
            _log=(self.info, self.logged),
        )


@dataclass
class _Recall:
    """A kernel of ``target`` called its op again: this dispatch continues target's path."""

    target: _Open


class _Recording:
    """One trace on this thread: the observer's log, described and then built into a tree."""

    def __init__(self) -> None:
        self.checked: set[tuple[str, str]] = set()  # operators checked during this trace
        self.started_ns = 0
        # torch 2.14's custom_op calls skip the observer's hook: off while tracing
        self.shortcuts_back_on: Callable[[], None] = lambda: None
        self._noting = contextlib.ExitStack()
        self.noted: list[tuple[int, Any]] = []

    def start(self) -> None:
        """Start the observer on this thread (refused inside another trace)."""
        if op_observer.running():
            raise OpmagicError(
                "opmagic.trace is already tracing on this thread: a trace cannot run inside "
                "another. Trace the outer code once; its trace holds the inner calls too."
            )
        op_observer.start(self.describe, self.check, __name__)
        self.shortcuts_back_on = custom_op_state.dispatch_shortcuts_off()
        self.noted = self._noting.enter_context(notes.collecting(op_observer.position))
        self.started_ns = time.perf_counter_ns()

    def finish(self, exception: BaseException | None, value: Any = NO_RESULT) -> Trace:
        """Stop the observer and build the :class:`Trace`: the call tree, the failures named,
        the surprises worked out."""
        ended = time.perf_counter_ns()
        ops, events, failure = op_observer.stop()
        self.shortcuts_back_on()
        self._noting.close()
        if failure is not None:
            raise OpmagicError(
                f"opmagic's tracer failed while recording ({type(failure).__name__}: "
                f"{failure}); the traced code ran to the end untraced from there. Please "
                "report this with the code you traced."
            ) from failure
        with dispatcher.torch_function_disabled():
            calls, unowned = self._tree(ops, events)
            calls = _mark_failures(calls, exception)
            surprises = find_surprises(calls)  # now: a trace reads nothing live when shown
        observed = events[-1][3] if events else 0  # the observer's own time during the run
        return Trace(
            calls=calls,
            time_ns=max(0, ended - self.started_ns - observed),
            overhead_ns=observed + time.perf_counter_ns() - ended,
            exception=exception,
            notes=unowned,
            _value=value,
            _surprises=surprises,
        )

    def check(self, op: int, name: str, overload: str) -> bool:
        """Whether the paths worked out earlier for the operator still hold: its registrations
        (and custom-op parts) are as they were. Asked once per trace and operator."""
        with dispatcher.torch_function_disabled():
            return self._checked(op_info(name, overload), (name, overload))

    def describe(
        self, op: int, name: str, overload: str, inputs: tuple[Any, ...], python_decides: bool
    ) -> tuple[int, Any]:
        """The observer's question about a call: its segment id (and argument summaries when
        Python code decides its path), worked out under the call's own thread-local state."""
        with dispatcher.torch_function_disabled():
            info = op_info(name, overload)
            inputs = call_arguments(info, inputs)
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
            return index, Summarised(summaries(inputs)) if python_decides else None

    def _checked(self, info: OpInfo, op_key: tuple[str, str]) -> bool:
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

    def _tree(
        self, ops: list[tuple[str, str]], events: list[tuple[Any, ...]]
    ) -> tuple[tuple[TracedCall, ...], tuple[Any, ...]]:
        """The calls of the log as a tree; a kernel's call of its own op continues its path.
        Also the notes made while no call ran; the others go to the call that was running."""
        infos = [op_info(name, overload) for name, overload in ops]
        stack: list[_Open | _Recall] = []
        calls: list[TracedCall] = []
        unowned: list[Any] = []
        noted = iter(self.noted)
        pending = next(noted, None)

        def owner() -> _Open | None:
            top = stack[-1] if stack else None
            return top.target if isinstance(top, _Recall) else top

        def attach_notes(position: int | None) -> None:
            """Give the notes made before event ``position`` (all: None) to their call."""
            nonlocal pending
            while pending is not None and (position is None or pending[0] <= position):
                running = owner()
                (running.notes if running is not None else unowned).append(pending[1])
                pending = next(noted, None)

        for index, (op, detail, at_ns, overhead_ns, arguments) in enumerate(events):
            attach_notes(index)
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
        attach_notes(None)
        while stack:  # calls the code never returned from (it was interrupted inside them)
            frame = stack.pop()
            if isinstance(frame, _Open):
                frame.unwound = True
                parent = owner()
                (parent.children if parent is not None else calls).append(frame.close(0))
        return tuple(calls), tuple(unowned)


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


def _dispatch_state(info: OpInfo, inputs: tuple[Any, ...]) -> tuple:
    """Everything a call's path depends on besides the op: a cache key for its segment."""
    included = dispatcher.tls_included_raw()
    layers = tuple(dispatcher.functorch_layers()) if included & _FRONT_BIT else ()
    tensors: list[tuple | None] = []
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


def _resolve_segment(info: OpInfo, inputs: tuple[Any, ...]) -> _Segment:
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


def _mark_failures(calls: tuple[TracedCall, ...], exception: BaseException | None) -> tuple:
    """Say why calls raised: the exception the traced code raised, on the calls it came out
    of; raises that a caller caught, as such. A predicted dispatch failure is kept."""
    if exception is None and not any(call.raised for call in walk_all(calls)):
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


def _last_raised(calls: tuple[TracedCall, ...]) -> TracedCall | None:
    """The last of ``calls`` if it raised: the one an exception still propagating left."""
    return calls[-1] if calls and calls[-1].raised else None
