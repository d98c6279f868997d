"""Surprises: what a trace points out, worked out when it finishes."""

from __future__ import annotations

import warnings

import torch

from opmagic import trace

from ..probes import make_probe_op


def test_vmap_without_a_batching_rule_is_a_surprise() -> None:
    probe = make_probe_op(["CPU"])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = trace(torch.vmap(probe.op), torch.randn(2, 3), torch.randn(2, 3))
        top = next(c for c in result.calls if "probe" in c.op)
        assert top.path[:2] == ("FuncTorchDynamicLayerFrontMode", "FuncTorchBatched")
        assert any(s.kind == "no batching rule" for s in result.surprises())
    finally:
        probe.close()


def test_custom_op_without_fake_impl_or_autograd_is_a_surprise() -> None:
    @torch.library.custom_op("opmagic_trace_test::twice", mutates_args=())
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    result = trace(twice, torch.randn(3))
    kinds = {s.kind for s in result.surprises() if s.op == "opmagic_trace_test::twice"}
    assert kinds == {"no fake impl", "no autograd", "generic kernel"}
    inner = result.calls[0]
    assert [c.op for c in inner.children] == ["aten::mul.Tensor"]


def test_surprises_are_those_of_the_run_not_of_later_registrations() -> None:
    """Worked out when the trace finished: a fake impl and a backward added afterwards, then
    the op unregistered, change nothing in what the trace says."""
    library = torch.library.Library("opmagic_trace_later", "FRAGMENT")
    library.define("twice(Tensor x) -> Tensor")
    library.impl("twice", lambda x: x * 2, "CPU")
    try:
        result = trace(torch.ops.opmagic_trace_later.twice, torch.randn(3))
        before = result.surprises()
        assert {s.kind for s in before} == {"no fake impl", "no autograd"}
        library.impl("twice", lambda x: torch.empty_like(x), "Meta")
        library.impl("twice", lambda x: x * 2, "Autograd")
        assert result.surprises() == before
    finally:
        library._destroy()
    assert result.surprises() == before
