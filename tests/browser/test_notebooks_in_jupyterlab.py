"""Every notebook in notebooks/, run with "Run All" in JupyterLab in a fresh kernel, as a new
user runs it: every cell runs, and no cell shows an error output but those tagged
``raises-exception``, at 1280x900 and at 1024x768 with the file browser open. A failing C++
cell shows its error once. Each output with a table, a diagram or a picture is saved as a
screenshot at 1024x768 (build/browser/<notebook>-<cell>-<output>.png); what overflows
592 px is listed in build/browser/<notebook>-overflow.json.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from .conftest import ARTIFACTS, NOTEBOOKS, SIZES, CodeCell, RanNotebook, run_all, set_size

pytestmark = pytest.mark.slow
BUILDING_MAGICS = ("%%torch_library", "%%cuda_kernel")  # cells whose failure is a build's

# every output of the notebook in the main area: its cell, its place, how wide it is drawn
_OUTPUTS = """() => {
  const panel = window.jupyterapp.shell.currentWidget;
  const code = panel.content.widgets.filter(cell => cell.model.type === 'code');
  return code.flatMap((cell, index) => [...cell.node.querySelectorAll('.jp-OutputArea-output')]
    .map((output, place) => ({
      cell: index, place,
      text: output.innerText.slice(0, 80),
      width: output.scrollWidth, shown: output.clientWidth,
      drawn: !!output.querySelector('svg, table, img'),
    })));
}"""


def _outputs(page: Any) -> list[dict[str, Any]]:
    """The outputs of the notebook in the main area, with their widths."""
    return page.evaluate(_OUTPUTS)


@pytest.mark.parametrize("name", [path.stem for path in NOTEBOOKS])
def test_run_all_runs_every_cell_and_shows_no_error_but_the_tagged_ones(
    name: str, page: Any, request: pytest.FixtureRequest
) -> None:
    set_size(page, SIZES[0])
    notebook: RanNotebook = (
        request.getfixturevalue("quickstart") if name == "quickstart" else run_all(page, name)
    )
    try:
        cells = notebook.cells()
        stopped = [cell for cell in cells if cell.execution_count is None]
        assert not stopped, (
            f"Run All of {name} stopped before code cell {stopped[0].index}: "
            f"{[cell.errors for cell in cells if cell.errors]}"
        )
        unexpected = [
            (cell.index, cell.source.splitlines()[0], cell.errors)
            for cell in cells
            if cell.errors and "raises-exception" not in cell.tags
        ]
        assert not unexpected, f"{name}: error outputs in cells not tagged raises-exception"
        for cell in cells:
            if "raises-exception" in cell.tags and cell.source.startswith(BUILDING_MAGICS):
                _assert_shown_once(page, name, cell)
        for size in SIZES:
            set_size(page, size)
            notebook.activate()
            assert page.locator(".jp-OutputArea-output", has_text="Traceback").count() == 0
        _save_views(page, name)
    except Exception:
        page.screenshot(path=str(ARTIFACTS / f"{name}-failure.png"))
        raise
    finally:
        if name != "quickstart":
            notebook.close()


def _assert_shown_once(page: Any, name: str, cell: CodeCell) -> None:
    """A C++ cell that fails to build shows its error in one block: the formatted error in
    place of the build's progress, no red ``error`` output repeating it."""
    shown = (
        page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell")
        .nth(cell.index)
        .locator(".jp-OutputArea")
    )
    shown.scroll_into_view_if_needed()
    shown.screenshot(path=str(ARTIFACTS / f"{name}-{cell.index}-build-error.png"))
    assert cell.outputs == ("display_data",), (name, cell.index, cell.outputs)
    assert shown.locator(".jp-OutputArea-child").count() == 1
    assert shown.locator('[data-mime-type="application/vnd.jupyter.stderr"]').count() == 0
    assert re.search(r"cell \[\d+\], line \d+: ", shown.inner_text())  # at the cell's line


def _save_views(page: Any, name: str) -> None:
    """Screenshots of the outputs that draw (tables, diagrams, pictures) at the window's
    size, and the list of outputs wider than their pane."""
    outputs = _outputs(page)
    wide = [o for o in outputs if o["width"] > o["shown"] + 1]
    (ARTIFACTS / f"{name}-overflow.json").write_text(json.dumps(wide, indent=1))
    panel = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
    cells = panel.locator(".jp-CodeCell")
    for output in outputs:
        if output["drawn"]:
            shown = cells.nth(output["cell"]).locator(".jp-OutputArea-output").nth(output["place"])
            shown.scroll_into_view_if_needed()
            shown.screenshot(path=str(ARTIFACTS / f"{name}-{output['cell']}-{output['place']}.png"))
