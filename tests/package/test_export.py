"""opmagic.export (opmagic/package/export.py) in a real session: what a Python-only session
exports, and bad input: a clear error naming the cause and the fix, and nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import opmagic
from opmagic import ArgumentTypeError, ExportError

from ..shell import Cells

CUSTOM_OP = """\
%%custom_op exp_t::double_it --check "torch.randn(3),"
def double_it(x: torch.Tensor) -> torch.Tensor:
    return x * 2

@fake
def _(x):
    return torch.empty_like(x)
"""


def test_without_a_session_there_is_nothing_to_export(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match=r"no opmagic session is running.*%load_ext opmagic"):
        opmagic.export(tmp_path / "pkg", "pkg")
    assert not (tmp_path / "pkg").exists()


def test_a_session_without_operators_has_nothing_to_export(cells: Cells, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="Nothing to export: no cell has operators in effect"):
        opmagic.export(tmp_path / "pkg", "pkg")
    assert not (tmp_path / "pkg").exists()


def test_a_python_session_exports_its_op_its_checks_and_what_it_left_out(
    cells: Cells, tmp_path: Path
) -> None:
    op_cell = cells.run(CUSTOM_OP).execution_count
    cells.fail("raise RuntimeError('a broken cell')")
    exported = opmagic.export(tmp_path / "pkg", "exp_pkg", version="1.2")
    assert [op.schema for op in exported.operators] == ["exp_t::double_it(Tensor x) -> Tensor"]
    assert exported.abi == "python" and exported.version == "1.2"
    assert [c.label for c in exported.cells] == [f"[{op_cell}]"]
    assert any("a broken cell" in c.reason for c in exported.left_out)
    assert dict(exported.tests) == {"opcheck": 1, "gradcheck": 0, "compare": 0, "compile": 1}
    assert set(exported.files) == {
        "README.md", "ops.json", "pyproject.toml", "exp_pkg/__init__.py", "exp_pkg/ops.py",
        "tests/samples.pt", "tests/test_ops.py",
    }
    ops = (tmp_path / "pkg" / "exp_pkg" / "ops.py").read_text()
    assert '@torch.library.custom_op("exp_t::double_it", mutates_args=())' in ops
    assert "double_it.register_fake(_double_it_fake)" in ops
    manifest = json.loads((tmp_path / "pkg" / "ops.json").read_text())
    assert manifest["operators"][0]["schema"] == "exp_t::double_it(Tensor x) -> Tensor"
    assert "exp_t::double_it(Tensor x) -> Tensor" in str(exported)
    assert "exp_t::double_it(Tensor x) -&gt; Tensor" in exported._repr_html_()
    again = opmagic.export(tmp_path / "pkg", "exp_pkg", overwrite=True)  # an earlier export
    assert again.files == exported.files


def test_a_directory_that_is_not_empty_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    with pytest.raises(ExportError, match="exists and is not empty: pass overwrite=True"):
        opmagic.export(tmp_path / "mine", "pkg")
    with pytest.raises(ExportError, match="is not an earlier export"):
        opmagic.export(tmp_path / "mine", "pkg", overwrite=True)
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(ExportError, match="is a file, not a directory"):
        opmagic.export(tmp_path / "file", "pkg")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("1pkg", "is not a Python identifier"),
        ("my-ops", "is not a Python identifier"),
        ("class", "is not a Python identifier"),
        ("torch", "would shadow the module torch"),
        ("Torch", "would shadow the module Torch"),
        ("sympy", "would shadow the module sympy"),
        ("os", "would shadow the module os"),
        ("pytest", "would shadow the module pytest"),
        ("opmagic", "would shadow the module opmagic"),
    ],
)
def test_a_name_that_is_no_identifier_or_shadows_a_needed_module_is_refused(
    tmp_path: Path, name: str, message: str
) -> None:
    with pytest.raises(ExportError, match=message):
        opmagic.export(tmp_path / "pkg", name)
    assert not (tmp_path / "pkg").exists()


@pytest.mark.parametrize(
    ("keywords", "error", "message"),
    [
        ({"version": "one"}, ExportError, "is not a version pip accepts"),
        ({"version": 1}, ArgumentTypeError, "version must be a str"),
        ({"cells": "3"}, ArgumentTypeError, "cells must be cell numbers"),
        ({"cells": [0]}, ArgumentTypeError, "cells must be cell numbers"),
        ({"overwrite": "yes"}, ArgumentTypeError, "overwrite must be True or False"),
    ],
)
def test_bad_keywords_are_refused(tmp_path: Path, keywords, error, message) -> None:
    with pytest.raises(error, match=message):
        opmagic.export(tmp_path / "pkg", "pkg", **keywords)
    assert not (tmp_path / "pkg").exists()


def test_cells_naming_no_cell_is_refused(cells: Cells, tmp_path: Path) -> None:
    cells.run(CUSTOM_OP.replace(' --check "torch.randn(3),"', ""))
    with pytest.raises(ExportError, match=r"cells= names cell \[987\], which is not a cell"):
        opmagic.export(tmp_path / "pkg", "pkg", cells=[987])
    assert not (tmp_path / "pkg").exists()


def test_two_cells_that_define_one_operator_are_refused(cells: Cells, tmp_path: Path) -> None:
    first = cells.run(
        'lib = torch.library.Library("exp_clash", "FRAGMENT")\n'
        'lib.define("f(Tensor x) -> Tensor")\n'
        'lib.define("g(Tensor x) -> Tensor")\n'
    ).execution_count
    second = cells.run(
        'lib2 = torch.library.Library("exp_clash", "FRAGMENT")\n'
        'lib2.define("f(Tensor x, int n) -> Tensor")\n'
    ).execution_count
    with pytest.raises(
        ExportError, match=rf"cells \[{first}\] and \[{second}\] both define def exp_clash::f"
    ):
        opmagic.export(tmp_path / "pkg", "pkg")
    assert not (tmp_path / "pkg").exists()
    only = opmagic.export(tmp_path / "pkg", "pkg", cells=[second])
    assert [op.name for op in only.operators] == ["exp_clash::f"]


TRITON_CELL = """%%triton_op exp_triton::add --check "torch.randn(100), torch.randn(100)"
import triton
import triton.language as tl
from torch.library import wrap_triton

@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + tl.load(y_ptr + offsets, mask=mask), mask=mask)

def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    wrap_triton(add_kernel)[(triton.cdiv(out.numel(), 64),)](x, y, out, out.numel(), BLOCK=64)
    return out
"""


def test_a_triton_op_cell_exports_as_triton_op_tested_where_a_gpu_is(cells: Cells, tmp_path):
    pytest.importorskip("triton")
    cells.run(TRITON_CELL)
    exported = opmagic.export(tmp_path / "pkg", "exp_triton_ops")
    ops = (tmp_path / "pkg" / "exp_triton_ops" / "ops.py").read_text()
    assert '@torch.library.triton_op("exp_triton::add", mutates_args=())\ndef add(' in ops
    assert "import triton.language as tl" in ops and "@triton.jit" in ops
    assert exported.operators[0].triton
    tests = (tmp_path / "pkg" / "tests" / "test_ops.py").read_text()
    assert "id='add.default-cell" in tests and "marks=[_TRITON_ON_GPU]" in tests
    assert any(r.startswith("triton") for r in (tmp_path / "pkg" / "pyproject.toml")
               .read_text().split('"')), "triton is a dependency"
