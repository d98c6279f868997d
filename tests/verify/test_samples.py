"""Sample arguments built from a schema: which slots, which tensors, which errors."""

from __future__ import annotations

import pytest
import torch

from opmagic.dispatch.ops import op_parameters, op_ref
from opmagic.verify.samples import (
    SampleError,
    TensorSpec,
    call_arguments,
    plan_arguments,
)

_lib = torch.library.Library("opmagic_samples", "FRAGMENT")
_lib.define("gap(Tensor x, int n=2, Tensor? y=None, *, Tensor z) -> Tensor")


def _slots(name: str):
    return plan_arguments(op_parameters(op_ref(name)))


def test_tensors_always_get_a_slot_defaulted_values_do_not() -> None:
    slots = _slots("aten::add.Tensor")
    assert [(s.name, s.kind) for s in slots] == [("self", "tensor"), ("other", "tensor")]


def test_required_values_get_an_editable_sample() -> None:
    slots = {s.name: s for s in _slots("aten::randn.generator")}
    assert set(slots) == {"size", "generator"}
    assert slots["size"].value == "[1]"
    assert slots["generator"].value == "None"  # Optional[...] without a default: None


def test_optional_tensors_with_a_default_start_as_none() -> None:
    slots = {s.name: s for s in _slots("opmagic_samples::gap")}
    assert set(slots) == {"x", "y", "z"}
    assert slots["y"].optional and not slots["y"].present
    assert slots["z"].present


def test_arguments_after_a_default_go_by_keyword() -> None:
    slots = _slots("opmagic_samples::gap")
    next(s for s in slots if s.name == "y").present = True
    args, kwargs = call_arguments(slots)
    assert len(args) == 1 and set(kwargs) == {"y", "z"}
    assert all(isinstance(v, torch.Tensor) for v in (*args, *kwargs.values()))


def test_tensor_lists_get_two_tensors_and_vmap_a_batch_dimension() -> None:
    (tensors,) = _slots("aten::cat.default")
    args, _ = call_arguments([tensors], batch=2)
    assert [tuple(t.shape) for t in args[0]] == [(2, 2, 2), (2, 2, 2)]


def test_types_without_a_sample_are_a_clear_error() -> None:
    with pytest.raises(SampleError, match=r"argument 'source' of type Storage\. Pick another"):
        _slots("aten::set.source_Storage")


@pytest.mark.parametrize(
    ("spec", "check"),
    [
        (TensorSpec(), lambda t: t.shape == (2, 2) and t.dtype == torch.float32),
        (TensorSpec(device="meta"), lambda t: t.is_meta),
        (TensorSpec(dtype="complex64", view="conj"), lambda t: t.is_conj()),
        (TensorSpec(view="neg"), lambda t: t.is_neg() and t.dtype == torch.float32),
        (TensorSpec(layout="sparse"), lambda t: t.layout == torch.sparse_coo),
        (TensorSpec(layout="sparse", device="meta"), lambda t: t.is_meta and t.is_sparse),
        (TensorSpec(requires_grad=True, view="neg"), lambda t: t.requires_grad and t.is_neg()),
        (TensorSpec(dtype="int64", shape=""), lambda t: t.dim() == 0 and t.dtype == torch.int64),
        (TensorSpec(shape="(1, 2, 3)"), lambda t: t.shape == (1, 2, 3)),
    ],
    ids=[
        "default",
        "meta",
        "conj",
        "neg",
        "sparse",
        "sparse-meta",
        "grad+neg",
        "int-0dim",
        "parenthesised",
    ],
)
def test_tensor_specs_make_the_tensor_they_describe(spec: TensorSpec, check) -> None:
    assert check(spec.build("x"))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (TensorSpec(view="conj"), "a conjugate view needs a complex dtype"),
        (TensorSpec(dtype="int64", view="neg"), "needs float32 or float64"),
        (TensorSpec(dtype="bool", requires_grad=True), "only floating-point and complex"),
        (TensorSpec(shape="two"), "is not a list of sizes"),
        (TensorSpec(shape="-1"), "is not a list of sizes"),
        (TensorSpec(dtype="bool", view="conj", shape="2"), "needs a complex dtype"),
    ],
    ids=["conj-real", "neg-int", "grad-bool", "words", "negative", "conj-bool"],
)
def test_impossible_tensors_say_what_to_change(spec: TensorSpec, message: str) -> None:
    with pytest.raises(SampleError, match=message):
        spec.build("argument 'x'")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_torch_refusing_a_tensor_is_reported_not_raised() -> None:
    with pytest.raises(SampleError, match="x: torch cannot make this tensor"):
        TensorSpec(device="cuda").build("x")


def test_a_value_that_does_not_evaluate_names_the_argument() -> None:
    slots = _slots("aten::randn.generator")
    next(s for s in slots if s.name == "size").value = "[2, oops]"
    with pytest.raises(SampleError, match=r"argument 'size': could not evaluate '\[2, oops\]'"):
        call_arguments(slots)
