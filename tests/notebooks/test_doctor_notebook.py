"""``notebooks/doctor.ipynb``: one op broken three ways, diagnosed when its cell runs, fixed
cell by cell (each run sent with its cell id, as JupyterLab sends it) until the ladder is green."""

from __future__ import annotations

import nbformat
import pytest


@pytest.fixture(scope="module")
def cells(run_notebook) -> list[nbformat.NotebookNode]:
    """The notebook's code cells after running every cell in a fresh kernel."""
    notebook = run_notebook("doctor")
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def _diagnosis(cell: nbformat.NotebookNode) -> tuple[str, str]:
    """The text and HTML of the diagnosis a cell displayed."""
    (shown,) = [
        o.data
        for o in cell.outputs
        if o.get("data", {}).get("text/plain", "").startswith("doctor demo::scaled_add")
    ]
    return shown["text/plain"], shown["text/html"]


def test_each_fix_removes_one_root_cause_until_the_ladder_is_green(cells) -> None:
    runs = [cell for cell in cells if cell.source.startswith("%%custom_op demo::scaled_add")]
    headlines = [" ".join(_diagnosis(cell)[0].split()) for cell in runs]  # wrapped at 80
    assert headlines[0].startswith(
        "doctor demo::scaled_add: 3 findings: mutation-undeclared, no-fake, backward-arity"
    )
    assert headlines[1].startswith("doctor demo::scaled_add: 2 findings: no-fake, backward-arity")
    assert headlines[2].startswith("doctor demo::scaled_add: 1 finding: backward-arity")
    assert headlines[3].startswith("doctor demo::scaled_add: healthy")
    first, html = _diagnosis(runs[0])
    assert "--mutates-args y" in first  # the fix in the cell's own words
    assert "return grad_x, grad_y, None" in first
    assert "site: cell [" in first
    assert '<pre style="background:#e8f5e9' in html  # the fix, highlighted
    shown = [o.get("data", {}).get("text/plain", "") for o in runs[0].outputs]
    assert any(t.startswith("doctor: ") and " rungs in " in t for t in shown)  # its progress
    green, _ = _diagnosis(runs[3])
    assert "✓ torch.compile aot_eager" in green


def test_the_diagnosis_is_a_value_with_a_frame(cells) -> None:
    (last,) = [cell for cell in cells if cell.source.startswith("x, y = torch.randn(8, 3)")]
    printed = "".join(o.get("text", "") for o in last.outputs if o.output_type == "stream")
    assert printed.startswith("True []")
    (frame,) = [o.data for o in last.outputs if o.output_type == "execute_result"]
    assert "make_fx" in frame["text/html"] and "seconds" in frame["text/html"]

