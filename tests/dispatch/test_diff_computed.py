"""The computed table a diff works out from registrations equals the dispatcher's own
(``_dispatch_dump_table``), for every operator of the process and for operators made to hit
each rule of torch's precedence (alias keys, the AutogradOther ambiguity, fallthroughs)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import opmagic
from opmagic.dispatch.diff.computed import computed_table
from opmagic.dispatch.table import parse_computed_table

_C = torch._C


def live_table(op: str) -> dict[str, tuple[str, str, bool]]:
    return parse_computed_table(_C._dispatch_dump_table(op))


@pytest.mark.exhaustive  # every operator of the process: CI's; the tests below check the rules
def test_every_operator_of_the_process():
    snapshot = opmagic.snapshot()
    wrong = []
    for op in snapshot.dumps:
        state = snapshot.state(op)
        assert state is not None
        if computed_table(state.active(), snapshot.fallbacks) != live_table(op):
            wrong.append(op)
    assert not wrong, wrong[:10]
    assert len(snapshot.dumps) > 2000


@pytest.fixture
def library() -> Iterator[torch.library.Library]:
    made = torch.library.Library("dfcomp", "DEF")
    yield made
    made._destroy()


def _kernel(x):
    return x


@pytest.mark.parametrize(
    ("name", "keys"),
    [
        ("ambiguous", ["CompositeImplicitAutograd", "QuantizedCPU"]),  # AutogradOther raises
        ("nested", ["CompositeImplicitAutogradNestedTensor", "NestedTensorCPU"]),
        ("math_and_backend", ["CompositeImplicitAutograd", "CPU"]),
        ("explicit_and_math", ["CompositeExplicitAutograd", "CompositeImplicitAutograd"]),
        ("non_functional", ["CompositeExplicitAutogradNonFunctional", "Autograd"]),
        ("batched", ["FuncTorchBatchedDecomposition", "CompositeImplicitAutograd"]),
        ("autograd_only", ["Autograd"]),
    ],
)
def test_each_rule_of_the_precedence(library, name, keys):
    library.define(f"{name}(Tensor x) -> Tensor")
    for key in keys:
        library.impl(name, _kernel, key)
    library.impl(name, torch.library.fallthrough_kernel, "AutocastCPU")
    snapshot = opmagic.snapshot()
    state = snapshot.state(f"dfcomp::{name}")
    assert state is not None
    computed = computed_table(state.active(), snapshot.fallbacks)
    assert computed == live_table(f"dfcomp::{name}")
    if name == "ambiguous":
        assert computed["AutogradOther"][1] == "ambiguous autogradother"
