"""``DispatchDiff.affected``: the calls of an earlier trace (or ``(op, args)`` pairs) whose
path now reaches a kernel that changed, checked against what the real calls run after the
change (probe kernels that log their key)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
import torch

import opmagic
from opmagic.errors import ArgumentTypeError


@pytest.fixture
def libraries() -> Iterator[list[torch.library.Library]]:
    made: list[torch.library.Library] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about overriding aten kernels
        yield made
    for library in made:
        library._destroy()


def model(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) + torch.cos(x) + torch.sin(x * 2)


def test_the_calls_of_a_trace_that_now_run_the_override(libraries):
    x = torch.randn(3)
    traced = opmagic.trace(model, x)
    ran: list[str] = []

    def probe(keyset, x):
        ran.append(str(keyset.highestPriorityTypeId()))
        return x * 0

    with opmagic.diff() as found:
        libraries.append(torch.library.Library("aten", "IMPL"))
        libraries[0].impl("sin", probe, "CPU", with_keyset=True)
    model(x)
    assert ran == ["DispatchKey.CPU"] * 2  # ground truth: both sin calls run it now

    affected = found.affected(traced)
    (group,) = affected.calls
    assert (group.op, group.key, group.count) == ("aten::sin", "CPU", len(ran))
    assert "test_diff_affected.py:" in group.after and "RegisterCPU" in group.before
    assert group.inputs == "f32[3]"
    assert affected.checked == len(traced)
    text = str(affected)
    assert text.startswith(f"2 of {len(traced)} calls run something else now")
    assert "2 aten::sin calls (f32[3]): at CPU" in text
    assert found.affected(traced).frame()["count"].tolist() == [2]


def test_calls_given_as_op_and_arguments_are_resolved(libraries):
    x = torch.randn(3)
    with opmagic.diff() as found:
        libraries.append(torch.library.Library("aten", "IMPL"))
        libraries[0].impl("cos", lambda x: x, "CompositeExplicitAutograd")  # CPU keeps its own
        libraries[0].impl("sin", lambda x: x, "CPU")
    affected = found.affected(
        [("aten::sin", (x,)), ("aten::cos", (x,)), (torch.ops.aten.add.Tensor, (x, x), {})]
    )
    assert [(c.op, c.count) for c in affected] == [("aten::sin", 1)]
    assert affected.checked == 3


def test_a_kernel_at_a_key_the_call_passed_over(libraries):
    x = torch.randn(3)
    with torch.autocast("cpu"):  # AutocastCPU is in the keyset, a fallthrough for sin
        traced = opmagic.trace(torch.sin, x)
    ran: list[str] = []

    def probe(keyset, x):
        ran.append("autocast kernel")
        return torch.ops.aten.sin.default.redispatch(
            keyset.remove(torch._C.DispatchKey.AutocastCPU), x
        )

    with opmagic.diff() as found:
        libraries.append(torch.library.Library("aten", "IMPL"))
        libraries[0].impl("sin", probe, "AutocastCPU", with_keyset=True)
    with torch.autocast("cpu"):
        torch.sin(x)
    assert ran == ["autocast kernel"]
    (group,) = found.affected(traced).calls
    assert (group.key, group.before.split(" · ")[0]) == ("AutocastCPU", "fallthrough")


def test_a_fallback_reaches_operators_without_a_kernel_of_their_own(libraries):
    defs = torch.library.Library("dfaf", "DEF")
    libraries.append(defs)
    defs.define("cuda_only(Tensor x) -> Tensor")
    defs.impl("cuda_only", lambda x: x, "CUDA")
    x = torch.randn(2)

    def fallback(op, keyset, *args, **kwargs):
        return args[0]

    with opmagic.diff() as found:
        fallbacks = torch.library.Library("_", "IMPL")
        libraries.append(fallbacks)
        fallbacks.fallback(fallback, "CPU", with_keyset=True)
    assert torch.ops.dfaf.cuda_only(x) is x  # ground truth: the fallback runs now
    (group,) = found.affected([("dfaf::cuda_only", (x,))]).calls
    assert (group.key, group.before) == ("CPU", "no kernel")
    assert group.after.startswith("backend fallback · ")


def test_what_cannot_be_checked_is_said():
    found = opmagic.diff(opmagic.snapshot())
    affected = found.affected([("nosuch::op", (torch.ones(1),))])
    assert affected.checked == 0 and "nosuch::op" in affected.skipped[0]
    assert "not checked: nosuch::op" in str(affected)
    with pytest.raises(ArgumentTypeError, match="takes a Trace"):
        found.affected("aten::sin")
    with pytest.raises(ArgumentTypeError, match="takes a Trace"):
        found.affected([torch.sin])
