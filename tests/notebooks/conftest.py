"""Notebook execution shared by the notebook tests: each notebook runs once per test run."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nbformat
import pytest
from jupyter_client import KernelClient
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
_TIMEOUT_S = 600  # per cell: a cold C++ build on a loaded 2-core CI machine


class JupyterLabClient(NotebookClient):
    """Runs a notebook's cells as JupyterLab 4 sends them: the metadata of each
    execute_request holds the cell's own metadata, ``deletedCells``, ``recordTiming`` and the
    cell's id as ``cellId`` (``CodeCell.execute``), which ipykernel hands to IPython as
    ``run_cell(..., cell_id=...)``. nbclient's own requests carry no metadata, so the kernel
    would see every cell as a terminal's (opmagic's hot reload tells cells apart by their id).
    """

    def __init__(self, notebook: nbformat.NotebookNode, **options: Any) -> None:
        super().__init__(notebook, **options)
        self.cell_metadata: dict[str, Any] = {}  # what the running cell's request carries

    async def async_execute_cell(
        self,
        cell: nbformat.NotebookNode,
        cell_index: int,
        execution_count: int | None = None,
        store_history: bool = True,
    ) -> nbformat.NotebookNode:
        """Run one cell, its id in the request's metadata."""
        self.cell_metadata = {
            **cell.metadata,
            "deletedCells": [],
            "recordTiming": False,
            "cellId": cell.id,
        }
        return await super().async_execute_cell(cell, cell_index, execution_count, store_history)

    async def async_start_new_kernel_client(self) -> KernelClient:
        """The kernel client, its execute requests sent with the running cell's metadata."""
        client = await super().async_start_new_kernel_client()
        send = client.shell_channel.send

        def send_as_jupyterlab(message: dict[str, Any]) -> None:
            if message["header"]["msg_type"] == "execute_request":
                message["metadata"].update(self.cell_metadata)
            send(message)

        client.shell_channel.send = send_as_jupyterlab
        return client


@pytest.fixture(scope="session")
def run_notebook(
    build_cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], nbformat.NotebookNode]:
    """``run_notebook("quickstart")``: the notebook after running every cell once.

    Kernel ``python3`` in a fresh process with this checkout on ``PYTHONPATH`` and the run's
    private build cache (``XDG_CACHE_HOME``), each cell sent with its id as JupyterLab sends
    it (:class:`JupyterLabClient`); raises ``CellExecutionError`` naming the cell
    on an error that the cell is not tagged to raise.
    """
    done: dict[str, nbformat.NotebookNode] = {}

    def run(name: str) -> nbformat.NotebookNode:
        if name not in done:
            notebook = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
            execute(notebook, tmp_path_factory.mktemp(name))
            done[name] = notebook
        return done[name]

    return run


def execute(notebook: nbformat.NotebookNode, directory: Path) -> None:
    """Run every cell of ``notebook`` (in place) in a fresh ``python3`` kernel started in
    ``directory``, with this checkout on ``PYTHONPATH``, as JupyterLab sends the cells."""
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    JupyterLabClient(
        notebook,
        kernel_name="python3",
        timeout=_TIMEOUT_S,
        resources={"metadata": {"path": str(directory)}},
    ).execute(env={**os.environ, "PYTHONPATH": pythonpath})
