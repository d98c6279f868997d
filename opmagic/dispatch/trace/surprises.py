"""What in a trace deserves a second look: fallbacks that ran, decompositions, autocast casts,
ops without a kernel of their own, custom operators without a fake impl or autograd.

A decomposition is a surprise only where the op could have had a kernel of its own: an op with
no kernel for any backend (``linear``, ``reshape``, ``layer_norm``: CompositeImplicitAutograd
by design) always decomposes, and its calls stay in the tree without a line in the summary.

Worked out once, when the trace finishes (the custom-op facts read the operators' registrations
then), and kept in the :class:`~.result.Trace`: displaying a trace reads nothing live.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..._torch import custom_op_state, dispatcher
from ...errors import OpmagicError
from ..keys import key_info
from ..ops import op_ref
from ..sites import parse_site
from ..table import classify, parse_computed_table, parse_registrations
from .arguments import TensorInfo, short_value
from .result import Surprise, Surprises, TracedCall, TracedItem, walk_calls

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


def find_surprises(
    calls: tuple[TracedItem, ...],
    registrations: Callable[[str], str] = dispatcher.dump_registrations,
) -> Surprises:
    """What in the call trees ``calls`` deserves a second look, one entry per (kind, op) with
    how many calls showed it, most consequential kinds first. ``registrations(op)``: the
    operator's registrations as the dispatcher prints them (a recording has them at hand)."""
    found: dict[tuple[str, str], list] = {}  # (kind, op) -> [count, detail, called ops]
    ops: dict[str, None] = {}
    for call in walk_calls(calls):
        ops[call.op] = None
        for kind, detail in _call_surprises(call, registrations):
            entry = found.setdefault((kind, call.op), [0, detail, {}])
            entry[0] += 1
            if kind == "decomposed":
                entry[2].update(dict.fromkeys(c.op for c in _decomposition(call)))
    for op, kind, detail in _custom_op_gaps(set(ops)):
        found[(kind, op)] = [1, detail, {}]
    items = []
    for (kind, op), (count, detail, called) in found.items():
        if kind == "decomposed":
            detail += ", calling " + (", ".join(called) or "no other operator")
        items.append(Surprise(kind, op, detail, count))
    items.sort(key=lambda item: SURPRISE_ORDER.index(item.kind))
    return Surprises(tuple(items))


def _call_surprises(
    call: TracedCall, registrations: Callable[[str], str]
) -> Iterator[tuple[str, str]]:
    """The surprises one call shows on its own path. Decompositions are reported for the
    calls the traced code made itself and for custom operators (torch's own kernels call
    composite operators all the time), unless the op has no backend kernel by design.
    Arguments are read only where a surprise needs them (every trace pays for this when it
    finishes)."""
    custom = _is_custom(call.op)
    for step in call.steps:
        entry = step.entry
        custom_gap = custom and step.key.startswith("Autograd")  # the custom-op gap says it
        if entry.kind == "fallback" and step.key not in ROUTINE_FALLBACKS and not custom_gap:
            yield _fallback_surprise(call, step.key)
        if entry.kind == "alias" and (call.depth == 0 or custom):
            if entry.alias == "CompositeImplicitAutograd" and not _decomposes_by_design(
                registrations(call.op)
            ):
                yield (
                    "decomposed",
                    f"no {_backend(step.key, call)} kernel of its own: its "
                    f"CompositeImplicitAutograd kernel ran (at {step.key})",
                )
            elif entry.category == "backend" and custom:
                yield (
                    "generic kernel",
                    f"no {step.key} kernel of its own: its {entry.alias} kernel ran",
                )
        if entry.category == "autocast" and step.action == "call":
            casts = [c for c in call.children if isinstance(c, TracedCall) and c.op in CAST_OPS]
            if casts:
                yield "autocast cast", _casts_detail(step.key, casts)


@functools.lru_cache(maxsize=512)
def _decomposes_by_design(registrations: str) -> bool:
    """Whether an op with these registrations has no kernel for any dense backend (Meta
    aside) and no CompositeExplicitAutograd kernel: it always decomposes (read once per
    state of its registrations)."""
    return not any(
        not registration.fallthrough
        and (
            registration.key.startswith("CompositeExplicitAutograd")
            or _is_dense_backend(registration.key)
        )
        for registration in parse_registrations(registrations)
    )


@functools.lru_cache(maxsize=256)
def _is_dense_backend(key: str) -> bool:
    """Whether ``key`` is a dense backend's (CPU, CUDA, ...; not Meta's, which computes
    shapes only)."""
    try:
        info = key_info(key)
    except OpmagicError:  # a key this torch does not know
        return False
    return info.functionality == "Dense" and info.backend not in (None, "Meta")


def _casts_detail(key: str, casts: list[TracedCall]) -> str:
    """``AutocastCPU cast 2 input(s) to bfloat16 before running it``."""
    dtypes = sorted(
        {
            short_value(value)
            for cast in casts
            for value in cast.arguments
            if isinstance(value, torch.dtype)
        }
    )
    into = f" to {', '.join(dtypes)}" if dtypes else ""
    return f"{key} cast {len(casts)} input(s){into} before running it"


def _decomposition(call: TracedCall) -> list[TracedCall]:
    """The calls a composite kernel made: the children, less an autocast wrapper's casts."""
    autocast = any(s.entry.category == "autocast" and s.action == "call" for s in call.steps)
    return [
        c
        for c in call.children
        if isinstance(c, TracedCall) and not (autocast and c.op in CAST_OPS)
    ]


def _devices(call: TracedCall) -> set[str]:
    """The device types of the call's tensor arguments."""
    return {a.device for a in _tensor_infos(call.arguments)}


def _backend(key: str, call: TracedCall) -> str:
    """The backend a call ran for: its key when that is one, else its tensors' device."""
    if not key.startswith("Autograd") and key not in ("Undefined",):
        return key
    devices = _devices(call)
    if len(devices) == 1:
        return dispatcher.dispatch_key_for_device(next(iter(devices)))
    return key.removeprefix("Autograd") or key


def _fallback_surprise(call: TracedCall, key: str) -> tuple[str, str]:
    """What a backend fallback that ran at ``key`` means for the call."""
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
    foreign = sorted(_devices(call) - {"cpu", "meta"})
    if foreign and any(c.path and c.path[-1] == "CPU" for c in walk_calls(call.children)):
        return (
            "CPU fallback",
            f"the {key} backend fallback ran it on CPU for {', '.join(foreign)} inputs",
        )
    return "fallback", f"the {key} backend fallback ran (no {key} kernel of its own)"


def _tensor_infos(values: tuple[Any, ...]) -> Iterator[TensorInfo]:
    """The TensorInfos among kept arguments, tensor lists included."""
    for value in values:
        if isinstance(value, TensorInfo):
            yield value
        elif isinstance(value, tuple):
            yield from _tensor_infos(value)


def _custom_op_gaps(ops: set[str]) -> Iterator[tuple[str, str, str]]:
    """Operators defined outside torch that have no fake impl or no autograd support."""
    for op in sorted(ops):
        support = _support(op) if _is_custom(op) else None
        if support is None:
            continue
        fake, autograd = support
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


def _support(op: str) -> tuple[bool, bool] | None:
    """``(has a fake impl, has autograd)`` of a custom operator, from its custom-op parts or
    its Meta and AutogradCPU kernels; ``None`` when the traced code unregistered it."""
    qualname = op.partition(".")[0]
    opdef = custom_op_state.custom_op_def(qualname)
    try:
        ref = op_ref(op)
    except OpmagicError:
        return None
    if opdef is not None:
        parts = custom_op_state.custom_op_parts(opdef)
        fake = parts["fake"] is not None or custom_op_state.custom_op_can_fake_trivially(
            ref.op_overload()
        )
        return fake, parts["backward"] is not None
    kinds = _kinds(ref.dispatcher_name, ("Meta", "AutogradCPU"))
    fake = kinds["Meta"] in ("kernel", "alias") or (
        custom_op_state.registered_fake_impl(qualname) is not None
    )
    return fake, kinds["AutogradCPU"] not in ("fallback", "missing")


def _kinds(name: str, keys: tuple[str, ...]) -> dict[str, str]:
    """The ``TableEntry.kind`` of a few keys of an operator's table, parsing only those (a
    trace's surprises are worked out as it finishes: the whole table would cost more)."""
    computed = parse_computed_table(dispatcher.dump_table(name), only=frozenset(keys))
    return {
        key: classify(*computed[key][1:], computed[key][0], lambda: None)[0]
        if key in computed
        else "missing"
        for key in keys
    }


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
