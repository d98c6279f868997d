"""notebooks/stable_abi_tutorial.ipynb: PyTorch's custom C++ operator tutorial, both tabs, in a
fresh kernel: the stable-ABI cells register at their lines, an edited cell replaces the
library, a failing edit and a crashing cell leave the kernel and the previous version alone,
the classic tab replaces the stable one, and unloading removes everything."""

from __future__ import annotations

from typing import TYPE_CHECKING

import re

import pytest

from .outputs import cell_text

if TYPE_CHECKING:
    import nbformat

pytestmark = pytest.mark.slow  # runs a notebook in a kernel


@pytest.fixture(scope="module")
def executed(run_notebook) -> list[nbformat.NotebookNode]:
    """The notebook's code cells after a run in a fresh kernel."""
    return [c for c in run_notebook("stable_abi_tutorial").cells if c.cell_type == "code"]


def _library_cells(executed: list[nbformat.NotebookNode]) -> list[nbformat.NotebookNode]:
    return [c for c in executed if c.source.startswith("%%torch_library")]


def test_no_cell_fails(executed):
    assert not [o for c in executed for o in c.outputs if o.output_type == "error"]


def test_the_stable_cells_register_at_their_cell_lines(executed):
    first, edited, _classic = _library_cells(executed)
    number = first.execution_count
    text = cell_text(first)
    assert "precompiled stable headers" in text or "no precompiled headers" in text
    # the location beside the schema, or below it where the text is narrow
    schema = re.escape("extension_cpp::mymuladd(Tensor a, Tensor b, float c) -> Tensor")
    assert re.search(rf"{schema}\s+cell \[{number}\], line 32", text)
    assert f"cell [{number}], line 38" in text  # the CPU kernel: its block's line
    assert "extension_cpp::myadd_out(Tensor(a!) a" not in cell_text(edited)
    assert "extension_cpp::myadd_out(Tensor a, Tensor b, Tensor(a!) out) -> ()" in cell_text(edited)


def test_the_tests_of_the_tutorial_pass_on_both_tabs(executed):
    runs = [cell_text(c) for c in executed if c.source.strip().endswith("test_mymuladd()")]
    assert runs == ["'mymuladd, mymul and myadd_out pass'"] * 2


def test_a_failing_edit_shows_its_errors_once_and_keeps_the_previous_version(executed):
    cell = next(c for c in executed if c.source.startswith("edited = "))
    html = [o.data["text/html"] for o in cell.outputs if "text/html" in o.get("data", {})]
    assert len(html) == 1 and "2 errors" in html[0]
    assert "&#x27;offset&#x27; was not declared" in html[0]
    assert "&#x27;reslt&#x27; was not declared" in html[0]
    assert "tensor([" in cell_text(cell)  # mymul, from the version that compiled


def test_a_crashing_cell_is_refused_with_its_line_and_the_kernel_lives(executed):
    cell = next(c for c in executed if c.source.startswith("crashing = "))
    text = cell_text(cell)
    assert "crashed while registering its STABLE_TORCH_LIBRARY(crashing) block" in text
    assert "SIGSEGV" in text and "in name_length()" in text


def test_unloading_removes_every_operator(executed):
    assert "every operator of the notebook is gone" in cell_text(executed[-1])
