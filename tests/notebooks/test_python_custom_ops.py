"""``notebooks/python_custom_ops.ipynb`` runs top to bottom in a real Jupyter kernel."""

from __future__ import annotations

from typing import TYPE_CHECKING

import re

import pytest

if TYPE_CHECKING:
    import nbformat

pytestmark = pytest.mark.slow  # runs a notebook in a kernel


@pytest.fixture(scope="module")
def executed(run_notebook) -> nbformat.NotebookNode:
    """The notebook after running every cell in a fresh kernel."""
    return run_notebook("python_custom_ops")


def test_every_example_runs_twice_as_a_magic_and_as_a_plain_cell(
    executed: nbformat.NotebookNode,
) -> None:
    code = [cell for cell in executed.cells if cell.cell_type == "code"]
    failed = [
        cell.source.splitlines()[0]
        for cell in code
        for output in cell.outputs
        if output.output_type == "error" or "Error" in output.get("text", "")
    ]
    assert failed == ["%%custom_op mylib::numpy_sin"]  # the cell meant to fail
    magic = [cell.source.splitlines()[0] for cell in code if cell.source.startswith("%%custom_op")]
    for name in ("numpy_sin", "numpy_sin_cpu", "numpy_sin_inplace", "bar", "custom_linear",
                 "custom_nonzero", "numpy_cube", "numpy_mul"):
        runs = [line for line in magic if line.split()[1] == f"mylib::{name}"]
        assert len(runs) >= 2, name  # run, then run again with an edited body


def test_summaries_name_the_cell_lines(executed: nbformat.NotebookNode) -> None:
    first = next(c for c in executed.cells if c.source.startswith("%%custom_op mylib::numpy_sin"))
    text = first.outputs[0]["data"]["text/plain"]
    assert text.startswith("mylib::numpy_sin(Tensor x) -> Tensor")
    assert re.search(rf"numpy_sin · cell \[{first.execution_count}\], line 2", text)
    failed = next(c for c in executed.cells if "raises-exception" in c.metadata.get("tags", []))
    (error,) = failed.outputs  # its own class and one message, without a traceback
    assert error.output_type == "error" and error.ename == "CellSourceError"
    # errors wrap at the terminal's width (the kernel's COLUMNS): read them whole-word
    assert " ".join("\n".join(error.traceback).split()).startswith(
        f"CellSourceError: %%custom_op: cell [{failed.execution_count}], line 5: "
        "NameError: name 'undefined_device' is not defined"
    )
