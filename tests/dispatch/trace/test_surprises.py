"""Surprises: what a trace points out, worked out when it finishes."""

from __future__ import annotations

import sys
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


def test_an_op_with_no_backend_kernel_by_design_decomposes_without_a_surprise() -> None:
    """linear, reshape, layer_norm have only a CompositeImplicitAutograd kernel (for dense
    tensors): decomposing is what they do. The decomposition stays in the tree."""
    x = torch.randn(2, 3, 4)

    def layers(v: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.linear(v, torch.ones(5, 4)).reshape(6, 5)
        return torch.nn.functional.layer_norm(y, (5,))

    result = trace(layers, x)
    assert not [s for s in result.surprises() if s.kind == "decomposed"]
    decomposed = {c.op for c in result.calls if c.kernel_kind == "via CompositeImplicitAutograd"}
    assert {"aten::linear", "aten::reshape", "aten::layer_norm"} <= decomposed
    assert all(c.children for c in result.calls if c.op in decomposed)


def test_an_op_that_decomposes_where_it_has_no_kernel_of_its_own_is_a_surprise() -> None:
    """An op with a CUDA kernel but none for CPU decomposes on CPU: that is worth a look."""
    library = torch.library.Library("opmagic_trace_halve", "DEF")
    library.define("halve(Tensor x) -> Tensor")
    library.impl("halve", lambda x: x * 0.5, "CUDA")
    library.impl("halve", lambda x: x * 0.5, "CompositeImplicitAutograd")
    try:
        result = trace(torch.ops.opmagic_trace_halve.halve, torch.randn(3))
        (surprise,) = [s for s in result.surprises() if s.kind == "decomposed"]
        assert surprise.op == "opmagic_trace_halve::halve"
        assert "no CPU kernel of its own" in surprise.detail
    finally:
        library._destroy()


def _importing_op(library: torch.library.Library, name: str) -> object:
    """An op whose CPU kernel imports a module the first time it runs."""

    def body(x: torch.Tensor) -> torch.Tensor:
        import colorsys  # noqa: F401  (the one-time cost: loaded on the first call)

        return x + 1

    library.define(f"{name}(Tensor x) -> Tensor")
    library.impl(name, body, "CPU")
    sys.modules.pop("colorsys", None)
    return getattr(torch.ops.opmagic_trace_first, name)


def test_a_first_calls_one_time_cost_is_marked_and_warmup_leaves_it_out() -> None:
    """A call during which Python loaded modules (a custom op's first call imports torch's
    compiler stack; here a module imported inside the kernel) says so; ``warmup=True`` runs
    the code once before tracing, so the traced run pays nothing of the kind."""
    library = torch.library.Library("opmagic_trace_first", "DEF")
    try:
        first = trace(_importing_op(library, "plus"), torch.ones(1))
        (call,) = first.calls
        assert call.first_call == "Python loaded 1 module during it"
        assert "one-time cost" in str(first) and "warmup=True" in str(first)
        assert all(c.first_call is None for c in call.children)  # where it happened only
        warmed = trace(_importing_op(library, "again"), torch.ones(1), warmup=True)
        assert warmed.calls[0].first_call is None and "one-time" not in str(warmed)
    finally:
        library._destroy()
