"""``trace(..., values=True)`` and ``compare_traces``: outputs summarised as the code computed
them, and the first call whose outputs differ between two traces."""

from __future__ import annotations

import pytest
import torch

from opmagic import TraceComparison, ValueSummary, compare_traces, trace
from opmagic.dispatch.trace.compare import comparable
from opmagic.errors import ArgumentTypeError


def model(scale: float):
    """A small computation whose fourth value depends on ``scale``."""

    def run(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.linear(x, w).relu()
        return (y * scale).softmax(-1).sum(0)

    return run


X, W = torch.randn(4, 3), torch.randn(5, 3)


def test_values_summarise_each_output_the_code_computed() -> None:
    traced = trace(model(2.0), X, W, values=True)
    assert traced.values
    assert len(traced.calls) == 5  # linear, relu, mul, softmax, sum
    linear = traced.calls[0]
    (out,) = linear.outputs
    expected = torch.nn.functional.linear(X, W)
    assert isinstance(out, ValueSummary) and out.tensor.shape == (4, 5)
    assert out.low == pytest.approx(expected.min().item())
    assert out.high == pytest.approx(expected.max().item())
    assert out.mean == pytest.approx(expected.mean().item(), rel=1e-5)
    # a decomposition's calls compute values: linear's matmul; a C++ kernel's helpers do not
    matmul = next(c for c in linear.walk() if c.op == "aten::matmul")
    assert matmul.outputs is not None
    mm = next(c for c in linear.walk() if c.op == "aten::mm")
    assert all(c.outputs is None for c in mm.children)
    t = next(c for c in linear.walk() if c.op == "aten::t")
    assert t.outputs is None  # a view of its input: its values are its input's
    assert trace(model(2.0), X, W).calls[0].outputs is None  # only with values=True


def test_values_leave_autograd_as_it_was() -> None:
    """Summarising runs below autograd: no node made, no sequence number taken."""
    x = torch.randn(3, requires_grad=True)

    def two() -> tuple[torch.Tensor, torch.Tensor]:
        return x.sin(), x.cos()

    plain = two()
    traced = trace(two, values=True).result
    gap = plain[1].grad_fn._sequence_nr() - plain[0].grad_fn._sequence_nr()
    assert traced[1].grad_fn._sequence_nr() - traced[0].grad_fn._sequence_nr() == gap
    assert traced[0].grad_fn.name() == "SinBackward0"


def test_identical_runs_agree() -> None:
    a = trace(model(2.0), X, W, values=True)
    b = trace(model(2.0), X, W, values=True)
    result = compare_traces(a, b)
    assert isinstance(result, TraceComparison) and result.same
    compared = [value.call.op for value in comparable(a)]
    assert result.compared == len(compared) and result.only == (0, 0)
    assert compared[:4] == ["aten::linear", "aten::matmul", "aten::mm", "aten::relu"]
    assert "every output agrees" in str(result)


def test_the_first_diverging_call_is_named_with_both_sides() -> None:
    a = trace(model(2.0), X, W, values=True)
    b = trace(model(2.5), X, W, values=True)
    result = compare_traces(a, b, labels=("before", "after"))
    assert not result.same
    left, right = result.first
    assert left.call.op == right.call.op == "aten::mul.Tensor"
    assert left.where == ("forward", "aten::mul.Tensor")
    assert result.difference.startswith(("max", "mean"))
    text = " ".join(str(result).split())  # the headline wraps to the terminal's width
    assert left.index == 4 and "the first divergence is call 5 of before" in text
    assert "before" in text and "after" in text and "AutogradCPU → CPU" in text
    html = result._repr_html_()
    assert "<table" in html and html.count("aten::mul.Tensor") == 2


def test_a_call_only_one_side_made_does_not_shift_the_rest() -> None:
    def extra(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        x = x.abs().neg().neg() * 1  # calls the other run does not make
        return model(2.0)(x, w)

    a = trace(model(2.0), X.abs(), W, values=True)
    b = trace(extra, X, W, values=True)
    result = compare_traces(a, b)
    assert result.same and result.only[0] == 0 and result.only[1] >= 3


def test_tolerances_decide() -> None:
    a = trace(model(2.0), X, W, values=True)
    b = trace(model(2.0001), X, W, values=True)
    assert not compare_traces(a, b, rtol=0, atol=0).same
    assert compare_traces(a, b, rtol=1e-3).same


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"a": "trace"}, "needs two traces; a is a str"),
        ({"b": None}, "needs two traces; b is a NoneType"),
        ({"a": "plain"}, "trace a was recorded without its outputs' values"),
        ({"rtol": -1.0}, "rtol must be 0 or more"),
        ({"atol": "0"}, "atol must be a number"),
        ({"labels": ("one",)}, "labels must be two strings"),
    ],
)
def test_bad_arguments_say_what_to_do(arguments: dict, message: str) -> None:
    valued = trace(model(2.0), X, W, values=True)
    plain = trace(model(2.0), X, W)
    call = {"a": valued, "b": valued, **arguments}
    if call["a"] == "plain":
        call["a"] = plain
    with pytest.raises(ArgumentTypeError, match=message):
        compare_traces(**call)


def test_trace_refuses_options_that_are_not_booleans() -> None:
    with pytest.raises(ArgumentTypeError, match="values must be True or False"):
        trace(torch.sin, torch.ones(1), values="yes")
    with pytest.raises(ArgumentTypeError, match="with-block cannot"):
        trace(warmup=True)


@pytest.mark.slow
def test_eager_and_compiled_agree_and_a_wrong_kernel_is_found() -> None:
    """aot_eager runs the same ops: its outputs agree with eager's; a compiled function
    whose custom op computes something else diverges at that op."""
    torch._dynamo.reset()
    eager = trace(model(2.0), X, W, values=True)
    compiled = torch.compile(model(2.0), backend="aot_eager")
    compiled(X, W)
    result = compare_traces(eager, trace(compiled, X, W, values=True), labels=("eager", "comp"))
    assert result.same and result.compared >= 4
    torch._dynamo.reset()
