"""``check_op``: what it accepts as the op (the README's op names included) and bad arguments."""

from __future__ import annotations

import pytest
import torch

from opmagic import check_op
from opmagic.errors import ArgumentTypeError, UnknownOperatorError


@pytest.mark.parametrize(
    "op", ["aten::add.Tensor", "aten::add", torch.ops.aten.add, torch.ops.aten.add.Tensor]
)
def test_op_names_packets_and_overloads_are_checked(op) -> None:
    report = check_op(op, (torch.randn(3), torch.randn(3)))
    assert report.op == "aten::add.Tensor"
    assert report.rows and report.passed, report


def test_torch_functions_and_bound_methods_are_checked() -> None:
    x, y = torch.randn(3), torch.randn(3)
    for op, args in ((torch.add, (x, y)), (torch.Tensor.add, (x, y)), (x.add, (y,))):
        report = check_op(op, args)
        assert report.op == "aten::add.Tensor" and report.inputs == "(float32[3], float32[3])"
        assert report.passed, report


@pytest.mark.parametrize(
    ("op", "args", "kwargs", "error", "expected"),
    [
        ("aten::add.Tensor", torch.ones(1), None, ArgumentTypeError, "args must be the sample"),
        ("aten::add.Tensor", "xy", None, ArgumentTypeError, "write \\(x,\\) for one"),
        ("aten::add.Tensor", (torch.ones(1),), {1: 2}, ArgumentTypeError, "kwargs must be a dict"),
        ("aten::nope_nope", (torch.ones(1),), None, UnknownOperatorError, "nope_nope"),
    ],
)
def test_what_cannot_be_checked_is_named(op, args, kwargs, error, expected) -> None:
    with pytest.raises(error, match=expected):
        check_op(op, args, kwargs)
