"""Backward in a trace, against the autograd engine itself: probe operators whose autograd
formulas call other probe operators.

Every probe kernel logs ``(op, key, node)``: the runtime key it ran for and the autograd node
the engine was running then (``torch._C._current_autograd_node()``, None in the forward). The
trace must say the same: walking it depth-first, each probe call's keys (those its probes
serve) with the name of the node the call belongs to (``TracedCall.node``) give exactly the
log; each node names the forward call that made it (``AutogradNode.forward``,
``TracedCall.backward_of``, and the reverse ``TracedCall.backward``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from opmagic import AutogradNode, Trace, TracedCall, dispatch_table, trace
from opmagic.dispatch.ops import op_ref

from ..probes import ProbeOp, make_probe_op, served_by_probe


class NodeLog:
    """One log for several probes: ``(op, key, node)`` in the order their kernels ran, and
    the thread each ran on."""

    def __init__(self) -> None:
        self.entries: list[tuple[str, str, str | None]] = []
        self.threads: list[int] = []

    def attach(self, probe: ProbeOp) -> None:
        log, label = self, str(op_ref(probe.op))

        class Appender:
            def append(self, key: str) -> None:
                node = torch._C._current_autograd_node()
                log.entries.append((label, key, node.name() if node is not None else None))
                log.threads.append(threading.get_native_id())

        probe.log = Appender()  # type: ignore[assignment]


def walked(traced: Trace, probes: list[ProbeOp]) -> list[tuple[str, str, str | None]]:
    """The trace as the probes would log it."""
    tables = {str(op_ref(p.op)): dispatch_table(p.op) for p in probes}
    entries = []
    for call in traced.walk():
        table = tables.get(call.op)
        if table is None:
            continue
        node = call.node.name if call.node is not None else None
        entries += [(call.op, key, node) for key in call.path if served_by_probe(table, key)]
    return entries


class Probes:
    """Probe operators wired into one log: ``fwd`` (its formula calls ``helper`` and
    ``composite``, whose CompositeImplicitAutograd kernel calls ``helper``), and ``plain``,
    whose autograd comes from torch's own autograd fallback: none."""

    def __init__(self) -> None:
        self.log = NodeLog()
        self.helper = make_probe_op(["CPU", "AutogradCPU"])
        self.composite = make_probe_op(
            ["CompositeImplicitAutograd"], result=lambda args: self.helper.op(*args)
        )
        self.fwd = make_probe_op(["CPU", "ADInplaceOrView"])
        self.all = [self.helper, self.composite, self.fwd]
        for probe in self.all:
            self.log.attach(probe)
        helper, composite = self.helper.op, self.composite.op

        def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
            ctx.save_for_backward(*inputs)

        def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            x, y = ctx.saved_tensors
            return helper(grad, y), composite(grad, x)

        # a library of this file's: the probes' own would mark the formula a probe kernel
        formulas = torch.library.Library(self.fwd.op.namespace, "FRAGMENT")
        torch.library.register_autograd(
            self.fwd.op, backward, setup_context=setup_context, lib=formulas
        )
        self.fwd.owners = (formulas,)

    def close(self) -> None:
        for probe in reversed(self.all):
            probe.close()


@pytest.fixture
def probes() -> Iterator[Probes]:
    made = Probes()
    yield made
    made.close()


def _leaves() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)


def _backward(p: Probes) -> Any:
    x, y = _leaves()
    p.fwd.op(x, y).sum().backward()
    return x.grad


def _grad(p: Probes) -> Any:
    x, y = _leaves()
    return torch.autograd.grad(p.fwd.op(x, y).sum(), (x, y))


def _twice(p: Probes) -> Any:
    x, y = _leaves()
    total = p.fwd.op(x, y).sum()
    total.backward(retain_graph=True)
    total.backward()  # the same nodes run again: a forward call with two backward runs
    return x.grad


def _chained(p: Probes) -> Any:
    x, y = _leaves()
    inner = p.fwd.op(x, y)
    outer = p.fwd.op(inner, p.composite.op(inner, y))  # the composite's own call is forward
    outer.sum().backward()
    return x.grad


def _one_input(p: Probes) -> Any:
    x = torch.randn(3, requires_grad=True)
    return torch.autograd.grad(p.fwd.op(x, torch.randn(3)).sum(), x)


CASES: dict[str, Callable[[Probes], Any]] = {
    "backward": _backward,
    "autograd.grad": _grad,
    "backward twice": _twice,
    "chained": _chained,
    "one input requires grad": _one_input,
}


@pytest.mark.parametrize("case", list(CASES))
def test_backward_calls_sit_under_the_node_that_ran_them(probes: Probes, case: str) -> None:
    run = CASES[case]
    untraced = run(probes)
    assert untraced is not None
    expected = list(probes.log.entries)
    probes.log.entries.clear()
    traced = trace(run, probes)
    assert traced.exception is None
    assert probes.log.entries == expected  # tracing changed nothing the engine did
    assert walked(traced, probes.all) == expected, traced
    assert any(node for _, _, node in expected)  # the backward ran probes


@pytest.mark.parametrize("case", list(CASES))
def test_each_formula_node_names_the_forward_call_that_made_it(probes: Probes, case: str) -> None:
    traced = trace(CASES[case], probes)
    fwd = str(op_ref(probes.fwd.op))
    formulas = [n for n in traced.nodes() if n.name.startswith("GeneratedBackwardFor_")]
    assert formulas
    for node in formulas:
        assert isinstance(node, AutogradNode) and node.forward is not None
        assert node.forward.op == fwd and node.forward.phase == "forward"
        assert node in node.forward.backward
        assert all(call.backward_of is node.forward for call in node.walk())
        assert node.formula is not None and node.formula.function.endswith("backward")
    made = [call for call in traced.walk() if call.op == fwd]
    runs = {"backward twice": 2}.get(case, 1)
    assert all(len(call.backward) == runs for call in made)


def test_builtin_nodes_name_their_forward_calls() -> None:
    """torch's own nodes (AddmmBackward0, TBackward0, ...) against the calls that made them;
    a leaf's AccumulateGrad has no forward call."""
    layer = torch.nn.Linear(3, 2)
    x = torch.randn(4, 3)

    def step() -> None:
        layer(x).relu().sum().backward()

    traced = trace(step)
    forward_of = {node.name: node.forward for node in traced.nodes()}
    assert forward_of["AddmmBackward0"].op == "aten::addmm"
    assert forward_of["TBackward0"].op == "aten::t"
    assert forward_of["ReluBackward0"].op == "aten::relu"
    assert forward_of["SumBackward0"].op == "aten::sum"
    assert forward_of["torch::autograd::AccumulateGrad"] is None
    addmm = next(call for call in traced.walk() if call.op == "aten::addmm")
    assert [node.name for node in addmm.backward] == ["AddmmBackward0"]
    mm = [c for c in traced.walk() if c.op == "aten::mm"]
    assert mm and all(c.phase == "backward" and c.backward_of is addmm for c in mm)
    assert all(call.phase == "forward" and call.node is None for call in addmm.walk())


def test_calls_without_a_node_made_by_no_grad_code_are_forward() -> None:
    x = torch.randn(3, requires_grad=True)

    def step() -> None:
        y = (x * 2).sum()
        with torch.no_grad():
            x.add(1)
        y.backward()

    traced = trace(step)
    add = next(call for call in traced.walk() if call.op == "aten::add.Tensor")
    assert add.phase == "forward" and add.backward == ()
    mul = next(call for call in traced.walk() if call.op == "aten::mul.Tensor")
    assert [node.name for node in mul.backward] == ["MulBackward0"]


class Reenter(torch.autograd.Function):
    """A backward that runs another backward: past the engine's re-entrance depth, the
    engine hands the inner ones to a thread of its own."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, depth: int, leaf: Any) -> torch.Tensor:
        ctx.depth, ctx.leaf = depth, leaf
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, None, None]:
        if ctx.depth > 0:
            with torch.enable_grad():
                y = torch.ones(1, requires_grad=True)
                torch.autograd.grad(Reenter.apply(y, ctx.depth - 1, ctx.leaf).sum(), y)
        else:
            ctx.leaf(grad, grad)
        return grad, None, None


def test_calls_on_the_engines_other_threads_are_recorded_with_their_thread() -> None:
    """A backward re-entered past the engine's depth limit runs on its re-entrant thread
    pool (on a GPU: the device threads): its calls are in the trace, on their thread, where
    they ran; and tracing still adds no dispatch key there."""
    leaf = make_probe_op(["CPU", "AutogradCPU"])
    log = NodeLog()
    log.attach(leaf)
    main = threading.get_native_id()
    try:

        def run() -> None:
            x = torch.ones(1, requires_grad=True)
            Reenter.apply(x, 80, leaf.op).sum().backward()

        run()
        expected, threads = list(log.entries), set(log.threads)
        log.entries.clear()
        log.threads.clear()
        traced = trace(run)
        assert log.entries == expected and threads - {main}  # it did run elsewhere
        assert walked(traced, [leaf]) == expected
        calls = [c for c in traced.walk() if c.op == str(op_ref(leaf.op))]
        (ran_on,) = threads - {main}
        assert [c.thread for c in calls] == [f"thread {ran_on}"]
        elsewhere = [n for n in traced.nodes() if n.thread is not None]
        assert {n.thread for n in elsewhere} == {f"thread {ran_on}"}
        assert "ReenterBackward" in {n.name for n in elsewhere}
        # grafted where they ran: inside the node whose backward waited for them
        waiting = [n for n in traced.nodes() if n.thread is None and n.name == "ReenterBackward"]
        assert any(any(c.thread for c in n.children) for n in waiting)
    finally:
        leaf.close()


def test_a_node_that_raises_is_named_on_the_trace() -> None:
    class Fails(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x * 1

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            grad.sin()
            raise ValueError("no gradient here")

    def run() -> None:
        Fails.apply(torch.ones(2, requires_grad=True)).sum().backward()

    traced = trace(run)
    assert isinstance(traced.exception, ValueError)
    node = next(n for n in traced.nodes() if n.name == "FailsBackward")
    assert node.raised and [c.op for c in node.walk()] == ["aten::sin"]
    assert isinstance(node.children[0], TracedCall)
