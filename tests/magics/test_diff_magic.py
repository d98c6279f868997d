"""``%%diff`` in a real IPython shell, the diff of ``%load_ext opmagic`` (empty), and the diff of
C++ cells (classic and stable ABI) and of ``%unload_ext`` against the brute-force comparison
of every operator's dump."""

from __future__ import annotations

import warnings

import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import ExecutionResult
from IPython.utils.capture import capture_output

import opmagic
from opmagic.dispatch.diff import DispatchDiff

from ..dispatch.test_diff import exact_diff, one
from ..native.sources import op_source, stable_op_source

OVERRIDE = (
    "lib = torch.library.Library('aten', 'IMPL')\n"
    "def my_sin(x):\n"
    "    return x * 0\n"
    "lib.impl('sin', my_sin, 'CPU')"
)


def run_override(cells, source: str) -> ExecutionResult:
    """Run a cell that overrides an aten kernel (torch warns about it: not this test's point)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cells.shell.run_cell(source, store_history=True)


def test_the_diff_of_load_ext_opmagic_is_empty(ipython):
    ipython.run_line_magic("unload_ext", "opmagic")  # as a fresh shell has it
    with opmagic.diff() as found:
        ipython.run_line_magic("load_ext", "opmagic")
    ipython.run_line_magic("unload_ext", "opmagic")
    assert len(found) == 0, str(found)


def test_a_cell_shows_what_it_changed_at_its_own_lines(cells):
    with capture_output() as shown:
        run_override(cells, f"%%diff -o d\n{OVERRIDE}")
    found = cells.ns["d"]
    assert isinstance(found, DispatchDiff)
    override = one(found, "aten::sin", "CPU")
    assert override.change == "replaced" and override.overrides_aten
    assert override.site.startswith("cell [") and override.site.endswith(", line 5")
    assert "aten overrides (they change what every model runs):" in shown.stdout
    assert "aten::sin" in shown.stdout
    cells.run("lib._destroy()")


def test_a_failing_cell_shows_the_diff_then_its_own_error(cells):
    with capture_output() as shown:
        result = run_override(
            cells, f"%%diff -o d\n{OVERRIDE}\nraise ValueError('after the override')"
        )
    assert isinstance(result.error_in_exec, ValueError)
    (displayed,) = shown.outputs  # the diff, displayed before the error
    assert "aten::sin" in displayed.data["text/plain"]
    assert cells.ns["d"].aten_overrides
    # the session rolled the failed cell back: torch's kernel serves aten::sin again
    assert "RegisterCPU" in torch._C._dispatch_dump_table("aten::sin").split("\nCPU: ")[1]


def test_a_bad_variable_name_is_a_usage_error(cells):
    error = cells.fail("%%diff -o 1x\npass")
    assert isinstance(error, UsageError) and "-o needs a variable name" in str(error)


@pytest.mark.slow
@pytest.mark.parametrize(
    "source", [op_source("dfcell"), stable_op_source("dfstable")], ids=["classic", "stable"]
)
def test_cpp_cells_and_unload_ext_match_the_dumps(cells, source):
    namespace = "dfcell" if "TORCH_LIBRARY(dfcell" in source else "dfstable"
    with exact_diff() as box, capture_output():
        cells.run(f"%%torch_library\n{source}")
    (found,) = box
    (definition,) = found.operators
    assert definition.op.startswith(f"{namespace}::") and definition.change == "added"
    assert definition.site.startswith("cell [")  # the cell's line, not the cached .cpp
    kernel = one(found, definition.op, "CPU")
    assert kernel.kind == "C++" and kernel.site.startswith("cell [")
    with exact_diff() as box:
        cells.shell.run_line_magic("unload_ext", "opmagic")
    assert {(c.op, c.change) for c in box[0].operators} == {(definition.op, "removed")}
    assert one(box[0], definition.op, "CPU").change == "removed"
