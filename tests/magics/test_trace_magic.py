"""``%%trace`` in a real IPython shell."""

from __future__ import annotations

import pytest
import torch
from IPython.core.error import UsageError

from opmagic import Surprises, Trace
from opmagic.errors import OpmagicError


@pytest.fixture
def shell(cells):
    cells.run("x = torch.randn(2, 3)\nw = torch.randn(4, 3)")
    return cells


def test_traces_the_cell_and_returns_the_trace(shell) -> None:
    result = shell.run("%%trace -o t\ny = torch.nn.functional.linear(x, w)\ny.relu()")
    traced = result.result
    assert isinstance(traced, Trace) and shell.ns["t"] is traced
    assert [c.op for c in traced.calls] == ["aten::linear", "aten::relu"]
    assert torch.equal(traced.result, shell.eval("y.relu()"))  # the last expression's value
    assert "y" in shell.ns  # the cell ran in the user namespace


def test_context_options_are_those_of_dispatch(shell) -> None:
    traced = shell.run("%%trace --autocast cpu\ntorch.nn.functional.linear(x, w)").result
    assert traced.calls[0].path[0] == "AutocastCPU"
    traced = shell.run("%%trace --inference-mode\nx.sin()").result
    assert traced.calls[0].path == ("CPU",)
    traced = shell.run("%%trace --fake\ntorch.ones(2).sin()").result
    assert "Python" in traced.calls[-1].path  # FakeTensorMode handled it


def test_views(shell) -> None:
    frame = shell.run("%%trace --view frame\nx.sin()").result
    assert list(frame["op"]) == ["aten::sin"]
    assert isinstance(shell.run("%%trace --view surprises\nx.sin()").result, Surprises)
    diagram = shell.run("%%trace --view diagram\nx.sin()").result
    assert "aten::sin" in diagram.dot


def test_a_failing_cell_shows_its_trace_then_raises(shell, capsys) -> None:
    error = shell.fail("%%trace -o t\nx @ torch.ones(5)")
    assert isinstance(error, RuntimeError)
    traced = shell.ns["t"]
    assert traced.exception is error and traced.calls[-1].raised


def test_vmap_is_refused_with_a_clear_message(shell) -> None:
    with pytest.raises(OpmagicError, match=r"^%%trace: --vmap maps a function"):
        shell.shell.run_cell_magic("trace", "--vmap", "x.sin()")


def test_bad_output_name(shell) -> None:
    with pytest.raises(UsageError, match="variable name"):
        shell.shell.run_cell_magic("trace", "-o 1x", "x.sin()")


def test_calls_name_the_cell_line_that_made_them(shell) -> None:
    shell.run("def double(v):\n    return v * 2")
    traced = shell.run("%%trace\ny = double(x)\ny.sin()").result
    mul, sin = traced.calls
    assert mul.called_from.function == "double"
    assert mul.called_from.label.startswith("cell [") and mul.called_from.label.endswith(", line 2")
    assert sin.called_from.label.endswith(", line 3")  # the magic's own line is line 1
    assert sin.called_from.label.split(",")[0] != mul.called_from.label.split(",")[0]


def test_values_and_warmup_are_traces_own(shell) -> None:
    shell.run("calls = []")
    traced = shell.run("%%trace --values --warmup\ncalls.append(1)\nx.cos()").result
    assert traced.values and traced.calls[0].outputs is not None
    assert shell.ns["calls"] == [1, 1]  # the cell ran twice: once before tracing
