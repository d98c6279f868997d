"""Every notebook in notebooks/ runs top to bottom in a fresh kernel, and is committed clean."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_without_outputs(path: Path) -> None:
    notebook = json.loads(path.read_text())  # the file as committed (nbformat 4)
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None, (
                f"{path.name} is committed with outputs; clear them "
                "(jupyter nbconvert --clear-output --inplace notebooks/*.ipynb)"
            )


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_runs_in_a_fresh_kernel(path: Path, run_notebook) -> None:
    """No cell fails but those tagged to (their own tests check what they show)."""
    notebook = run_notebook(path.stem)
    outputs = [
        output
        for cell in notebook.cells
        if cell.cell_type == "code" and "raises-exception" not in cell.metadata.get("tags", [])
        for output in cell.outputs
    ]
    assert not [o for o in outputs if o.output_type == "error"]


@pytest.mark.slow
def test_quickstart_shows_diagrams_kernels_and_the_explorer(run_notebook) -> None:
    notebook = run_notebook("quickstart")
    by_source = {cell.source: cell.outputs for cell in notebook.cells if cell.cell_type == "code"}
    svgs = [
        o.data["image/svg+xml"]
        for outputs in by_source.values()
        for o in outputs
        if "image/svg+xml" in o.get("data", {})
    ]
    assert len(svgs) >= 6  # the table and five traced calls
    assert any("dispatch fails" in svg for svg in svgs)
    kernels = by_source["%kernels quickstart"][0].data
    assert "quickstart::scale" in kernels["text/html"]
    # the placeholder shown while the explorer opens is emptied; the widget is the cell's value
    *placeholder, explorer = by_source["opmagic.explore(scale)"]
    assert all(not output.get("data") for output in placeholder)
    assert "application/vnd.jupyter.widget-view+json" in explorer.data
