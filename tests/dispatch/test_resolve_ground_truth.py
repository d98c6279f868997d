"""``resolve`` against the real dispatcher.

Each case defines a fresh operator with probe kernels (tests/dispatch/probes.py), predicts
the call with ``resolve`` inside the context, runs the real call in the same context, and
requires the probes' log to equal ``resolve(...).path`` restricted to probe keys, and an
error to be predicted exactly when the call fails. Kernel sets x inputs x contexts give
a few thousand cases; they run in seconds.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from .ground_truth import ASSUMED_REPEATS, CONTEXTS, PAIR_KERNEL_SETS, check_against_dispatcher

pytestmark = pytest.mark.matrix  # a stratified sample runs in the fast loop (tests/conftest.py)


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
    check_against_dispatcher(
        keys, PAIRS[inputs](), CONTEXTS[context], repeats=ASSUMED_REPEATS.get(context, 1)
    )


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
