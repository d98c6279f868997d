"""notebooks/export.ipynb in a fresh kernel (cells sent with their ids, as JupyterLab does): a
stable-ABI C++ op with a Python fake and autograd and a %%custom_op, checked, exported with
%export_ops and verified: an abi3 wheel installed where opmagic is not importable, its symbols
the stable C shim's, the tests generated from the checks passing there."""

from __future__ import annotations

import nbformat
import pytest

from .outputs import cell_text


@pytest.fixture(scope="module")
def executed(run_notebook) -> list[nbformat.NotebookNode]:
    """The notebook's code cells after a run in a fresh kernel."""
    return [c for c in run_notebook("export").cells if c.cell_type == "code"]


def _cell(executed: list[nbformat.NotebookNode], start: str) -> nbformat.NotebookNode:
    return next(c for c in executed if c.source.startswith(start))


def _words(cell: nbformat.NotebookNode) -> str:
    """The cell's text output, whole words: text views wrap at the kernel's terminal width."""
    return " ".join(cell_text(cell).split())


@pytest.mark.slow
def test_no_cell_fails(executed):
    assert not [o for c in executed for o in c.outputs if o.output_type == "error"]


@pytest.mark.slow
def test_the_export_lists_the_operators_cells_and_what_it_left_out(executed):
    text = _words(_cell(executed, "package = %export_ops"))
    assert "exported muladd_ops 0.1.0" in text and "stable ABI: an abi3 wheel" in text
    for schema in (
        "extension_cpp::mymuladd(Tensor a, Tensor b, float c) -> Tensor",
        "extension_cpp::mymul(Tensor a, Tensor b) -> Tensor",
        "mylib::numpy_sin(Tensor x) -> Tensor",
    ):
        assert schema in text
    assert "it ran before the opmagic session started" in text
    assert "it registered nothing; its checks are tests of the package" in text
    ops = cell_text(_cell(executed, "print((package.directory"))
    assert '@torch.library.register_fake("extension_cpp::mymuladd")' in ops
    assert '@torch.library.custom_op("mylib::numpy_sin", mutates_args=())' in ops
    assert "numpy_sin.register_autograd(_numpy_sin_backward" in ops
    assert "import numpy as np" in ops and "%load_ext" not in ops
    setup = cell_text(_cell(executed, 'print((package.directory / "setup.py")'))
    assert "py_limited_api=True" in setup and '"py_limited_api": "cp310"' in setup


@pytest.mark.slow
def test_the_package_is_verified_as_an_abi3_wheel_without_opmagic(executed):
    cell = _cell(executed, "%export_ops muladd_package --name muladd_ops --overwrite --verify")
    text = _words(cell)
    assert "muladd_ops: verified: 6 steps passed" in text, text
    assert "muladd_ops-0.1.0-cp310-abi3-linux_x86_64.whl" in text
    assert "import opmagic fails; import muladd_ops works (loaded: _C)" in text
    assert "_C.abi3.so: every torch symbol it uses is the stable C shim's" in text
    assert "8 passed" in text  # opcheck x2, gradcheck, compare x2, compile x2, schemas
    html = [o.data["text/html"] for o in cell.outputs if "text/html" in o.get("data", {})]
    assert any("verified: 6 steps passed" in h for h in html)
