"""How a cell's results and the session listing look."""

from __future__ import annotations

import re

from opmagic.cells.session import CellReport, SessionReport
from opmagic.view.cells import SESSION_CELLS


def _report(cells: int) -> SessionReport:
    """A listing of ``cells`` cells, each with an operator, the last one with a note."""
    return SessionReport(
        tuple(
            CellReport(
                f"[{number}]",
                f"key{number}",
                ((f"mylib::op{number}: def, CPU kernel", f"cell [{number}], line 2"),),
                ("replaced cell [1]'s CPU kernel for mylib::op1",) if number == cells else (),
            )
            for number in range(1, cells + 1)
        )
    )


def test_a_long_session_listing_is_one_table_that_folds_after_its_first_cells() -> None:
    """One row per registration under its cell's label, no heading per cell (the listing
    of a 60-cell notebook was 6,598 px tall); the cells after the first few fold away."""
    html = _report(20)._repr_html_()
    assert "opmagic session</b>: 20 cells hold 20 registrations" in html
    shown, folded = html.split("<details>")
    assert len(re.findall(r"<td>cell\u00a0\[\d+\]</td>", shown)) == SESSION_CELLS
    assert f"<summary>{20 - SESSION_CELLS} more cells (cells [9] to [20])</summary>" in folded
    assert '<td colspan="2" class="dim">note: replaced cell [1]' in folded
    assert shown.count("<th>cell</th>") == 1
    assert "<details>" not in _report(SESSION_CELLS)._repr_html_()


def test_an_empty_session_says_so_in_a_sentence() -> None:
    assert "No cell has registered anything yet." in SessionReport(())._repr_html_()
    assert str(SessionReport(())) == "opmagic session: no cell has registered anything yet"
