"""Fallbacks that refuse an op, and fallthroughs at alias keys, against the real dispatcher.

vmap's per-sample fallback, the functionalization fallback, and the Conjugate, Negative and
ZeroTensor fallbacks each read the op's schema (mutation, aliasing, returns, tensor lists)
and refuse some ops: ``resolve`` must predict each refusal as ``.error`` (and the path up to
it), and every op they serve as before. Schemas x flagged inputs x contexts x kernel sets.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
import torch

from opmagic import resolve

from .ground_truth import CONTEXTS, check_against_dispatcher
from .probes import make_probe_op

pytestmark = pytest.mark.matrix  # a stratified sample runs in the fast loop (tests/conftest.py)

SCHEMAS = {
    "functional": "(Tensor x, Tensor y) -> Tensor",
    "in_place": "(Tensor(a!) x, Tensor y) -> Tensor(a!)",
    "writes_returns_nothing": "(Tensor(a!) x, Tensor y) -> ()",
    "writes_second": "(Tensor x, Tensor(a!) y) -> Tensor(a!)",
    "writes_both": "(Tensor(a!) x, Tensor(b!) y) -> Tensor(a!)",
    "writes_and_views": "(Tensor(a!) x, Tensor(b) y) -> Tensor(a!)",
    "view": "(Tensor(a) x, Tensor y) -> Tensor(a)",
    "returns_nothing": "(Tensor x, Tensor y) -> ()",
    "returns_int": "(Tensor x, Tensor y) -> int",
    "returns_optional": "(Tensor x, Tensor y) -> Tensor?",
    "returns_list": "(Tensor x, Tensor y) -> Tensor[]",
    "returns_two": "(Tensor x, Tensor y) -> (Tensor, Tensor)",
    "out": "(Tensor x, *, Tensor(a!) out) -> Tensor(a!)",
    "tensor_list": "(Tensor[] xs) -> Tensor",
    "optional_tensor_list": "(Tensor?[] xs) -> Tensor",
    "written_tensor_list": "(Tensor(a!)[] xs) -> ()",
}
CALLS: dict[str, Callable[..., Any]] = {
    "out": lambda op, x, y: op(x, out=y),
    "tensor_list": lambda op, x, y: op([x, y]),
    "optional_tensor_list": lambda op, x, y: op([x, y]),
    "written_tensor_list": lambda op, x, y: op([x, y]),
}
KERNEL_SETS = [
    ["CPU"],
    ["CPU", "Autograd"],
    ["CompositeExplicitAutograd"],
    ["CPU", "ADInplaceOrView", "Autograd"],
]


def _complex() -> torch.Tensor:
    return torch.randn(3, dtype=torch.cfloat)


FLAGGED_INPUTS = {
    "plain": lambda: (torch.randn(3), torch.randn(3)),
    "conj_x": lambda: (_complex().conj(), _complex()),
    "conj_y": lambda: (_complex(), _complex().conj()),
    "conj_both": lambda: (_complex().conj(), _complex().conj()),
    "neg_x": lambda: (_complex().conj().imag, torch.randn(3)),
    "neg_y": lambda: (torch.randn(3), _complex().conj().imag),
    "zero_x": lambda: (torch._efficientzerotensor(3), torch.randn(3)),
    "zero_y": lambda: (torch.randn(3), torch._efficientzerotensor(3)),
}


def _cases(contexts, inputs):
    for schema, context, flagged, keys in itertools.product(SCHEMAS, contexts, inputs, KERNEL_SETS):
        yield pytest.param(
            schema, context, flagged, keys, id=f"{schema}-{context}-{flagged}-{'+'.join(keys)}"
        )


@pytest.mark.parametrize(
    ("schema", "context", "inputs", "keys"),
    list(_cases(("plain", "inference_mode", "below_autograd"), FLAGGED_INPUTS)),
)
def test_math_bit_and_zero_tensor_fallbacks(
    schema: str, context: str, inputs: str, keys: list[str]
) -> None:
    check_against_dispatcher(
        keys, FLAGGED_INPUTS[inputs](), CONTEXTS[context], SCHEMAS[schema], CALLS.get(schema)
    )


# ---------------------------------------------------------------- vmap's fallback

X, Y = torch.randn(1, 3), torch.randn(1, 3)  # batch 1: the per-sample loop runs once


def _vmap_both(body, inputs):
    return torch.vmap(body)(X, Y)


def _vmap_x(body, inputs):
    unbatched = torch.randn(3)
    return torch.vmap(lambda x: body(x, unbatched))(X)


def _vmap_y(body, inputs):
    unbatched = torch.randn(3)
    return torch.vmap(lambda y: body(unbatched, y))(Y)


def _vmap_none(body, inputs):
    x, y = torch.randn(3), torch.randn(3)
    return torch.vmap(lambda batched: (body(x, y), batched)[1])(X)


def _vmap_x_outer_y_inner(body, inputs):
    return torch.vmap(lambda x: torch.vmap(lambda y: body(x, y))(Y))(X)


def _vmap_fallback_off(body, inputs):
    torch._C._functorch._set_vmap_fallback_enabled(False)
    try:
        return _vmap_both(body, inputs)
    finally:
        torch._C._functorch._set_vmap_fallback_enabled(True)


VMAPS = {
    "vmap_both": _vmap_both,
    "vmap_x": _vmap_x,
    "vmap_y": _vmap_y,
    "vmap_none": _vmap_none,
    "vmap_x_outer_y_inner": _vmap_x_outer_y_inner,
    "vmap_fallback_off": _vmap_fallback_off,
}


@pytest.mark.parametrize(("schema", "context", "inputs", "keys"), list(_cases(VMAPS, ["plain"])))
def test_vmap_fallback(schema: str, context: str, inputs: str, keys: list[str]) -> None:
    check_against_dispatcher(keys, (), VMAPS[context], SCHEMAS[schema], CALLS.get(schema))


# ---------------------------------------------------------------- functionalization


@pytest.mark.parametrize(
    ("schema", "context", "inputs", "keys"),
    list(_cases(("functionalize", "cpp_functionalization"), ["plain"])),
)
def test_functionalization_fallback(
    schema: str, context: str, inputs: str, keys: list[str]
) -> None:
    check_against_dispatcher(
        keys, FLAGGED_INPUTS[inputs](), CONTEXTS[context], SCHEMAS[schema], CALLS.get(schema)
    )


def test_custom_op_with_mutates_args_under_functionalize() -> None:
    @torch.library.custom_op("opmagic_test_refusals::bump", mutates_args=("x",))
    def bump(x: torch.Tensor) -> None:
        x.add_(1)

    try:
        x = torch.randn(3)

        def body(t):
            seen.append(resolve(bump, t))
            bump(t)
            return t

        seen: list = []
        with pytest.raises(RuntimeError, match="alias annotations"):
            torch.func.functionalize(body)(x)
        assert "functionalization refuses" in seen[0].error
        assert "mutates_args" in seen[0].error
    finally:
        bump._lib._destroy()


# ---------------------------------------------------------------- fallthroughs at alias keys

FALLTHROUGH_SETS = [
    ["fallthrough:CompositeExplicitAutograd"],
    ["fallthrough:CompositeImplicitAutograd"],
    ["fallthrough:CompositeExplicitAutograd", "Autograd"],
    ["fallthrough:CompositeExplicitAutograd", "CPU"],
    ["fallthrough:CompositeExplicitAutograd", "CPU", "Autograd"],
    ["fallthrough:CompositeImplicitAutograd", "CPU", "ADInplaceOrView"],
    ["fallthrough:Autograd", "CPU"],
    ["fallthrough:Autograd", "CompositeExplicitAutograd"],
    ["fallthrough:CPU", "CompositeExplicitAutograd"],
    ["fallthrough:CPU", "Autograd"],
]
FALLTHROUGH_INPUTS = {
    "cpu": lambda: (torch.randn(3), torch.randn(3)),
    "requires_grad": lambda: (torch.randn(3, requires_grad=True), torch.randn(3)),
    "meta": lambda: (torch.randn(3, device="meta"), torch.randn(3, device="meta")),
}
FALLTHROUGH_CONTEXTS = (
    "plain",
    "no_grad",
    "inference_mode",
    "below_autograd",
    "dispatch_mode",
    "vmap",
    "functionalize",
)


@pytest.mark.parametrize(
    ("context", "inputs", "keys"),
    [
        pytest.param(c, i, k, id=f"{c}-{i}-{'+'.join(k)}")
        for c, i, k in itertools.product(FALLTHROUGH_CONTEXTS, FALLTHROUGH_INPUTS, FALLTHROUGH_SETS)
    ],
)
def test_fallthrough_registered_at_an_alias_key(context: str, inputs: str, keys: list[str]) -> None:
    check_against_dispatcher(keys, FALLTHROUGH_INPUTS[inputs](), CONTEXTS[context])


def test_a_fallthrough_at_an_alias_key_is_an_error_not_a_crash() -> None:
    probe = make_probe_op(["fallthrough:CompositeExplicitAutograd"])
    try:
        resolution = resolve(probe.op, torch.randn(2), torch.randn(2))
        assert "fallthrough_kernel was executed" in resolution.error
        assert resolution.path == ("AutogradCPU",)
    finally:
        probe.close()
