"""Arguments: what a trace keeps of each call's arguments (no tensors), and how it says them."""

from __future__ import annotations

import torch

from opmagic import trace
from opmagic.dispatch import TensorInfo


def test_tensors_are_kept_as_what_they_looked_like() -> None:
    x = torch.randn(2, 3, requires_grad=True)
    (call,) = trace(torch.sin, x).calls
    assert call.arguments == (TensorInfo("Tensor", "float32", "cpu", (2, 3), True),)
    assert call.inputs == "f32[2,3] grad"
    meta = torch.empty(4, dtype=torch.float16, device="meta")
    assert trace(torch.cos, meta).calls[0].inputs == "f16[4]@meta"


def test_tensor_lists_and_values_away_from_their_defaults_are_shown() -> None:
    a, b = torch.ones(2), torch.ones(3, dtype=torch.int64)
    (cat,) = trace(torch.cat, [a, a]).calls
    assert cat.inputs == "[f32[2], f32[2]]"  # dim=0 is the default: left out
    assert trace(torch.cat, [a, a], 0).calls[0].inputs == "[f32[2], f32[2]]"
    assert trace(torch.sum, b, 0, True).calls[0].inputs == "i64[3], dim=[0], keepdim=True"


def test_enum_arguments_are_torch_objects_again() -> None:
    """The observer reports dtypes as ints; the trace keeps the dtype."""
    (to,) = trace(lambda v: v.to(torch.bfloat16), torch.ones(2)).calls
    assert torch.bfloat16 in to.arguments and "dtype=bfloat16" in to.inputs
