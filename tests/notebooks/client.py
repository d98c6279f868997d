"""The notebook client of the notebook tests: it sends cells as JupyterLab sends them.

Imported when a notebook first runs: nbclient and nbformat take seconds to import (jsonschema
builds its format grammars), which a run that runs no notebook should not pay.
"""

from __future__ import annotations

from typing import Any

import nbformat
from jupyter_client import KernelClient
from nbclient import NotebookClient


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
