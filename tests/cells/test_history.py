"""The session's history (opmagic/cells/history.py): what each cell ran, which of its statements
registered, the checks run in it, and what became of failed and re-run cells; in a real
IPython shell, the cells sent as JupyterLab sends them (with cell ids) or as a terminal does."""

from __future__ import annotations

import pytest
import torch

from opmagic import active_session
from opmagic.cells.history import CheckSample, UnkeptValue, kept_sample

from ..shell import Cells


def _entry(label: str):
    return next(e for e in active_session().history() if e.label == label)


def _label(result) -> str:
    return f"[{result.execution_count}]"


PLAIN_CELL = """\
lib = torch.library.Library("hist_plain", "DEF")
lib.define("twice(Tensor x) -> Tensor")
def twice_impl(x):
    return x * 2
def register():
    lib.impl("twice", twice_impl, "CompositeExplicitAutograd")
register()
print(torch.ops.hist_plain.twice(torch.ones(2)))
"""


def test_a_plain_cell_keeps_its_code_and_the_statements_that_registered(cells: Cells) -> None:
    label = _label(cells.run(PLAIN_CELL))
    entry = _entry(label)
    assert entry.state == "in effect"
    assert [s.kind for s in entry.sources] == ["python"]
    assert entry.sources[0].text == PLAIN_CELL
    # the Library claim, the define, and register(): the call that registered, not its body
    assert {2, 7} <= set(entry.statement_lines)
    assert 6 not in entry.statement_lines and 8 not in entry.statement_lines
    assert ("def", "hist_plain::twice") in entry.defines


def test_ipython_syntax_is_kept_as_ipython_compiles_it(cells: Cells) -> None:
    label = _label(cells.run("%time x = 1\ny = 2"))
    text = _entry(label).sources[0].text
    assert "get_ipython().run_line_magic('time', 'x = 1')" in text
    assert _entry(label).state == "nothing in effect"


def test_a_custom_op_cell_notes_what_it_made(cells: Cells) -> None:
    label = _label(
        cells.run(
            '%%custom_op hist_op::f --mutates-args "" --check "torch.randn(3),"\n'
            "def f(x: torch.Tensor) -> torch.Tensor:\n    return x.sin()\n"
        )
    )
    entry = _entry(label)
    assert [s.kind for s in entry.sources] == ["custom_op"]
    source = entry.sources[0]
    assert source.options["name"] == "hist_op::f" and source.options["function"] == "f"
    assert "def f(x: torch.Tensor)" in source.text
    [check] = entry.checks
    assert (check.kind, check.op, check.cell) == ("opcheck", "hist_op::f.default", label)
    assert check.samples[0].args[0].shape == (3,)


def test_opcheck_in_a_cell_is_recorded_with_a_copy_of_its_sample(cells: Cells) -> None:
    cells.run(PLAIN_CELL)
    label = _label(
        cells.run(
            "x = torch.randn(4)\n"
            "torch.library.opcheck(torch.ops.hist_plain.twice.default, (x,))\n"
            "x.zero_()\n"
        )
    )
    [check] = _entry(label).checks
    assert check.op == "hist_plain::twice.default"
    assert check.samples[0].args[0].abs().sum() > 0  # the copy, taken before x.zero_()


def test_an_opcheck_that_fails_here_records_only_the_tests_that_passed(cells: Cells) -> None:
    """A test that failed in the session would fail the package's tests too: it is named in
    the cell's notes instead (here: no fake impl, so the fake-tensor tests fail)."""
    cells.run(
        'lib = torch.library.Library("hist_cpu", "DEF")\n'
        'lib.define("twice(Tensor x) -> Tensor")\n'
        'lib.impl("twice", lambda x: x * 2, "CPU")\n'
    )
    label = _label(
        cells.run(
            "outcomes = torch.library.opcheck(torch.ops.hist_cpu.twice.default, "
            "(torch.randn(3),), raise_exception=False)"
        )
    )
    [check] = _entry(label).checks
    assert check.details["test_utils"] == ("test_schema", "test_autograd_registration")
    notes = _entry(label).unkept
    assert any("test_faketensor of hist_cpu::twice.default failed here" in n for n in notes)


def test_the_doctor_in_a_cell_records_what_its_ladder_proved(cells: Cells) -> None:
    """The doctor's opcheck rung records its passing tests; its gradients rung, a gradcheck
    case (gradcheck in float64, as the package's test runs it)."""
    cells.run(
        '%%custom_op hist_doc::f --mutates-args ""\n'
        "def f(x: torch.Tensor) -> torch.Tensor:\n    return x.sin()\n\n"
        "@fake\ndef _(x):\n    return torch.empty_like(x)\n\n"
        "@setup_context\ndef _(ctx, inputs, output):\n    ctx.save_for_backward(inputs[0])\n\n"
        "@backward\ndef _(ctx, grad):\n    return grad * ctx.saved_tensors[0].cos()\n"
    )
    label = _label(
        cells.run(
            "import opmagic\n"
            "opmagic.doctor(f, torch.randn(3, requires_grad=True), until='opcheck', "
            "progress=False)"
        )
    )
    checks = {check.kind: check for check in _entry(label).checks}
    assert checks.keys() == {"opcheck", "gradcheck"}
    assert checks["gradcheck"].op == "hist_doc::f.default"
    assert checks["opcheck"].details == {}  # every default test passed


def test_a_failed_run_is_history_and_the_previous_run_stays_exported(cells: Cells) -> None:
    first = _label(cells.run(PLAIN_CELL, cell_id="plain"))
    cells.fail(PLAIN_CELL + "raise ValueError('edited badly')\n", cell_id="plain")
    entry = _entry(first)
    assert entry.state == "in effect"
    assert "failed: ValueError: edited badly" in entry.failed_rerun
    cells.fail("raise KeyError('never worked')")
    failed = [e for e in active_session().history() if e.state == "failed"]
    assert [e.detail for e in failed] == ["KeyError: 'never worked'"]


def test_a_key_less_rerun_takes_the_place_of_the_cell_it_replaces(cells: Cells) -> None:
    first = _label(cells.run(PLAIN_CELL, cell_id=None))
    between = _label(cells.run("y = 1", cell_id=None))
    again = _label(cells.run(PLAIN_CELL, cell_id=None))
    labels = [e.label for e in active_session().history()]
    assert labels.index(again) + 1 == labels.index(first) < labels.index(between)
    replaced = _entry(first)
    assert replaced.state == "replaced" and replaced.detail == f"re-run as cell {again}"


def test_cells_before_the_session_are_history_untracked(ipython) -> None:
    ipython.run_cell("import math as m_before_session", store_history=True)
    ipython.run_line_magic("load_ext", "opmagic")
    try:
        before = [e for e in active_session().history() if "before" in e.key]
        assert any("import math as m_before_session" in e.sources[0].text for e in before)
        assert all(e.state == "nothing in effect" for e in before)
        assert "before the opmagic session started" in before[-1].detail
    finally:
        ipython.run_line_magic("unload_ext", "opmagic")


def test_record_check_keeps_copies_and_refuses_what_it_cannot_keep(cells: Cells) -> None:
    session = active_session()
    assert not session.record_check("opcheck", "ns::f.default", [CheckSample((1,))])  # no cell
    x = torch.randn(2, requires_grad=True)
    copy = kept_sample(CheckSample((x, [x, 2]), {"alpha": torch.float16}))
    assert copy.args[0] is not x and copy.args[0].requires_grad
    assert copy.args[1][1] == 2 and copy.kwargs["alpha"] is torch.float16
    with pytest.raises(UnkeptValue, match="a value of type object"):
        kept_sample(CheckSample((object(),)))
    with pytest.raises(UnkeptValue, match="sparse"):
        kept_sample(CheckSample((torch.eye(2).to_sparse(),)))
