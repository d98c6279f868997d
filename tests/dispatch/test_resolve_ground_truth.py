"""``resolve`` against the real dispatcher.

Each case defines a fresh operator with probe kernels (tests/dispatch/probes.py), predicts
the call with ``resolve`` inside the context, runs the real call in the same context, and
requires the probes' log to equal ``resolve(...).path`` restricted to probe keys, and an
error to be predicted exactly when the call fails. Kernel sets x inputs x contexts give
a few thousand cases; they run in seconds.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.testing._internal.two_tensor import TwoTensor
from torch.utils._python_dispatch import TorchDispatchMode

from opmagic import dispatch_table, resolve

from .probes import make_probe_op, probe_keys_on


class PassThroughMode(TorchDispatchMode):
    """A TorchDispatchMode that calls the op again, as logging/profiling modes do."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _complex() -> torch.Tensor:
    return torch.randn(3, dtype=torch.cfloat)


def _nested() -> torch.Tensor:
    return torch.nested.nested_tensor([torch.randn(2), torch.randn(3)])


def _inference_pair() -> tuple[torch.Tensor, torch.Tensor]:
    with torch.inference_mode():
        return torch.randn(3), torch.randn(3)


PAIRS: dict[str, Callable[[], tuple]] = {
    "cpu": lambda: (torch.randn(3), torch.randn(3)),
    "requires_grad": lambda: (torch.randn(3, requires_grad=True), torch.randn(3)),
    "meta": lambda: (torch.randn(3, device="meta"), torch.randn(3, device="meta")),
    "cpu+meta": lambda: (torch.randn(3), torch.randn(3, device="meta")),
    "sparse": lambda: (torch.randn(3).to_sparse(), torch.randn(3).to_sparse()),
    "conj_view": lambda: (_complex().conj(), _complex()),
    "neg_view": lambda: (_complex().conj().imag, torch.randn(3)),
    "inference": _inference_pair,
    "zerotensor": lambda: (torch._efficientzerotensor(3), torch.randn(3)),
    "nested": lambda: (_nested(), _nested()),
}

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


_NESTED_CONTEXTS = (
    "plain",
    "no_grad",
    "inference_mode",
    "autocast",
    "below_autograd",
    "below_ADInplaceOrView",
    "dispatch_mode",
    "two_dispatch_modes",
    "mode_and_autocast",
)


def _incompatible(context: str, inputs: str, keys: list[str]) -> str | None:
    """Combinations whose outcome is decided by Python code, not by the dispatcher."""
    if context.startswith("vmap") and "FuncTorchBatched" in keys:
        return "a logging probe is no batching rule: it passes BatchedTensors on unchanged"
    if "functional" in context and "Functionalize" in keys:
        return "a logging probe at Functionalize passes FunctionalTensorWrappers on unchanged"
    if context == "FakeTensorMode" and "CompositeImplicitAutograd" in keys:
        return "FakeTensorMode runs CIA kernels through OpOverload.decompose, outside dispatch"
    if context == "FakeTensorMode" and inputs == "cpu+meta":
        return "FakeTensorMode's Python code rejects mixed devices before dispatching"
    if inputs == "nested" and context not in _NESTED_CONTEXTS:
        return "torch.func transforms, fake and functional tensors do not take nested tensors"
    if context.startswith("vmap") and inputs == "sparse":
        return "vmap cannot wrap sparse outputs (fails after the op ran)"
    if context == "subclass" and inputs not in ("cpu", "requires_grad", "inference"):
        return "TwoTensor only wraps plain dense tensors of one device"
    if context == "cpp_functionalization" and inputs in (
        "sparse",
        "zerotensor",
        "meta",
        "cpu+meta",
    ):
        return "functional tensors wrap dense tensors only"
    return None


# ---------------------------------------------------------------- the check


def check_against_dispatcher(
    keys: list[str],
    inputs: tuple,
    context: Context,
    schema: str = "(Tensor x, Tensor y) -> Tensor",
    call: Callable[..., Any] | None = None,
) -> None:
    """Predict with resolve, run for real, and compare the probes' log with the path."""
    probe = make_probe_op(keys, schema)
    invoke = call or (lambda op, *args: op(*args))
    seen: dict[str, Any] = {}

    def body(*args):
        seen["resolution"] = invoke(lambda *a, **k: resolve(probe.op, *a, **k), *args)
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
        predicted = probe_keys_on(resolution.path, probe, dispatch_table(probe.op))
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
            f"{seen['raised']!r}"
        )
    finally:
        probe.close()


def _pair_cases():
    for context in CONTEXTS:
        for inputs in PAIRS:
            for keys in PAIR_KERNEL_SETS:
                if _incompatible(context, inputs, keys) is None:
                    yield pytest.param(
                        context, inputs, keys, id=f"{context}-{inputs}-{'+'.join(keys)}"
                    )


@pytest.mark.parametrize(("context", "inputs", "keys"), list(_pair_cases()))
def test_two_tensor_calls(context: str, inputs: str, keys: list[str]) -> None:
    check_against_dispatcher(keys, PAIRS[inputs](), CONTEXTS[context])


LIST_KERNEL_SETS = [
    ["CPU"],
    ["CPU", "Autograd"],
    ["CompositeExplicitAutograd", "Meta"],
    ["Meta", "AutogradMeta"],
]
LIST_INPUTS = {
    "cpu": lambda: ([torch.randn(2), torch.randn(2)],),
    "cpu+meta": lambda: ([torch.randn(2), torch.randn(2, device="meta")],),
    "requires_grad": lambda: ([torch.randn(2, requires_grad=True)],),
    "empty": lambda: ([],),
}


@pytest.mark.parametrize("keys", LIST_KERNEL_SETS, ids="+".join)
@pytest.mark.parametrize("inputs", list(LIST_INPUTS))
@pytest.mark.parametrize("context", ["plain", "inference_mode", "dispatch_mode", "autocast"])
def test_tensor_list_argument(context: str, inputs: str, keys: list[str]) -> None:
    check_against_dispatcher(
        keys, LIST_INPUTS[inputs](), CONTEXTS[context], schema="(Tensor[] xs) -> Tensor"
    )


OPTIONAL_INPUTS = {
    "none": lambda: (torch.randn(2), None),
    "cpu": lambda: (torch.randn(2), torch.randn(2)),
    "meta": lambda: (torch.randn(2), torch.randn(2, device="meta")),
}


@pytest.mark.parametrize("keys", [["CPU"], ["CPU", "Autograd", "Meta"]], ids="+".join)
@pytest.mark.parametrize("inputs", list(OPTIONAL_INPUTS))
@pytest.mark.parametrize("context", ["plain", "no_grad", "inference_mode", "dispatch_mode"])
def test_optional_tensor_argument(context: str, inputs: str, keys: list[str]) -> None:
    check_against_dispatcher(
        keys, OPTIONAL_INPUTS[inputs](), CONTEXTS[context], schema="(Tensor x, Tensor? y) -> Tensor"
    )


@pytest.mark.parametrize("keys", [["CPU"], ["CPU", "Autograd", "Meta"]], ids="+".join)
@pytest.mark.parametrize("inputs", ["cpu", "meta", "cpu+meta"])
def test_keyword_only_tensor(inputs: str, keys: list[str]) -> None:
    check_against_dispatcher(
        keys,
        PAIRS[inputs](),
        CONTEXTS["plain"],
        schema="(Tensor x, *, Tensor other) -> Tensor",
        call=lambda op, x, y: op(x, other=y),
    )


@pytest.mark.parametrize(
    "keys",
    [["CPU"], ["CPU", "ADInplaceOrView"], ["CPU", "ADInplaceOrView", "Autograd"], ["CPU", "Meta"]],
    ids="+".join,
)
@pytest.mark.parametrize("inputs", ["cpu", "requires_grad", "inference", "meta"])
@pytest.mark.parametrize("context", ["plain", "no_grad", "inference_mode", "dispatch_mode"])
def test_in_place_schema(context: str, inputs: str, keys: list[str]) -> None:
    check_against_dispatcher(
        keys,
        PAIRS[inputs](),
        CONTEXTS[context],
        schema="(Tensor(a!) x, Tensor y) -> Tensor(a!)",
    )


@pytest.mark.parametrize(
    "keys",
    [["CPU"], ["CompositeExplicitAutograd"], ["BackendSelect", "CompositeExplicitAutograd"], []],
    ids=lambda keys: "+".join(keys) or "none",
)
@pytest.mark.parametrize("context", ["plain", "inference_mode", "dispatch_mode"])
def test_factory_without_tensor_inputs(context: str, keys: list[str]) -> None:
    check_against_dispatcher(
        keys, (3,), CONTEXTS[context], schema="(int n, *, Device? device=None) -> Tensor"
    )
