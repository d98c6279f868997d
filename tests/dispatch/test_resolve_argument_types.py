"""Argument types against the real call: ``resolve`` refuses exactly what torch refuses.

Every schema type x a spread of Python values (numbers, strings, None, tensors of each
kind, lists, dtypes, devices, numpy scalars) is called for real and resolved; torch's
conversion has quirks (an ``int`` takes a 0-dim float tensor, a ``bool`` takes None, a
``Tensor`` takes None, ``str[]`` takes a string), and the check wants them all. Packets
pick their overload by the same rules.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from torch.library import Library

from opmagic import ArgumentsMismatchError, resolve

from .ground_truth import CONTEXTS, check_against_dispatcher

pytestmark = pytest.mark.matrix  # a stratified sample runs in the fast loop (tests/conftest.py)

TYPES = [
    "int", "SymInt", "float", "bool", "str", "Scalar", "complex", "Device", "ScalarType",
    "Layout", "MemoryFormat", "Generator?", "int[]", "int[2]", "SymInt[]", "float[]", "bool[]",
    "Scalar[]", "str[]", "int?", "float?", "Scalar?", "int[]?", "ScalarType?", "Device?",
    "Tensor", "Tensor?", "Tensor[]", "Tensor?[]",
]  # fmt: skip
VALUES = {
    "int": lambda: 1,
    "float": lambda: 1.5,
    "bool": lambda: True,
    "complex": lambda: 1j,
    "str": lambda: "abc",
    "device_str": lambda: "cpu",
    "None": lambda: None,
    "int_0d": lambda: torch.tensor(1),
    "float_0d": lambda: torch.tensor(1.5),
    "bool_0d": lambda: torch.tensor(True),
    "float_1": lambda: torch.tensor([1.5]),
    "int_1": lambda: torch.tensor([2]),
    "float_2": lambda: torch.randn(2),
    "int_2": lambda: torch.tensor([1, 2]),
    "meta_0d": lambda: torch.tensor(1, device="meta"),
    "int_list": lambda: [1, 2],
    "int_tuple": lambda: (1, 2),
    "float_list": lambda: [1.0, 2.0],
    "mixed_list": lambda: [1, 1.5],
    "empty_list": lambda: [],
    "bool_list": lambda: [True],
    "tensor_list": lambda: [torch.randn(1)],
    "tensor_none_list": lambda: [torch.randn(1), None],
    "str_list": lambda: ["a"],
    "dtype": lambda: torch.float32,
    "layout": lambda: torch.strided,
    "memory_format": lambda: torch.contiguous_format,
    "device": lambda: torch.device("cpu"),
    "generator": lambda: torch.Generator(),
    "np_int64": lambda: np.int64(1),
    "np_float32": lambda: np.float32(1.5),
    "np_float64": lambda: np.float64(1.5),
    "np_array": lambda: np.array([1, 2]),
}
# the contexts that change what a value is (fake tensors have meta storage, vmap batches
# tensors, a mode sees item() calls), on the values they change
CONTEXT_VALUES = ("int", "str", "None", "int_0d", "float_1", "int_2", "meta_0d", "tensor_list")
CONTEXTS_FOR_TYPES = ("FakeTensorMode", "dispatch_mode", "inference_mode", "vmap")


def _vmap_first(body, inputs):
    """vmap over the first argument only: the value under test goes in as it is."""
    first, *rest = inputs
    return torch.vmap(lambda x: body(x, *rest))(first.unsqueeze(0))


CONTEXT_RUNNERS = {**CONTEXTS, "vmap": _vmap_first}


@pytest.mark.parametrize(
    ("schema_type", "value"),
    [pytest.param(t, v, id=f"{t}-{v}") for t, v in itertools.product(TYPES, VALUES)],
)
def test_every_type_takes_what_torch_takes(schema_type: str, value: str) -> None:
    check_against_dispatcher(
        ["CPU", "Autograd"],
        (torch.randn(2), VALUES[value]()),
        CONTEXTS["plain"],
        schema=f"(Tensor x, {schema_type} a) -> Tensor",
    )


def _context_cases():
    for context, schema_type, value in itertools.product(CONTEXTS_FOR_TYPES, TYPES, CONTEXT_VALUES):
        if context == "FakeTensorMode" and value == "meta_0d":
            continue  # FakeTensorMode's Python code rejects mixed devices before dispatching
        yield pytest.param(context, schema_type, value, id=f"{context}-{schema_type}-{value}")


@pytest.mark.parametrize(("context", "schema_type", "value"), list(_context_cases()))
def test_types_under_contexts(context: str, schema_type: str, value: str) -> None:
    check_against_dispatcher(
        ["CPU", "Autograd", "Meta"],
        (torch.randn(2), VALUES[value]()),
        CONTEXT_RUNNERS[context],
        schema=f"(Tensor x, {schema_type} a) -> Tensor",
    )


def test_keyword_arguments_are_checked_too() -> None:
    check_against_dispatcher(
        ["CPU"],
        (torch.randn(2), "abc"),
        CONTEXTS["plain"],
        schema="(Tensor x, *, float factor=1.0) -> Tensor",
        call=lambda op, x, factor: op(x, factor=factor),
    )


# ---------------------------------------------------------------- packets


OVERLOADS = {
    "Tensor": "(Tensor x, Tensor y) -> Tensor",
    "Scalar": "(Tensor x, Scalar y) -> Tensor",
    "int_list": "(Tensor x, int[] y) -> Tensor",
    "str": "(Tensor x, str y) -> Tensor",
}
_packets = itertools.count()


@pytest.fixture
def packet():
    """``opmagic_probe::packetN`` with the overloads above, each logging its own name."""
    name = f"packet{next(_packets)}"
    library = Library("opmagic_probe", "FRAGMENT")
    log: list[str] = []
    for overload, schema in OVERLOADS.items():
        library.define(f"{name}.{overload}{schema}")

        def kernel(x, y, _overload=overload):
            log.append(_overload)
            return torch.empty_like(x)

        library.impl(f"{name}.{overload}", kernel, "CompositeExplicitAutograd")
    yield getattr(torch.ops.opmagic_probe, name), log
    library._destroy()


@pytest.mark.parametrize("value", list(VALUES))
def test_packets_pick_the_overload_torch_picks(packet, value: str) -> None:
    op, log = packet
    x, y = torch.randn(2), VALUES[value]()
    try:
        chosen = resolve(op, x, y).op.rpartition(".")[2]
    except ArgumentsMismatchError:
        chosen = None
    try:
        op(x, y)
    except Exception:  # no overload fits: the real call refuses too
        assert chosen is None and log == []
        return
    assert [chosen] == log


def test_a_wrong_type_says_which_argument_and_what_torch_says() -> None:
    resolution = resolve("aten::mul.Scalar", torch.randn(2), "abc")
    assert resolution.path == ()  # torch refuses the call before any kernel runs
    message = resolution.error
    assert "Argument 'other' of aten::mul.Scalar must be a number (Scalar), got str 'abc'" in (
        message
    )
    assert "Expected a value of type 'number' for argument 'other'" in message


def test_numbers_for_tensor_arguments_where_torch_wraps_them() -> None:
    x = torch.randn(2, device="meta")
    resolution = resolve("aten::mul.Tensor", x, 2)  # torch wraps 2 as a CPU tensor
    assert resolution.error is None and resolution.path == ("AutogradMeta", "Meta")
    assert [i.name for i in resolution.inputs] == ["self", "other"]
    torch.ops.aten.mul.Tensor(x, 2)
    refused = resolve("aten::sin.out", torch.randn(2), out=2)  # sin takes no numbers for tensors
    assert "'out' of aten::sin.out" in refused.error and refused.path == ()


def test_a_packet_call_torch_sends_to_a_torchscript_only_overload_is_named() -> None:
    # torch picks aten::add.str for two strings: a TorchScript operator, not in the dispatcher
    with pytest.raises(ArgumentsMismatchError, match=r"No overload of aten::add accepts \(str"):
        resolve(torch.ops.aten.add, "x", "y")
