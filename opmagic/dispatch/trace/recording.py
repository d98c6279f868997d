"""Recording a trace: the operator observer logs each call of the traced code (and of the
threads torch hands its work to), each call's path is worked out with ``resolve`` under that
call's own thread-local state (cached per operator and dispatch state while the operator's
registrations stay the same), and the logs are built into a tree when the code returns
(:mod:`.tree`).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..._torch import custom_op_state, dispatcher, dynamo, modules, op_observer
from ...errors import ArgumentTypeError, OpmagicError
from .. import notes
from ..resolve import Step, resolve
from ..sites import parse_site
from .arguments import OpInfo, Summarised, call_arguments, op_info, summaries
from .origins import Origins, is_user_code
from .result import NO_RESULT, Trace, TracedItem
from .surprises import find_surprises
from .tree import RANGES, Segment, ThreadTree, graft, link, mark_failures


def trace(
    fn: Callable[..., Any] | None = None,
    /,
    *args: Any,
    values: bool = False,
    warmup: bool = False,
    **kwargs: Any,
) -> Any:
    """Run ``fn(*args, **kwargs)`` once and return its :class:`Trace`.

    Every operator call it makes is recorded with the dispatch keys whose kernels ran, the
    calls those kernels made, where in the user's code it was made and in which
    ``nn.Module``; a backward it runs shows each autograd node with its calls, tied to the
    forward call that made the node; a function ``torch.compile`` compiled shows each compiled
    graph that ran with the operators it called. ``Trace.result`` is what ``fn`` returned; if
    ``fn`` raises, the trace keeps the exception and ``Trace.result`` raises it.

    ``values=True`` also keeps min/max/mean of the values the code computed (for
    :func:`compare_traces`): the outputs of the calls the traced code, an autograd node or a
    compiled region made, and of those a decomposition or a Python kernel made (not a C++
    kernel's helper calls, nor views of inputs);
    ``warmup=True`` runs ``fn`` once untraced first, so that one-time costs (imports, a
    custom op's first call, torch.compile compiling) stay out of the trace; ``fn`` then runs
    twice. These two are the trace's own keywords: pass a ``values`` or ``warmup`` argument
    of ``fn`` through ``functools.partial``. Without ``fn``, a context manager: ``with
    opmagic.trace() as t: ...`` fills ``t`` when the block ends (the block's exceptions
    propagate).
    """
    for name, option in (("values", values), ("warmup", warmup)):
        if not isinstance(option, bool):
            raise ArgumentTypeError(
                f"trace()'s {name} must be True or False, got {type(option).__name__}. To pass "
                f"a {name} argument to the traced function, use functools.partial."
            )
    if fn is None:
        if args or kwargs:
            raise ArgumentTypeError("trace() takes arguments only after the function to trace")
        if warmup:
            raise ArgumentTypeError(
                "trace(warmup=True) runs the code once before tracing it, which a with-block "
                "cannot do: pass a function, trace(step, warmup=True)."
            )
        return _TraceBlock(values)
    if not callable(fn):
        raise ArgumentTypeError(
            f"trace() needs a function to run, got {type(fn).__name__}. Pass the function and "
            "its arguments, trace(model, x), or use the block form: with opmagic.trace() as t:"
        )
    if warmup:
        with contextlib.suppress(Exception):  # the traced run shows what fails
            fn(*args, **kwargs)
    recording = _Recording(values, sys._getframe())
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

    def __init__(self, values: bool) -> None:
        self.trace = Trace()
        self.values = values
        self._recording: _Recording | None = None

    def __enter__(self) -> Trace:
        self._recording = _Recording(self.values, sys._getframe(1))
        self._recording.start()
        return self.trace

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        assert self._recording is not None
        done = self._recording.finish(exc)
        for name in ("calls", "time_ns", "overhead_ns", "exception", "notes", "values"):
            setattr(self.trace, name, getattr(done, name))
        self.trace._surprises = done._surprises


# ------------------------------------------------------------------ recording


@dataclass
class _PathCache:
    """Segments of one operator's calls whose path Python code decides, by dispatch state;
    valid while the fingerprint of its registrations stays the same."""

    fingerprint: tuple[str, str]
    segments: dict[tuple, Segment] = field(default_factory=dict)


_paths: dict[tuple[str, str], _PathCache] = {}
# Every segment handed to the observer, by the id it knows it by (it keeps them across traces)
_segments: list[Segment] = []
_segment_ids: dict[int, int] = {}  # id(segment) -> its index in _segments
_compiling: dict[str, Segment] = {}  # the segment of calls torch.compile makes, by compile id
_FRONT_BIT = dispatcher.single_key_raw("FuncTorchDynamicLayerFrontMode") or 0


class _Recording:
    """One trace: the observer's logs, described and then built into a tree."""

    def __init__(self, values: bool, stop_frame: Any) -> None:
        self.values = values
        self.stop_frame = stop_frame  # module paths are read inside this frame
        self.checked: set[tuple[str, str]] = set()  # operators checked during this trace
        self.registrations: dict[str, str] = {}  # their registrations, by label, as checked
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
        op_observer.start(
            self.describe,
            self.check,
            __name__,
            user_code=is_user_code,
            module_calls=modules.module_call_codes(),
            stop_frame=self.stop_frame,
            ranges=RANGES,
            values=self.values,
            set_eval_frame=dynamo.eval_frame_setter(),
        )
        self.stop_frame = None  # the observer holds it while it runs
        self.shortcuts_back_on = custom_op_state.dispatch_shortcuts_off()
        self.noted = self._noting.enter_context(notes.collecting(op_observer.position))
        self.started_ns = time.perf_counter_ns()

    def finish(self, exception: BaseException | None, value: Any = NO_RESULT) -> Trace:
        """Stop the observer and build the :class:`Trace`: the call tree, the failures named,
        backward tied to forward, the surprises worked out."""
        ended = time.perf_counter_ns()
        ops, threads, failure = op_observer.stop()
        self.shortcuts_back_on()
        self._noting.close()
        if failure is not None:
            raise OpmagicError(
                f"opmagic's tracer failed while recording ({type(failure).__name__}: "
                f"{failure}); the traced code ran to the end untraced from there. Please "
                "report this with the code you traced."
            ) from failure
        with dispatcher.torch_function_disabled():
            calls, unowned = self._tree(ops, threads, exception)
            # now: a trace reads nothing live when shown
            surprises = find_surprises(calls, self._registrations)
        # the observer's own time on the tracing thread, and on the threads torch used
        observed = [events[-1][3] if events else 0 for _, _, _, events in threads]
        main = observed[0] if observed else 0
        return Trace(
            calls=calls,
            time_ns=max(0, ended - self.started_ns - main),
            overhead_ns=sum(observed) + time.perf_counter_ns() - ended,
            exception=exception,
            notes=unowned,
            values=self.values,
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
    ) -> tuple[int, Any, int]:
        """The observer's question about a call: its segment id, argument summaries when
        Python code decides its path, and flags (its kernels run Python code; hide it: a call
        torch.compile makes while it compiles), worked out under the call's own thread-local
        state."""
        compiling = dynamo.compiling()
        if compiling is not None:
            segment = _compiling.get(compiling)
            if segment is None:
                segment = _compiling[compiling] = Segment(name, (), None, False, (), compiling)
            return _segment_id(segment), None, op_observer.HIDE
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
            summarised = Summarised(summaries(inputs)) if python_decides else None
            return _segment_id(segment), summarised, _flags(info, segment, python_decides)

    def _checked(self, info: OpInfo, op_key: tuple[str, str]) -> bool:
        """Check the operator's fingerprint once per trace; on a change, forget its paths."""
        if op_key in self.checked:
            return True
        self.checked.add(op_key)
        fingerprint = _fingerprint(info.label)
        self.registrations[info.label] = fingerprint[0]
        cache = _paths.get(op_key)
        if cache is not None and cache.fingerprint == fingerprint:
            return True
        _paths[op_key] = _PathCache(fingerprint)
        return False

    def _registrations(self, label: str) -> str:
        """An operator's registrations as read when this trace checked it (else now)."""
        found = self.registrations.get(label)
        return found if found is not None else dispatcher.dump_registrations(label)

    def _tree(
        self,
        ops: list[tuple[str, str]],
        threads: list[op_observer.ThreadLog],
        exception: BaseException | None,
    ) -> tuple[tuple[TracedItem, ...], tuple[Any, ...]]:
        """The logs as one tree: the tracing thread's calls, with the other threads' grafted
        where they ran; failures named; backward tied to forward. Also the notes made while
        no call ran."""
        infos = [op_info(name, overload) for name, overload in ops]
        origins = Origins()
        trees = []
        for index, (native_id, name, record_function_id, events) in enumerate(threads):
            tree = ThreadTree(
                infos,
                _segments,
                origins,
                None if index == 0 else _thread_label(native_id, name, threads[0][1]),
                record_function_id,
                iter(self.noted) if index == 0 else iter(()),
            )
            tree.build(events)
            trees.append(tree)
        if not trees:
            return (), ()
        replaced: dict[int, tuple[Any, Any]] = {}
        spans = {key: span for tree in trees for key, span in tree.spans.items()}
        foreign = [(spans[id(item)][0], item) for tree in trees[1:] for item in tree.items]
        calls = graft(tuple(trees[0].items), foreign, spans, replaced)
        calls = mark_failures(calls, exception, replaced)

        def final(item: Any) -> Any:
            while id(item) in replaced and replaced[id(item)][0] is item:
                item = replaced[id(item)][1]
            return item

        link(calls, trees, final)
        return calls, tuple(trees[0].unowned)


def _thread_label(native_id: int, name: str, main_name: str) -> str:
    """``thread 1234``, or ``pt_autograd_0 (thread 1234)`` for a thread torch named."""
    if not name or name == main_name:
        return f"thread {native_id}"
    return f"{name} (thread {native_id})"


def _segment_id(segment: Segment) -> int:
    """The id the observer knows ``segment`` by (given on first use)."""
    index = _segment_ids.get(id(segment))
    if index is None:
        index = _segment_ids[id(segment)] = len(_segments)
        _segments.append(segment)
    return index


def _flags(info: OpInfo, segment: Segment, python_decides: bool) -> int:
    """What the observer needs to know of a call's kernels: whether they run Python code
    (the calls they make come from other frames) or decompose the op (the calls they make
    compute values), and whether its outputs are only views of its inputs."""
    flags = op_observer.NO_VALUES if info.views else 0
    if python_decides or _runs_python(segment):
        flags |= op_observer.RUNS_PYTHON
    last = segment.steps[-1].entry if segment.steps else None
    if last is not None and last.alias == "CompositeImplicitAutograd":
        flags |= op_observer.MAKES_VALUES
    return flags


def _runs_python(segment: Segment) -> bool:
    """Whether a kernel of the segment is Python code (its calls come from other frames)."""
    for step in segment.steps:
        if step.action == "python":
            return True
        located = parse_site(step.entry.site) if step.entry.site else None
        if located is not None and located[0].endswith(".py"):
            return True
    return False


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


def _resolve_segment(info: OpInfo, inputs: tuple[Any, ...]) -> Segment:
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
        return Segment(
            info.label, (), f"opmagic could not work out this call's path: {exc}", False, ()
        )
    steps: list[Step] = []
    for step in resolution.steps:
        steps.append(step)
        if step.action == "call":  # the re-call is reported itself and continues the path
            return Segment(resolution.op, tuple(steps), None, True, resolution.context)
    return Segment(resolution.op, tuple(steps), resolution.error, False, resolution.context)
