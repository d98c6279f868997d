"""Notebook execution shared by the notebook tests: each notebook runs once per test run."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from .lab_runs import RAN_IN_LAB

if TYPE_CHECKING:
    import nbformat

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
_TIMEOUT_S = 600  # per cell: a cold C++ build on a loaded 2-core CI machine


@pytest.fixture(scope="session")
def run_notebook(
    build_cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], nbformat.NotebookNode]:
    """``run_notebook("quickstart")``: the notebook after running every cell once.

    As JupyterLab's "Run All" left it when the browser tests ran it in this process
    (:data:`~.lab_runs.RAN_IN_LAB`); else run here, in kernel ``python3`` in a fresh process
    with this checkout on ``PYTHONPATH`` and the run's private build cache
    (``XDG_CACHE_HOME``), each cell sent with its id as JupyterLab sends it
    (:class:`JupyterLabClient`), raising ``CellExecutionError`` naming the cell on an error
    that the cell is not tagged to raise.
    """
    import nbformat

    done: dict[str, nbformat.NotebookNode] = {}

    def run(name: str) -> nbformat.NotebookNode:
        if name in RAN_IN_LAB:
            return nbformat.from_dict(RAN_IN_LAB[name])
        if name not in done:
            notebook = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
            execute(notebook, tmp_path_factory.mktemp(name))
            done[name] = notebook
        return done[name]

    return run


def execute(notebook: nbformat.NotebookNode, directory: Path) -> None:
    """Run every cell of ``notebook`` (in place) in a fresh ``python3`` kernel started in
    ``directory``, with this checkout on ``PYTHONPATH``, as JupyterLab sends the cells."""
    from .client import JupyterLabClient  # nbclient loads when a notebook runs

    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    JupyterLabClient(
        notebook,
        kernel_name="python3",
        timeout=_TIMEOUT_S,
        resources={"metadata": {"path": str(directory)}},
    ).execute(env={**os.environ, "PYTHONPATH": pythonpath})
