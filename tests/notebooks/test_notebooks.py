"""Every notebook in notebooks/ runs top to bottom in a fresh kernel, and is committed clean."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
QUICKSTART = ROOT / "notebooks" / "quickstart.ipynb"
_TIMEOUT_S = 300  # per cell: generous for a loaded 2-core CI machine


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Path], nbformat.NotebookNode]:
    """Run a notebook once (kernel python3, this checkout on PYTHONPATH) and keep the result."""
    done: dict[Path, nbformat.NotebookNode] = {}

    def run(path: Path) -> nbformat.NotebookNode:
        if path not in done:
            notebook = nbformat.read(path, as_version=4)
            pythonpath = [str(ROOT), os.environ.get("PYTHONPATH", "")]
            with pytest.MonkeyPatch.context() as patch:
                patch.setenv("PYTHONPATH", os.pathsep.join(filter(None, pythonpath)))
                NotebookClient(
                    notebook,
                    kernel_name="python3",
                    timeout=_TIMEOUT_S,
                    resources={"metadata": {"path": str(tmp_path_factory.mktemp(path.stem))}},
                ).execute()  # raises CellExecutionError, naming the cell, on any error
            done[path] = notebook
        return done[path]

    return run


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_without_outputs(path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, (
                f"{path.name} is committed with outputs; clear them "
                "(jupyter nbconvert --clear-output --inplace notebooks/*.ipynb)"
            )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_runs_in_a_fresh_kernel(path: Path, executed) -> None:
    notebook = executed(path)
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]


def test_quickstart_shows_diagrams_kernels_and_the_explorer(executed) -> None:
    notebook = executed(QUICKSTART)
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
    explorer = by_source["opmagic.explore(scale)"][0].data
    assert "application/vnd.jupyter.widget-view+json" in explorer
