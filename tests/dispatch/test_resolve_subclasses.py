"""Tensor subclasses and Python functionalization past the Python key, against the real
dispatcher.

A traceable wrapper subclass (TwoTensor) calls the op on its inner tensors, once per inner
tensor; a ``_make_subclass`` subclass calls it again on the same tensors with Python
dispatch off; FunctionalTensorMode (``dispatch_functionalize``) runs C++ functionalization
on the wrappers its FunctionalTensors hold; the jagged NestedTensor raises for an op it has
no rule for. Kernel sets x inputs x contexts, as in test_resolve_ground_truth.py.
"""

from __future__ import annotations

import contextlib
import itertools

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch._subclasses.functional_tensor import dispatch_functionalize
from torch.testing._internal.two_tensor import TwoTensor
from torch.utils._mode_utils import no_dispatch

from opmagic import resolve

from .ground_truth import CONTEXTS, PAIR_KERNEL_SETS, check_against_dispatcher
from .probes import make_probe_op

pytestmark = pytest.mark.matrix  # a stratified sample runs in the fast loop (tests/conftest.py)


class PlainSubclass(torch.Tensor):
    """A ``_make_subclass`` subclass whose handler runs the op with Python dispatch off."""

    @staticmethod
    def __new__(cls, data: torch.Tensor):
        return torch.Tensor._make_subclass(cls, data, data.requires_grad)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        with no_dispatch():
            return func(*args, **(kwargs or {}))


def _inference_pair() -> tuple[torch.Tensor, torch.Tensor]:
    with torch.inference_mode():
        return torch.randn(3), torch.randn(3)


INPUTS = {
    "cpu": lambda: (torch.randn(3), torch.randn(3)),
    "requires_grad": lambda: (torch.randn(3, requires_grad=True), torch.randn(3)),
    "inference": _inference_pair,
}
SUBCLASSES = {
    "two_tensor": lambda t: TwoTensor(t, t.clone()),
    "two_tensor_x_only": None,  # only x is wrapped: y stays a plain tensor
    "plain_subclass": PlainSubclass,
}
REPEATS = {"two_tensor": 2, "two_tensor_x_only": 2, "plain_subclass": 1}
SUBCLASS_CONTEXTS = (
    "plain",
    "no_grad",
    "inference_mode",
    "autocast",
    "below_autograd",
    "below_ADInplaceOrView",
    "dispatch_mode",
)


def _wrap(subclass: str, inputs: tuple) -> tuple:
    x, y = inputs
    if subclass == "two_tensor_x_only":
        return TwoTensor(x, x.clone()), y
    return SUBCLASSES[subclass](x), SUBCLASSES[subclass](y)


@pytest.mark.parametrize(
    ("subclass", "context", "inputs", "keys"),
    [
        pytest.param(s, c, i, k, id=f"{s}-{c}-{i}-{'+'.join(k)}")
        for s, c, i, k in itertools.product(SUBCLASSES, SUBCLASS_CONTEXTS, INPUTS, PAIR_KERNEL_SETS)
    ],
)
def test_subclass_handlers_call_the_op_again(
    subclass: str, context: str, inputs: str, keys: list[str]
) -> None:
    base = CONTEXTS[context]
    check_against_dispatcher(
        keys,
        INPUTS[inputs](),
        lambda body, args: base(body, _wrap(subclass, args)),
        repeats=REPEATS[subclass],
    )


# ---------------------------------------------------------------- wrappers holding fake tensors
# FakeTensorMode and FakeTensor return NotImplemented for a subclass they do not know; its
# handler runs, calling the op on the fake tensors it holds, which the mode then fakes.

FAKE_WRAPPINGS = {
    "both": lambda x, y: (TwoTensor(x, x.clone()), TwoTensor(y, y.clone())),
    "x_only": lambda x, y: (TwoTensor(x, x.clone()), y),
    "y_only": lambda x, y: (x, TwoTensor(y, y.clone())),
}


def _fake_wrapped(wrapping: str, mode_active: bool):
    def run(body, inputs):
        mode = FakeTensorMode()
        fakes = [mode.from_tensor(t) for t in inputs]
        with mode if mode_active else contextlib.nullcontext():
            return body(*FAKE_WRAPPINGS[wrapping](*fakes))

    return run


@pytest.mark.parametrize(
    ("wrapping", "mode_active", "inputs", "keys"),
    [
        pytest.param(w, m, i, k, id=f"{w}-{'mode' if m else 'no_mode'}-{i}-{'+'.join(k)}")
        for w, m, i, k in itertools.product(FAKE_WRAPPINGS, (True, False), INPUTS, PAIR_KERNEL_SETS)
    ],
)
def test_wrapper_subclasses_holding_fake_tensors(
    wrapping: str, mode_active: bool, inputs: str, keys: list[str]
) -> None:
    check_against_dispatcher(
        keys, INPUTS[inputs](), _fake_wrapped(wrapping, mode_active), repeats=2
    )


# ---------------------------------------------------------------- Python functionalization

FUNCTIONAL_SCHEMAS = {
    "functional": "(Tensor x, Tensor y) -> Tensor",
    "in_place": "(Tensor(a!) x, Tensor y) -> Tensor(a!)",
    "writes_returns_nothing": "(Tensor(a!) x, Tensor y) -> ()",
    "view": "(Tensor(a) x, Tensor y) -> Tensor(a)",
}


def _dispatch_functionalize(body, inputs):
    return dispatch_functionalize(body)(*inputs)


def _dispatch_functionalize_inference(body, inputs):
    with torch.inference_mode():
        return dispatch_functionalize(body)(*inputs)


FUNCTIONAL_INPUTS = {
    "cpu": INPUTS["cpu"],
    "requires_grad": INPUTS["requires_grad"],
    # a FunctionalTensor carries its wrapper's Conjugate key: it runs above Python, and
    # again below, after FunctionalTensorMode runs the Functionalize kernel directly
    "conj_view": lambda: (
        torch.randn(3, dtype=torch.cfloat).conj(),
        torch.randn(3, dtype=torch.cfloat),
    ),
}
PYTHON_FUNCTIONALIZATION = {
    "dispatch_functionalize": _dispatch_functionalize,
    "dispatch_functionalize_inference": _dispatch_functionalize_inference,
}


@pytest.mark.parametrize(
    ("schema", "context", "inputs", "keys"),
    [
        pytest.param(s, c, i, k, id=f"{s}-{c}-{i}-{'+'.join(k)}")
        for s, c, i, k in itertools.product(
            FUNCTIONAL_SCHEMAS, PYTHON_FUNCTIONALIZATION, FUNCTIONAL_INPUTS, PAIR_KERNEL_SETS
        )
        if "Functionalize" not in k  # a logging probe there passes wrappers on unchanged
    ],
)
def test_python_functionalization(schema: str, context: str, inputs: str, keys: list[str]) -> None:
    check_against_dispatcher(
        keys,
        FUNCTIONAL_INPUTS[inputs](),
        PYTHON_FUNCTIONALIZATION[context],
        FUNCTIONAL_SCHEMAS[schema],
    )


# ---------------------------------------------------------------- jagged nested tensors


def _jagged() -> torch.Tensor:
    return torch.nested.nested_tensor([torch.randn(2), torch.randn(3)], layout=torch.jagged)


JAGGED_KERNEL_SETS = [
    ["CPU"],
    ["CPU", "Autograd"],
    ["CompositeExplicitAutograd"],
    ["CompositeExplicitAutograd", "Autograd"],
    ["CompositeImplicitAutograd"],
    ["CPU", "CompositeImplicitAutograd"],
    ["CompositeImplicitAutogradNestedTensor", "CPU"],
    ["CPU", "ADInplaceOrView", "Autograd"],
    ["NestedTensorCPU", "AutogradNestedTensor"],
    ["CPU", "Python", "Autograd"],
]
JAGGED_CONTEXTS = ("plain", "no_grad", "inference_mode", "below_autograd", "dispatch_mode")


@pytest.mark.parametrize(
    ("context", "keys"),
    [
        pytest.param(c, k, id=f"{c}-{'+'.join(k)}")
        for c, k in itertools.product(JAGGED_CONTEXTS, JAGGED_KERNEL_SETS)
    ],
)
def test_jagged_nested_tensors(context: str, keys: list[str]) -> None:
    check_against_dispatcher(keys, (_jagged(), _jagged()), CONTEXTS[context])


def test_jagged_without_a_rule_or_composite_kernel_raises_not_implemented() -> None:
    probe = make_probe_op(["CPU", "Autograd"])
    try:
        resolution = resolve(probe.op, _jagged(), _jagged())
        assert resolution.path[-1] == "Python"
        assert "NotImplementedError" in resolution.error
        with pytest.raises(NotImplementedError):
            probe.op(_jagged(), _jagged())
    finally:
        probe.close()
