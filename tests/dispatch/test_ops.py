"""Operator spellings accepted everywhere, and the errors for the ones that are not."""

from __future__ import annotations

import pytest
import torch

from opmagic import NotAnOperatorError, UnknownOperatorError
from opmagic._torch import dispatcher
from opmagic.dispatch.ops import OpRef, is_operator_name, op_ref, overloads_of


@pytest.mark.parametrize(
    ("spelling", "expected"),
    [
        ("aten::add.Tensor", OpRef("aten", "add", "Tensor")),
        ("aten::add", OpRef("aten", "add", None)),
        ("aten.add.Tensor", OpRef("aten", "add", "Tensor")),
        ("torch.ops.aten.add.Tensor", OpRef("aten", "add", "Tensor")),
        ("aten::sin.default", OpRef("aten", "sin", "")),
        (" aten::mm ", OpRef("aten", "mm", None)),
        (torch.ops.aten.add.Tensor, OpRef("aten", "add", "Tensor")),
        (torch.ops.aten.add, OpRef("aten", "add", None)),
        (torch.ops.aten.sin.default, OpRef("aten", "sin", "")),
    ],
)
def test_spellings(spelling, expected):
    assert op_ref(spelling) == expected


def test_custom_op_def_names_its_overload():
    @torch.library.custom_op("opmagic_test_ops::twice", mutates_args=())
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    try:
        ref = op_ref(twice)
        assert ref == OpRef("opmagic_test_ops", "twice", "")
        assert ref.dispatcher_name == "opmagic_test_ops::twice"
        assert ref.op_overload() is torch.ops.opmagic_test_ops.twice.default
    finally:
        twice._lib._destroy()


def test_overloads_default_first():
    names = overloads_of(OpRef("aten", "sum", None))
    assert names[0] == "" and "dim_IntList" in names


def test_unknown_op_suggests_close_matches():
    with pytest.raises(UnknownOperatorError, match=r"Did you mean: .*aten::add"):
        op_ref("aten::addd")


def test_unknown_namespace_says_so():
    with pytest.raises(UnknownOperatorError, match="No operator is registered in namespace 'nope'"):
        op_ref("nope::thing")


def test_unknown_overload_lists_the_real_ones():
    with pytest.raises(
        UnknownOperatorError,
        match=r"no overload 'Tensr'.*Did you mean 'Tensor'.*Scalar, Scalar_out, Tensor, out",
    ):
        op_ref("aten::add.Tensr")


@pytest.mark.parametrize("text", ["add", "a.b.c.d", "", "aten::1bad", "aten::add.ov-er"])
def test_strings_that_are_not_op_names(text):
    with pytest.raises(UnknownOperatorError, match=r"not an operator name|Unknown operator"):
        op_ref(text)


def test_python_function_is_not_an_operator_and_the_message_says_what_to_pass():
    def my_function(x):
        return x

    with pytest.raises(NotAnOperatorError, match=r"'my_function'.*\(torch\.add, torch\.Tensor"):
        op_ref(my_function)


def test_other_objects_are_not_operators():
    with pytest.raises(NotAnOperatorError, match="Expected an operator"):
        op_ref(42)


def test_index_sees_ops_defined_after_first_lookup():
    op_ref("aten::add")  # builds the index
    lib = torch.library.Library("opmagic_test_late", "DEF")
    try:
        lib.define("fresh(Tensor x) -> Tensor")
        assert op_ref("opmagic_test_late::fresh") == OpRef("opmagic_test_late", "fresh", None)
    finally:
        lib._destroy()
    with pytest.raises(UnknownOperatorError):
        op_ref("opmagic_test_late::fresh")


def test_index_sees_overloads_added_after_first_lookup():
    lib = torch.library.Library("opmagic_test_grow", "DEF")
    try:
        lib.define("op(Tensor x) -> Tensor")
        assert overloads_of(op_ref("opmagic_test_grow::op")) == [""]
        lib.define("op.twice(Tensor x, int n) -> Tensor")
        assert op_ref("opmagic_test_grow::op.twice").overload == "twice"
        assert overloads_of(OpRef("opmagic_test_grow", "op", None)) == ["", "twice"]
    finally:
        lib._destroy()


def test_a_lookup_asks_for_its_operator_alone(monkeypatch):
    """Looking up one operator, known or new, never lists all ~3,600: only errors and
    searches need every name."""
    lib = torch.library.Library("opmagic_test_alone", "DEF")
    listed = []
    monkeypatch.setattr(
        dispatcher, "all_op_names", lambda real=dispatcher.all_op_names: listed.append(1) or real()
    )
    try:
        lib.define("fresh(Tensor x) -> Tensor")
        for spelling in ("opmagic_test_alone::fresh", "aten::add", "aten::add.Tensor", "aten::sin"):
            op_ref(spelling)
        assert overloads_of(OpRef("opmagic_test_alone", "never_defined", None)) == []
        assert listed == []
        with pytest.raises(UnknownOperatorError, match="Did you mean"):
            op_ref("opmagic_test_alone::fres")
        assert listed  # the suggestion needs every name
    finally:
        lib._destroy()


def test_torchscript_only_overloads_are_not_operators():
    assert "int" not in overloads_of(OpRef("aten", "add", None))  # TorchScript's aten::add.int
    with pytest.raises(UnknownOperatorError, match="no overload 'int'"):
        op_ref("aten::add.int")
    with pytest.raises(UnknownOperatorError, match="Unknown operator 'aten::len'"):
        op_ref("aten::len")  # a TorchScript builtin the dispatcher does not have


def test_kernels_without_a_definition_are_found_or_named():
    lib = torch.library.Library("opmagic_test_undefined", "FRAGMENT")
    try:
        lib.impl("opmagic_test_undefined::plain", lambda x: x, "CPU")
        lib.impl("opmagic_test_undefined::named.special", lambda x: x, "CPU")
        assert overloads_of(op_ref("opmagic_test_undefined::plain")) == [""]
        assert op_ref("opmagic_test_undefined::named.special").overload == "special"
        with pytest.raises(
            UnknownOperatorError,
            match=r"no definition, only kernels registered for "
            r"'opmagic_test_undefined::named\.special'",
        ):
            op_ref("opmagic_test_undefined::named")
    finally:
        lib._destroy()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("aten::add", True),
        ("aten::add.Tensor", True),
        ("my_lib::op_2.out", True),
        ("aten::add.", False),
        ("aten:add", False),
        ("2lib::op", False),
        ("lib::op.over.load", False),
        ("torch.add", False),
        ("", False),
    ],
)
def test_operator_names_follow_the_one_identifier_grammar(text: str, expected: bool) -> None:
    assert is_operator_name(text) is expected
