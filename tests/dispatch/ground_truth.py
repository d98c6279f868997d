"""The ground-truth harness of ``resolve``: contexts a call runs in, and the check.

A case defines an operator with probe kernels (probes.py), predicts the call with
``resolve`` inside a context, runs the real call in the same context, and requires the
probes' log to equal ``resolve(...).path`` restricted to probe keys, an error to be
predicted exactly when the call fails, and an argument ``resolve`` refuses
(``ArgumentsMismatchError``) to be one the real call refuses before any kernel runs.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.testing._internal.two_tensor import TwoTensor
from torch.utils._python_dispatch import TorchDispatchMode

from opmagic import ArgumentsMismatchError, dispatch_table, resolve

from .probes import ProbeOp, make_probe_op, served_by_probe


class PassThroughMode(TorchDispatchMode):
    """A TorchDispatchMode that calls the op again, as logging/profiling modes do."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


PAIR_KERNEL_SETS = [
    ["CPU"],
    ["CPU", "AutogradCPU"],
    ["CPU", "Autograd"],
    ["CompositeExplicitAutograd"],
    ["CompositeExplicitAutograd", "Autograd"],
    ["CompositeImplicitAutograd"],
    ["CPU", "CompositeImplicitAutograd"],
    ["CPU", "ADInplaceOrView", "Autograd"],
    ["CPU", "Meta", "Autograd"],
    ["CPU", "AutocastCPU", "Autograd"],
    ["CPU", "Conjugate", "Autograd"],
    ["CPU", "Python", "Autograd"],
    ["CPU", "SparseCPU", "Autograd"],
    ["CPU", "Meta", "Functionalize", "Autograd"],
    ["CPU", "Meta"],
    ["CPU", "ZeroTensor", "Negative", "Autograd"],
    ["CPU", "FuncTorchBatched", "Autograd"],
    ["CPU", "Meta", "ADInplaceOrView"],
    ["Meta", "CompositeExplicitAutograd", "Autograd", "AutocastCPU"],
    ["NestedTensorCPU", "AutogradNestedTensor"],
    ["CompositeImplicitAutogradNestedTensor", "CPU"],
]
"""Kernel sets for two-tensor probe operators: the keys that get a probe."""


# ---------------------------------------------------------------- contexts
# A context runs ``body(*inputs)`` under some thread-local state; body calls resolve and the op.

Context = Callable[[Callable, tuple], Any]


def _under(manager_factory: Callable[[], Any]) -> Context:
    def run(body, inputs):
        with manager_factory():
            return body(*inputs)

    return run


def _fake(body, inputs):
    with FakeTensorMode() as mode:
        return body(*[mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in inputs])


def _vmap(body, inputs):
    return torch.vmap(body)(*[t.unsqueeze(0) for t in inputs])


def _vmap_nested(body, inputs):
    return torch.vmap(torch.vmap(body))(*[t.unsqueeze(0).unsqueeze(0) for t in inputs])


def _grad(body, inputs):
    first, *rest = inputs
    return torch.func.grad(lambda x: body(x, *rest).sum())(first)


def _functionalize(body, inputs):
    return torch.func.functionalize(body)(*inputs)


def _two_modes(body, inputs):
    with PassThroughMode(), PassThroughMode():
        return body(*inputs)


def _mode_and_autocast(body, inputs):
    with PassThroughMode(), torch.autocast("cpu"):
        return body(*inputs)


def _subclass(body, inputs):
    return body(*[TwoTensor(t, t.clone()) for t in inputs])


def _cpp_functionalization(body, inputs):
    wrapped = [torch._to_functional_tensor(t) for t in inputs]
    torch._enable_functionalization(reapply_views=False)
    try:
        return body(*wrapped)
    finally:
        torch._disable_functionalization()


CONTEXTS: dict[str, Context] = {
    "plain": lambda body, inputs: body(*inputs),
    "no_grad": _under(torch.no_grad),
    "inference_mode": _under(torch.inference_mode),
    "autocast": _under(lambda: torch.autocast("cpu")),
    "below_autograd": _under(torch._C._AutoDispatchBelowAutograd),
    "below_ADInplaceOrView": _under(torch._C._AutoDispatchBelowADInplaceOrView),
    "dispatch_mode": _under(PassThroughMode),
    "two_dispatch_modes": _two_modes,
    "mode_and_autocast": _mode_and_autocast,
    "FakeTensorMode": _fake,
    "vmap": _vmap,
    "vmap_nested": _vmap_nested,
    "grad": _grad,
    "functionalize": _functionalize,
    "cpp_functionalization": _cpp_functionalization,
    "subclass": _subclass,
}


ASSUMED_REPEATS = {"subclass": 2}
"""How often a context's Python handler calls the op again: TwoTensor once per inner tensor."""


# ---------------------------------------------------------------- the check


def check_against_dispatcher(
    keys: list[str],
    inputs: tuple,
    context: Context,
    schema: str = "(Tensor x, Tensor y) -> Tensor",
    call: Callable[..., Any] | None = None,
    repeats: int = 1,
    probe: ProbeOp | None = None,
) -> None:
    """Predict with resolve, run for real, and compare the probes' log with the path.

    ``repeats``: how often the Python code the path assumes (a subclass handler) calls the
    op again; TwoTensor calls it once per inner tensor. ``probe``: an operator probed
    already (a custom op with probes added); else one is made from ``keys`` and ``schema``.
    """
    probe = probe or make_probe_op(keys, schema)
    invoke = call or (lambda op, *args: op(*args))
    seen: dict[str, Any] = {}

    def body(*args):
        try:
            seen["resolution"] = invoke(lambda *a, **k: resolve(probe.op, *a, **k), *args)
        except ArgumentsMismatchError as exc:  # resolve refused an argument
            seen["resolution"] = exc
        probe.log.clear()
        try:
            invoke(probe.op, *args)
            seen["raised"] = None
        except Exception as exc:  # the dispatcher's own failure is part of the ground truth
            seen["raised"] = exc
        seen["log"] = list(probe.log)
        first = next((a for a in args if isinstance(a, torch.Tensor)), None)
        return first if first is not None else torch.zeros(())

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                context(body, inputs)
            except Exception as exc:  # raised after the body (e.g. vmap wrapping the output)
                seen["after"] = exc
        assert "resolution" in seen, f"the context failed before the call: {seen.get('after')!r}"
        resolution = seen["resolution"]
        if isinstance(resolution, ArgumentsMismatchError):
            assert seen["raised"] is not None and seen["log"] == [], (
                f"resolve refused the arguments ({resolution}), but the real call ran "
                f"{seen['log']} and raised {seen['raised']!r}"
            )
            return
        table = dispatch_table(probe.op)
        steps = [s for s in resolution.path_steps if served_by_probe(table, s.key)]
        predicted = [s.key for s in steps if not s.assumed]
        assumed = [s.key for s in steps if s.assumed]
        predicted += assumed * (repeats if resolution.error is None else 1)
        log = seen["log"]
        if resolution.python is not None:  # the rest is up to Python code: compare the prefix
            log = log[: len(predicted)]
        assert predicted == log, (
            f"kernels {keys}: resolve predicted {predicted} (path {resolution.path}), "
            f"the dispatcher ran {seen['log']}\n{resolution}"
        )
        if resolution.python is not None and resolution.error is None:
            return  # what the Python handler then runs (and whether it fails) is its own affair
        assert (resolution.error is not None) == (seen["raised"] is not None), (
            f"kernels {keys}: predicted error {resolution.error!r}, real call raised "
            f"{seen['raised']!r}\n{resolution}"
        )
    finally:
        probe.close()
