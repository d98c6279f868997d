"""Stable-ABI sources (``STABLE_TORCH_LIBRARY*``) through the recorded registration path, with
the real compiler and the real dispatcher: stable headers only, re-runs replace, errors keep
the previous version, closing removes everything."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from opmagic._torch import dispatcher
from opmagic.errors import CompileError, RegistrationError
from opmagic.native import compile_library

from .sources import MINIMAL_INCLUDES, STABLE_INCLUDES, stable_op_source

pytestmark = pytest.mark.slow  # compiles C++


def test_a_stable_source_is_compiled_against_stable_headers_only(loaded):
    library = compile_library(stable_op_source("st_headers"), progress=None)
    loaded.append(library)
    assert library.build.header_set == "stable"
    prefix = next(c for c in library.build.commands if " -include " in c).split(" -include ")[1]
    text = Path(prefix.split()[0]).read_text()
    assert "#include <torch/csrc/stable/library.h>" in text
    assert "torch/library.h" not in text and "ATen/" not in text  # no classic header
    assert [str(b) for b in library.blocks] == [
        "STABLE_TORCH_LIBRARY(st_headers)",
        "STABLE_TORCH_LIBRARY_IMPL(st_headers, CPU)",
    ]


def test_a_stable_library_registers_at_its_lines_and_closing_removes_it(build_cache):
    library = compile_library(
        stable_op_source("st_close"), label="cell [4]", first_line=2, progress=None
    )
    assert [(op.schema, library.where(op.line)) for op in library.operators] == [
        ("st_close::fill(Tensor x) -> Tensor", "cell [4], line 8")
    ]
    assert [(k.key, library.where(k.line)) for k in library.kernels] == [
        ("CPU", "cell [4], line 11")
    ]
    assert torch.ops.st_close.fill(torch.ones(2)).tolist() == [2.0, 2.0]
    library.close()
    assert not any(n.startswith("st_close::") for n in dispatcher.all_op_names())


def test_editing_and_changing_the_schema_replace_the_previous_version(loaded):
    first = compile_library(stable_op_source("st_edit"), progress=None)
    edited = compile_library(
        stable_op_source("st_edit").replace("2.0", "5.0"), replace=first, progress=None
    )
    assert first.closed and torch.ops.st_edit.fill(torch.ones(1)).item() == 5.0
    wider = compile_library(
        stable_op_source(
            "st_edit",
            schema="fill(Tensor x, float value) -> Tensor",
            kernel="torch::stable::Tensor fill(const torch::stable::Tensor& x, double value) {\n"
            "  return torch::stable::fill_(torch::stable::empty_like(x), value);\n"
            "}",
        ),
        replace=edited,
        progress=None,
    )
    loaded.append(wider)
    assert dispatcher.find_schema("st_edit::fill", "") is not None
    assert str(dispatcher.find_schema("st_edit::fill", "")) == (
        "st_edit::fill(Tensor x, float value) -> Tensor"
    )
    assert torch.ops.st_edit.fill(torch.ones(1), 7.0).item() == 7.0


def test_a_failing_rerun_keeps_the_previous_version(loaded):
    good = compile_library(
        stable_op_source("st_fail"), label="cell [2]", first_line=2, progress=None
    )
    loaded.append(good)
    with pytest.raises(CompileError, match=r"compile error at cell \[2\], line 6:"):
        compile_library(
            stable_op_source("st_fail").replace("2.0);", "2.0)"),
            replace=good,
            label="cell [2]",
            first_line=2,
            progress=None,
        )
    # torch refuses the second definition: the block's line, and the good version is back
    duplicate = stable_op_source("st_fail").replace(
        '  m.def("fill(Tensor x) -> Tensor");',
        '  m.def("fill(Tensor x) -> Tensor");\n  m.def("fill(Tensor x) -> Tensor");',
    )
    with pytest.raises(RegistrationError) as caught:
        compile_library(duplicate, replace=good, label="cell [2]", first_line=2, progress=None)
    assert str(caught.value).startswith("cell [2], line 8: Tried to register an operator")
    assert "The previous version (cell [2]) is registered again." in str(caught.value)
    assert not good.closed and torch.ops.st_fail.fill(torch.ones(1)).item() == 2.0


def test_a_stable_fragment_is_rerun_without_a_duplicate(loaded):
    source = (
        STABLE_INCLUDES
        + 'STABLE_TORCH_LIBRARY_FRAGMENT(st_frag, m) {\n  m.def("g(Tensor x) -> Tensor");\n}\n'
    )
    first = compile_library(source, progress=None)
    again = compile_library(
        source.replace("g(Tensor x)", "g(Tensor y)"), replace=first, progress=None
    )
    loaded.append(again)
    assert str(dispatcher.find_schema("st_frag::g", "")) == "st_frag::g(Tensor y) -> Tensor"


def test_a_mixed_source_registers_classic_and_stable_blocks(loaded):
    source = (
        MINIMAL_INCLUDES
        + STABLE_INCLUDES
        + "at::Tensor twice(const at::Tensor& x) { return x.mul(2); }\n"
        "torch::stable::Tensor same(const torch::stable::Tensor& x) {\n"
        "  return torch::stable::clone(x);\n"
        "}\n"
        "TORCH_LIBRARY(st_mixed, m) {\n"
        '  m.def("twice(Tensor x) -> Tensor");\n'
        '  m.def("same(Tensor x) -> Tensor");\n'
        "}\n"
        'TORCH_LIBRARY_IMPL(st_mixed, CPU, m) { m.impl("twice", twice); }\n'
        'STABLE_TORCH_LIBRARY_IMPL(st_mixed, CPU, m) { m.impl("same", TORCH_BOX(&same)); }\n'
    )
    library = compile_library(source, progress=None)
    loaded.append(library)
    assert torch.ops.st_mixed.twice(torch.ones(1)).item() == 2.0
    assert torch.ops.st_mixed.same(torch.ones(1)).item() == 1.0
    assert {k.op for k in library.kernels} == {"st_mixed::twice", "st_mixed::same"}
