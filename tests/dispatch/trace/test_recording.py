"""Recording: results, call trees, paths across re-calls, errors, threads, cached paths."""

from __future__ import annotations

import contextlib
import threading

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import opmagic
from opmagic import Trace, trace
from opmagic._torch import custom_op_state
from opmagic.errors import ArgumentTypeError, OpmagicError

from ..probes import make_probe_op


def ops_of(result: Trace) -> list[tuple[int, str]]:
    return [(call.depth, call.op) for call in result.walk()]


def test_returns_what_the_function_returned_and_records_top_level_calls_in_order() -> None:
    x = torch.randn(3)
    result = trace(lambda v: (v.sin() + 1).sum(), x)
    assert isinstance(result, Trace)
    assert torch.equal(result.result, (x.sin() + 1).sum())
    assert [c.op for c in result.calls] == ["aten::sin", "aten::add.Tensor", "aten::sum"]
    assert all(c.depth == 0 for c in result.calls)
    added = result.calls[1]  # the 1 reaches the dispatcher as a wrapped-number tensor
    assert added.inputs == "f32[3], i64[]" and added.path == ("AutogradCPU", "CPU")
    assert all(call.error is None for call in result.walk())
    assert result.exception is None and result.time_ns > 0 and result.overhead_ns > 0


def test_a_module_forward_returns_the_same_values_traced() -> None:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    x = torch.randn(2, 3, 8)
    assert torch.equal(trace(layer, x).result, layer(x))


def test_children_are_the_calls_a_kernel_made_depth_first() -> None:
    x, w = torch.randn(2, 3), torch.randn(4, 3)
    result = trace(torch.nn.functional.linear, x, w)
    (linear,) = result.calls
    assert linear.op == "aten::linear" and linear.path == ("AutogradCPU",)
    assert linear.kernel.alias == "CompositeImplicitAutograd"
    assert [c.op for c in linear.children] == ["aten::t", "aten::matmul"]
    walked = ops_of(result)
    assert walked[:3] == [(0, "aten::linear"), (1, "aten::t"), (2, "aten::transpose.int")]
    assert len(result) == len(walked)


def test_autocast_re_call_continues_the_path_and_casts_are_children() -> None:
    x, w = torch.randn(2, 3), torch.randn(4, 3)
    with torch.autocast("cpu"):
        result = trace(torch.nn.functional.linear, x, w)
    (linear,) = result.calls
    assert linear.path == ("AutocastCPU", "AutogradCPU")
    assert linear.recalls == 1
    casts = [c for c in linear.children if c.op == "aten::to.dtype"]
    assert len(casts) == 2 and "dtype=bfloat16" in casts[0].inputs
    kinds = {(s.kind, s.op) for s in result.surprises()}
    assert ("autocast cast", "aten::linear") in kinds
    # linear has no backend kernel by design: its decomposition is in the tree, not a surprise
    assert ("decomposed", "aten::linear") not in kinds
    assert linear.kernel.alias == "CompositeImplicitAutograd" and linear.children


def test_inference_mode_and_no_grad_paths() -> None:
    x = torch.randn(3, requires_grad=True)
    assert trace(torch.sin, x).calls[0].path == ("AutogradCPU", "CPU")
    with torch.no_grad():
        assert trace(torch.sin, x).calls[0].path == ("AutogradCPU", "CPU")
    with torch.inference_mode():
        assert trace(torch.sin, torch.randn(3)).calls[0].path == ("CPU",)


def test_block_form_fills_the_trace_when_the_block_ends() -> None:
    with opmagic.trace() as result:
        torch.ones(2).cos()
    assert [c.op for c in result.calls] == ["aten::ones", "aten::cos"]
    assert result.result is None


def test_an_exception_is_kept_and_named_on_the_calls_it_left() -> None:
    result = trace(lambda: torch.ones(2) @ torch.ones(3))
    assert isinstance(result.exception, RuntimeError)
    with pytest.raises(RuntimeError, match="size"):
        _ = result.result
    matmul = result.calls[-1]
    assert matmul.raised and "RuntimeError" in matmul.error
    assert matmul.children[-1].raised and matmul.children[-1].error == matmul.error
    assert not result.calls[0].raised and result.calls[0].error is None


def test_a_caught_exception_is_named_as_caught() -> None:
    def caught() -> torch.Tensor:
        with contextlib.suppress(RuntimeError):
            torch.ones(2) @ torch.ones(3)
        return torch.zeros(1)

    result = trace(caught)
    assert result.exception is None
    failed = [c for c in result.walk() if c.raised]
    assert failed and all(c.error == "raised an exception that its caller caught" for c in failed)


def test_a_dispatch_failure_keeps_its_explanation() -> None:
    probe = make_probe_op(["CPU"])
    try:
        result = trace(probe.op, torch.randn(2, device="meta"), torch.randn(2, device="meta"))
        (call,) = result.calls
        assert isinstance(result.exception, NotImplementedError)
        assert call.raised and "Meta" in call.error and call.kernel_kind == "error"
    finally:
        probe.close()


def test_registrations_made_between_traces_change_the_path() -> None:
    probe = make_probe_op(["CPU"])
    x = torch.randn(2)
    below_autocast = torch._C._dispatch_keyset_full_after(torch._C.DispatchKey.AutocastCPU)

    def autocast_kernel(keyset, a, b):
        return probe.op.redispatch(keyset & below_autocast, a, b)

    try:
        with torch.autocast("cpu"):
            assert trace(probe.op, x, x).calls[0].path == ("AutogradCPU", "CPU")
            name = probe.op.name().split("::")[1]
            probe.library.impl(name, autocast_kernel, "AutocastCPU", with_keyset=True)
            assert trace(probe.op, x, x).calls[0].path == ("AutocastCPU", "AutogradCPU", "CPU")
    finally:
        probe.close()


def test_fake_tensor_mode_handler_calls_are_children() -> None:
    leaf = make_probe_op(["CPU", "Meta"])
    composite = make_probe_op(["CompositeImplicitAutograd"], result=lambda a: leaf.op(*a))
    try:
        with FakeTensorMode() as mode:
            x = mode.from_tensor(torch.randn(3))
            result = trace(composite.op, x, x)
        (top,) = result.calls
        assert top.path == ("PythonTLSSnapshot", "AutogradCPU")  # decomposed before Python
        (inner,) = top.children  # the leaf: through FakeTensorMode's handler to its Meta kernel
        assert inner.path == ("PythonTLSSnapshot", "AutogradCPU", "Python", "Meta")
        assert inner.recalls == 1 and inner.steps[2].action == "call"
        assert {c.op for c in inner.children} >= {"aten::empty_like"}  # the handler's calls
    finally:
        composite.close()
        leaf.close()


def test_custom_op_calls_are_traced_and_keep_their_dispatch_shortcut_after() -> None:
    """torch 2.14's custom_op calls skip the RecordFunction hook through a Python-side shortcut:
    off while tracing (the call and its children are seen), on again after, error or not."""

    @torch.library.custom_op("opmagic_trace_test::thrice", mutates_args=())
    def thrice(x: torch.Tensor) -> torch.Tensor:
        return x * 3

    shortcut = custom_op_state.has_dispatch_shortcut(thrice._opoverload)
    result = trace(thrice, torch.randn(3))
    assert [c.op for c in result.calls] == ["opmagic_trace_test::thrice"]
    assert [c.op for c in result.calls[0].children] == ["aten::mul.Tensor"]
    assert custom_op_state.has_dispatch_shortcut(thrice._opoverload) == shortcut
    with pytest.raises(ValueError), opmagic.trace():
        thrice(torch.ones(1))
        raise ValueError
    assert custom_op_state.has_dispatch_shortcut(thrice._opoverload) == shortcut


def test_calls_on_other_threads_are_not_traced() -> None:
    def run() -> None:
        worker = threading.Thread(target=lambda: torch.ones(2).cos())
        worker.start()
        worker.join()

    assert "aten::cos" not in {c.op for c in trace(run).walk()}


def test_tracing_inside_a_trace_is_refused_clearly() -> None:
    with pytest.raises(OpmagicError, match="already tracing"), opmagic.trace():
        trace(torch.ones, 2)


def test_trace_needs_a_function() -> None:
    with pytest.raises(ArgumentTypeError, match="needs a function"):
        trace(torch.ones(2))
