"""``trace`` against the real dispatcher: probe operators inside the traced code.

Each case defines a leaf probe operator and a composite one whose CompositeImplicitAutograd
kernel calls the leaf (tests/dispatch/probes.py: every probe kernel logs the runtime key it
ran for). The traced code calls both inside a context (grad, no_grad, inference_mode, meta
inputs, autocast, a user's TorchDispatchMode, a wrapper subclass, vmap, FakeTensorMode).

Two things must hold:

- invisible: the probes log the same keys, and the code returns the same kind of result or
  raises the same exception, traced and untraced;
- exact: walking the trace depth-first, each probe call's path (restricted to keys its probe
  kernels serve) then its children, gives exactly the probes' log.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

from opmagic import dispatch_table, trace
from opmagic.dispatch.ops import op_ref

from ..ground_truth import CONTEXTS as RESOLVE_CONTEXTS
from ..ground_truth import Context
from ..probes import ProbeOp, make_probe_op, served_by_probe

pytestmark = pytest.mark.matrix  # a stratified sample runs in the fast loop (tests/conftest.py)


class SharedLog:
    """One log for several probes, in the order their kernels ran: ``(op, key)`` entries."""

    def __init__(self) -> None:
        self.entries: list[tuple[str, str]] = []

    def attach(self, probe: ProbeOp) -> None:
        """Make ``probe``'s kernels log here."""
        log = self
        label = str(op_ref(probe.op))

        class Appender:
            def append(self, key: str) -> None:
                log.entries.append((label, key))

        probe.log = Appender()  # type: ignore[assignment]


# ---------------------------------------------------------------- what the traced code calls

LEAF_KERNEL_SETS = [
    ["CPU"],
    ["CPU", "AutogradCPU"],
    ["CPU", "Autograd"],
    ["CompositeExplicitAutograd", "Autograd"],
    ["CPU", "Meta", "Autograd"],
    ["CPU", "AutocastCPU", "Autograd"],
    ["CPU", "ADInplaceOrView", "Autograd"],
    ["CPU", "Meta", "Python", "Autograd"],
]
COMPOSITE_KERNEL_SETS = [
    ["CompositeImplicitAutograd"],
    ["CPU", "CompositeImplicitAutograd"],
]


def _pair() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(3), torch.randn(3)


def _inference_pair() -> tuple[torch.Tensor, torch.Tensor]:
    with torch.inference_mode():
        return torch.randn(3), torch.randn(3)


INPUTS: dict[str, Callable[[], tuple]] = {
    "cpu": _pair,
    "requires_grad": lambda: (torch.randn(3, requires_grad=True), torch.randn(3)),
    "meta": lambda: (torch.randn(3, device="meta"), torch.randn(3, device="meta")),
    "inference": _inference_pair,
}

# ---------------------------------------------------------------- contexts
# The resolve harness's contexts (ground_truth.py), "grad" being its plain call with grad
# mode on; vmap with a batch of two, so that a per-example fallback loop shows twice.


def _vmap(body, inputs):
    return torch.vmap(body)(*[torch.stack([t, t]) for t in inputs])


CONTEXTS: dict[str, Context] = {
    "grad": RESOLVE_CONTEXTS["plain"],
    **{
        name: RESOLVE_CONTEXTS[name]
        for name in (
            "no_grad",
            "inference_mode",
            "autocast",
            "dispatch_mode",
            "two_dispatch_modes",
            "subclass",
        )
    },
    "vmap": _vmap,
    "FakeTensorMode": RESOLVE_CONTEXTS["FakeTensorMode"],
}


def _incompatible(context: str, inputs: str, composite: list[str]) -> str | None:
    """Combinations where Python code, not the dispatcher, runs a probe kernel."""
    if context == "subclass" and inputs == "meta":
        return "TwoTensor wraps dense CPU tensors here"
    if context == "FakeTensorMode" and "CompositeImplicitAutograd" in composite:
        return "FakeTensorMode runs CIA kernels through OpOverload.decompose, outside dispatch"
    return None


# ---------------------------------------------------------------- the check


def _outcome(run: Callable[[], Any]) -> tuple[Any, BaseException | None]:
    try:
        return run(), None
    except Exception as exc:  # the dispatcher's own failure is part of the ground truth
        return None, exc


def _shape_of(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return type(value), tuple(value.shape)
    return type(value)


def check_trace(leaf_keys: list[str], composite_keys: list[str], inputs: str, context: str):
    leaf = make_probe_op(leaf_keys)
    composite = make_probe_op(composite_keys, result=lambda args: leaf.op(*args))
    log = SharedLog()
    log.attach(leaf)
    log.attach(composite)

    def body(x, y):
        first = leaf.op(x, y)
        composite.op(x, y)
        return first

    def run() -> Any:
        return CONTEXTS[context](body, INPUTS[inputs]())

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            untraced_value, untraced_error = _outcome(run)
            untraced_log = list(log.entries)
            log.entries.clear()
            traced = trace(run)
        traced_log = list(log.entries)

        # invisible: the dispatcher did the same thing, the code got the same outcome
        assert traced_log == untraced_log, (
            f"tracing changed what ran: untraced {untraced_log}, traced {traced_log}"
        )
        assert type(traced.exception) is type(untraced_error), (
            f"untraced raised {untraced_error!r}, traced {traced.exception!r}"
        )
        if untraced_error is None:
            assert _shape_of(traced.result) == _shape_of(untraced_value)

        # exact: depth-first, each probe call's path then its children, equals the log
        tables = {str(op_ref(p.op)): dispatch_table(p.op) for p in (leaf, composite)}
        walked: list[tuple[str, str]] = []
        for call in traced.walk():
            table = tables.get(call.op)
            if table is not None:
                walked += [(call.op, key) for key in call.path if served_by_probe(table, key)]
        assert walked == traced_log, (
            f"the trace says {walked}, the probes ran {traced_log}\n{traced}"
        )
    finally:
        composite.close()
        leaf.close()


def _cases():
    for context in CONTEXTS:
        for inputs in INPUTS:
            for leaf_keys in LEAF_KERNEL_SETS:
                for composite_keys in COMPOSITE_KERNEL_SETS:
                    if _incompatible(context, inputs, composite_keys) is None:
                        yield pytest.param(
                            leaf_keys,
                            composite_keys,
                            inputs,
                            context,
                            id=f"{context}-{inputs}-{'+'.join(leaf_keys)}"
                            f"-composite:{'+'.join(composite_keys)}",
                        )


@pytest.mark.parametrize(("leaf_keys", "composite_keys", "inputs", "context"), list(_cases()))
def test_trace_equals_probe_log(
    leaf_keys: list[str], composite_keys: list[str], inputs: str, context: str
) -> None:
    check_trace(leaf_keys, composite_keys, inputs, context)
