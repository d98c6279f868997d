"""``torch._native`` override routes in a diff: their own kind, beside the router kernel torch
installs for them in front of the aten kernel, and counted as aten overrides."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
import torch

import opmagic

from .test_diff import exact_diff, one

registry = pytest.importorskip("torch._native.registry")
DSL = "opmagic_test"


@pytest.fixture
def native_dsl() -> Iterator[None]:
    """Routes a test registers under :data:`DSL`; taken out of torch._native after it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about overriding aten kernels
        yield
        registry.deregister_op_overrides(disable_dsl_names=DSL)
    for key, nodes in list(registry._graphs.items()):
        registry._graphs[key] = [node for node in nodes if node.dsl_name != DSL]
    registry._dsl_name_to_lib_graph.pop(DSL, None)
    registry._filter_state.update(DSL, None, None, remove_keys=True)


def zero_when_small(x):
    return x.numel() < 4


def zeros(x):
    return torch.zeros_like(x)


def test_a_route_its_router_kernel_and_its_removal(native_dsl):
    with exact_diff() as box:
        registry.register_op_override(DSL, "aten", "sin", "CPU", cond=zero_when_small, impl=zeros)
        registry.reenable_op_overrides(enable_dsl_names=DSL)
    assert torch.sin(torch.ones(2)).tolist() == [0.0, 0.0]  # ground truth: the route runs
    found = box[0]
    (route,) = found.routes
    assert (route.op, route.key, route.change, route.kind) == (
        "aten::sin",
        "CPU",
        "added",
        "torch._native route",
    )
    assert route.after.startswith(f"torch._native route · {DSL}: zeros (")
    assert " if zero_when_small (" in route.after
    router = one(found, "aten::sin", "CPU")
    assert (router.kind, router.change) == ("torch._native router", "replaced")
    assert router.after == f"torch._native router · {route.after.split(' · ', 1)[1]}"
    assert router.hides.startswith("C++ · aten/src/ATen/RegisterCPU")
    assert found.aten_overrides == (route,)  # the router itself is torch's code
    assert any(c.op.startswith("_native::sin_") and c.change == "added" for c in found.operators)
    assert "aten::sin  CPU  added" in str(found) and "torch._native route · " in str(found)
    (implementation,) = [
        c for c in found.kernels if c.op.startswith("_native::") and c.key == "CPU"
    ]
    assert implementation.kind == "Python" and implementation.site.startswith("zeros (")

    with exact_diff() as box:
        registry.deregister_op_overrides(disable_dsl_names=DSL)
    (disabled,) = box[0].routes
    assert disabled.change == "replaced" and disabled.after.endswith("[disabled]")
    assert one(box[0], "aten::sin", "CPU").change == "removed"
    assert torch.sin(torch.zeros(1)).tolist() == [0.0]
    assert opmagic.snapshot().routes[-1].active is False
