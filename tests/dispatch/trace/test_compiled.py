"""torch.compile in a trace: one region per compiled graph with the operators it called at run
time, against probe operators inside the compiled function; the compile itself folded away.

aot_eager runs its graph as operator calls; Inductor fuses pointwise work into kernels of its
own (no operator calls) and calls extern kernels and custom ops as operators.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from opmagic import Compilation, CompiledRegion, dispatch_table, trace
from opmagic.dispatch.ops import op_ref

from ..probes import ProbeOp, make_probe_op, served_by_probe
from .test_ground_truth import SharedLog

pytestmark = pytest.mark.slow


@pytest.fixture
def probes() -> Iterator[tuple[ProbeOp, ProbeOp, SharedLog]]:
    """A leaf probe (CPU, and Meta for the compiler's fake tensors) and a composite one whose
    CompositeImplicitAutograd kernel calls it, logging into one log. Dynamo starts afresh:
    no compiled code, and no record of the frames earlier tests compiled (``reset`` keeps
    those, and compile ids start at 0/0 again)."""
    torch._dynamo.reset()
    torch._dynamo.utils.clear_compilation_metrics()
    leaf = make_probe_op(["CPU", "Meta"])
    composite = make_probe_op(["CompositeImplicitAutograd"], result=lambda a: leaf.op(*a))
    log = SharedLog()
    log.attach(leaf)
    log.attach(composite)
    yield leaf, composite, log
    composite.close()
    leaf.close()
    torch._dynamo.reset()


def _walked(traced, probes: list[ProbeOp]) -> list[tuple[str, str]]:
    tables = {str(op_ref(p.op)): dispatch_table(p.op) for p in probes}
    return [
        (call.op, key)
        for call in traced.walk()
        if call.op in tables
        for key in call.path
        if served_by_probe(tables[call.op], key)
    ]


def test_a_compiled_region_holds_the_operators_its_graph_ran(probes) -> None:
    leaf, composite, log = probes

    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return composite.op(leaf.op(x, y).sin(), y)

    compiled = torch.compile(f, backend="aot_eager")
    x, y = torch.randn(3), torch.randn(3)
    compiled(x, y)  # compiled here: the compiler's own calls (on fake tensors) are not run ones
    log.entries.clear()
    traced = trace(compiled, x, y)
    assert log.entries == _walked(traced, [leaf, composite])  # ground truth
    (region,) = traced.calls
    assert isinstance(region, CompiledRegion) and region.compile_id == "0/0"
    assert region.name == "f (graph 0/0)" and region.graph_breaks == 0
    assert region.function.function == "f" and region.function.line == f.__code__.co_firstlineno
    leaf_name, composite_name = (str(op_ref(p.op)).removesuffix(".default") for p in probes[:2])
    # the composite was decomposed when compiling: its graph calls the leaf twice
    assert [c.op for c in region.children].count(str(op_ref(leaf.op))) == 2
    assert dict(region.custom_ops) == {
        leaf_name: "called: its real CPU kernel ran",
        composite_name: "not called at run time: the compiled code does its work itself "
        "(decomposed or fused)",
    }
    assert all(call.depth >= 1 for call in traced.walk())


def test_graph_breaks_make_one_region_per_graph(probes) -> None:
    leaf, _, log = probes

    def f(x: torch.Tensor) -> torch.Tensor:
        y = leaf.op(x, x)
        if y.sum() > 1e9:  # data-dependent: a graph break
            y = y * 2
        return leaf.op(y, x)

    compiled = torch.compile(f, backend="aot_eager")
    x = torch.randn(3)
    compiled(x)
    log.entries.clear()
    traced = trace(compiled, x)
    regions = traced.regions()
    assert len(regions) == 2 and regions[0].compile_id == "0/0"
    assert regions[1].compile_id.endswith("/0") and regions[1].compile_id != "0/0"
    assert all(r.graph_breaks == 1 for r in regions)
    assert regions[1].name.startswith("f after the graph break at line ")
    # dynamo may compile the resume function again (its code can be collected between calls):
    # the compiler's calls on fake tensors reach the probe at PythonDispatcher and are folded
    # into a compile row, not recorded as run calls
    ran = [entry for entry in log.entries if entry[1] != "PythonDispatcher"]
    assert ran == _walked(traced, [leaf])


def test_compiling_inside_a_trace_is_one_row_and_leaves_the_callbacks_alone(probes) -> None:
    """A first call compiles: the compiler's calls on fake tensors are counted under one row
    per graph, not recorded; the tracer's own Python is not compiled with the code."""
    leaf, _, log = probes

    def f(x: torch.Tensor) -> torch.Tensor:
        return leaf.op(x, x).cos()

    compiled = torch.compile(f, backend="aot_eager")
    traced = trace(compiled, torch.randn(3))
    assert traced.exception is None
    compiling = [item for item in traced.calls if isinstance(item, Compilation)]
    assert len(compiling) == 1 and compiling[0].calls > 0 and compiling[0].compile_id == "0/0"
    assert [r.compile_id for r in traced.regions()] == ["0/0"]
    from opmagic._torch import dynamo

    assert {frame.name for frame in dynamo.compiled_frames().values()} == {"f"}
    assert ("Meta" in key for _, key in log.entries)  # the compiler ran the Meta probe
    assert all(key != "Meta" for _, key in _walked(traced, [leaf]))  # out of the trace


def test_a_compiled_training_steps_backward_is_a_node(probes) -> None:
    layer = torch.nn.Linear(3, 2)
    compiled = torch.compile(layer, backend="aot_eager")
    x = torch.randn(4, 3)
    compiled(x).sum().backward()

    def step() -> None:
        compiled(x).sum().backward()

    traced = trace(step)
    (node,) = [n for n in traced.nodes() if n.name == "CompiledFunctionBackward"]
    assert {c.op for c in node.walk()} >= {"aten::mm"}
    assert all(call.phase == "backward" for call in node.walk())


def test_inductor_calls_extern_kernels_and_custom_ops_as_operators() -> None:
    torch._dynamo.reset()

    @torch.library.custom_op("opmagic_compiled::clip", mutates_args=())
    def clip(x: torch.Tensor, bound: float) -> torch.Tensor:
        return x.clamp(-bound, bound)

    @clip.register_fake
    def _(x: torch.Tensor, bound: float) -> torch.Tensor:
        return torch.empty_like(x)

    def f(x: torch.Tensor) -> torch.Tensor:
        return clip(x.sin() @ x, 1.0).relu()

    compiled = torch.compile(f, backend="inductor")
    x = torch.randn(4, 4)
    compiled(x)
    traced = trace(compiled, x)
    (region,) = traced.regions()
    ops = [c.op for c in region.children]
    assert "opmagic_compiled::clip" in ops  # a fallback: the op itself runs
    assert any(op.startswith("aten::mm") for op in ops)  # an extern kernel
    assert "aten::sin" not in ops and "aten::relu" not in ops  # fused into Inductor's kernels
    assert dict(region.custom_ops) == {"opmagic_compiled::clip": "called: its real CPU kernel ran"}
    call = next(c for c in region.children if c.op == "opmagic_compiled::clip")
    assert call.children and call.children[0].called_from.function.endswith("clip")
    torch._dynamo.reset()
