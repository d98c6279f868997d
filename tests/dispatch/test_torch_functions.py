"""Torch functions and Tensor methods as users name operators, checked against torch itself.

Every function ``torch.overrides`` lists either names an aten packet that exists or says
why it names none; a real call of every one that names a packet (and runs with a sample
tensor or two) runs that packet's operator, as a logging TorchDispatchMode sees it. Autograd
is off for those calls so that an operator with a CompositeImplicitAutograd kernel
(``aten::linear``) reaches the mode before it decomposes.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import opmagic
from opmagic import NotAnOperatorError
from opmagic.dispatch.ops import OpRef, op_ref, overloads_of


def _overridable() -> list[Callable[..., Any]]:
    return [
        fn
        for functions in torch.overrides.get_overridable_functions().values()
        for fn in functions
        if callable(fn)
    ]


def _mapped() -> dict[Callable[..., Any], str]:
    """Every overridable function that names a packet, with its ``ns::name``."""
    mapped = {}
    for fn in _overridable():
        with contextlib.suppress(NotAnOperatorError):
            mapped[fn] = op_ref(fn).qualname
    return mapped


def test_every_overridable_function_names_a_packet_or_says_what_to_pass():
    named = refused = 0
    for fn in _overridable():
        try:
            ref = op_ref(fn)
        except NotAnOperatorError as error:
            refused += 1
            assert "torch.ops.aten." in str(error) or "Pass an operator" in str(error), fn
            continue
        named += 1
        assert ref.namespace == "aten" and ref.overload is None, fn
        assert overloads_of(ref), f"{fn} maps to {ref}, which has no overload"
    assert named > 1000 and refused > 100  # torch 2.13: 1,236 of 1,430 name a packet


class _OperatorLog(TorchDispatchMode):
    """The packets (``aten::add``) of every operator that reaches the mode."""

    def __init__(self) -> None:
        super().__init__()
        self.packets: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.packets.append(func._schema.name)
        return func(*args, **(kwargs or {}))


def _packets_run(fn: Callable[..., Any]) -> list[str] | None:
    """The packets a call of ``fn`` on sample tensors runs; None when no sample fits."""
    for count in (1, 2):
        log, samples = _OperatorLog(), [torch.randn(4, 4) for _ in range(count)]
        try:
            with warnings.catch_warnings(), torch._C._AutoDispatchBelowAutograd(), log:
                warnings.simplefilter("ignore")
                result = fn(*samples)
        except Exception:
            continue
        if result is not NotImplemented:
            return log.packets
    return None


def test_a_real_call_runs_the_operator_the_function_names():
    checked, wrong = [], []
    for fn, qualname in _mapped().items():
        packets = _packets_run(fn)
        if not packets:  # no sample fits, or the binding answered without an operator
            continue
        checked.append(fn)
        if qualname not in packets:
            wrong.append(f"{torch.overrides.resolve_name(fn)} -> {qualname}, ran {packets[:4]}")
    assert not wrong, "\n".join(wrong)
    assert len(checked) > 600
    assert {torch.add, torch.Tensor.add, F.silu, F.linear, F.relu, F.softmax} <= set(checked)


@pytest.mark.parametrize(
    ("fn", "qualname"),
    [
        (torch.add, "aten::add"),
        (torch.sin, "aten::sin"),
        (torch.Tensor.add, "aten::add"),
        (torch.Tensor.add_, "aten::add_"),
        (torch.randn(2).add, "aten::add"),
        (torch.randn(2).sum, "aten::sum"),
        (F.silu, "aten::silu"),
        (F.relu, "aten::relu"),
        (F.linear, "aten::linear"),  # a C binding: its CompositeImplicitAutograd op
        (F.cross_entropy, "aten::cross_entropy_loss"),  # Python calling one operator
        (torch.Tensor.__rsub__, "aten::rsub"),
        (torch.linalg.norm, "aten::linalg_norm"),
        (torch.special.erf, "aten::special_erf"),
    ],
)
def test_functions_and_methods_users_type(fn, qualname):
    assert op_ref(fn) == OpRef(*qualname.split("::"), None)


@pytest.mark.parametrize(
    ("fn", "says"),
    [
        (torch.norm, r"torch\.norm is Python code that calls several operators .*torch\.ops\."),
        (torch.randn(2).norm, r"torch\.Tensor\.norm is Python code that calls several"),
        (F.mse_loss, r"several operators \(torch\.ops\.aten\.mse_loss, .*broadcast_tensors"),
        (F.max_pool2d, r"max_pool2d, torch\.ops\.aten\.max_pool2d_with_indices\)"),
        (
            torch.Tensor.__add__,
            r"no aten::__add__\. Pass the operator it calls \(torch\.ops\.aten\.add\?\)",
        ),
        (torch.Tensor.backward, r"calls no aten operator itself: pass an operator"),
        (lambda x: x.sin(), r"got the function '<lambda>'.*a torch function or Tensor method"),
    ],
)
def test_functions_that_name_no_one_operator_say_what_to_pass(fn, says):
    with pytest.raises(NotAnOperatorError, match=says):
        op_ref(fn)


def test_resolve_and_tables_take_torch_functions_and_bound_methods():
    x, y = torch.randn(3, requires_grad=True), torch.randn(3)
    expected = opmagic.resolve(torch.ops.aten.add.Tensor, x, y)
    for op, args in ((torch.add, (x, y)), (torch.Tensor.add, (x, y)), (x.add, (y,))):
        resolution = opmagic.resolve(op, *args)
        assert resolution.op == "aten::add.Tensor" and resolution.path == expected.path
    assert opmagic.resolve(torch.add, x, 1).op == "aten::add.Tensor"  # 1 becomes a tensor
    assert opmagic.dispatch_table(torch.sin).op == opmagic.dispatch_table("aten::sin").op


def test_call_contexts_convert_the_tensor_of_a_bound_method():
    x, y = torch.randn(3), torch.randn(3)
    resolution = opmagic.CallContext(fake=True).resolve(x.mul, y)
    assert resolution.error is None and resolution.path[-1] == "Meta"


@pytest.mark.slow  # the trace's operator observer is built (C++) on first use
def test_call_contexts_trace_a_torch_function():
    x, y = torch.randn(3), torch.randn(3)
    traced = opmagic.CallContext().trace(torch.add, x, y)  # a packet: torch picks the overload
    assert [call.op for call in traced.calls] == ["aten::add.Tensor"]
    traced = opmagic.CallContext().trace(x.mul, y)
    assert [call.op for call in traced.calls] == ["aten::mul.Tensor"]
