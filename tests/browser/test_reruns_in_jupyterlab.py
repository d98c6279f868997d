"""Cells run in JupyterLab as a user runs them (Shift+Enter, the cell's id sent along), in the
quickstart's kernel: a cell re-run after a failed run names the run it replaces, and
operators are named as the user calls them."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import RanNotebook

pytestmark = pytest.mark.slow

OP = (
    "%%custom_op lab_rerun::twice\ndef twice(x: torch.Tensor) -> torch.Tensor:\n    return {body}\n"
)


def test_after_a_failed_rerun_the_note_names_the_run_it_replaces(
    page: Any, quickstart: RanNotebook
) -> None:
    first = quickstart.run_cell(OP.format(body="x * 2"))
    index = first["index"]
    failed = quickstart.run_cell(OP.format(body="x * 2 +"), index)
    assert any(output.startswith("error: ") for output in failed["outputs"]), failed
    again = quickstart.run_cell(OP.format(body="x + x"), index)
    shown = "\n".join(again["outputs"])
    assert f"replaces the previous lab_rerun::twice from cell [{first['execution_count']}]" in (
        " ".join(shown.split())
    )
    assert f"from cell [{again['execution_count']}]" not in shown  # not itself


def test_operators_are_named_as_the_user_calls_them(page: Any, quickstart: RanNotebook) -> None:
    ran = quickstart.run_cell("%dispatch torch.add(torch.ones(2), 1)")
    (shown,) = ran["outputs"]
    assert "aten::add.Tensor" in shown and "CPU" in shown, shown
    ran = quickstart.run_cell("opmagic.resolve(torch.Tensor.mul, torch.ones(2), 3).path")
    (path,) = ran["outputs"]
    assert path.startswith("(") and "'CPU'" in path, ran
