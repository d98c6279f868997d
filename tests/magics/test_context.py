"""The one error policy, magic by magic, in a real IPython shell: a failure shows its own
class and one message that starts with the magic's name, printed once, without a traceback."""

from __future__ import annotations

import sys

import nbformat
import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from nbclient.exceptions import CellExecutionError

from opmagic.errors import (
    BuildOptionError,
    CellSourceError,
    CompareError,
    NotAnOperatorError,
    OpmagicError,
    UnknownDispatchKeyError,
)

from ..native.sources import op_source
from ..notebooks.conftest import execute
from ..shell import Cells

VADD = 'extern "C" __global__ void vadd(float* x) {}\n'

# (cell, the class it raises, the message it prints after "Class: ")
FAILURES = [
    ("%%custom_op t_ctx::f\nx = 1\n", CellSourceError, "%%custom_op: cell [{n}], line 1: "),
    ("%%custom_op t_ctx::f --nope\ndef f(x): ...\n", UsageError, "%%custom_op: unrecognized"),
    (f"%%torch_library --opt 7\n{op_source('t_ctx')}", BuildOptionError,
     "%%torch_library: Unknown optimisation level"),
    (f"%%cuda_kernel --whole\n{VADD}", UsageError, "%%cuda_kernel: --whole do not apply"),
    ("%dispatch torch.norm(x)", NotAnOperatorError, "%dispatch: torch.norm is Python code"),
    ("%dispatch x + x", UsageError, "%dispatch: needs a call expression"),
    ("%kernels aten --missing Nope", UnknownDispatchKeyError, "%kernels: Unknown dispatch key"),
    ("%compare torch.sin torch.sin --inputs one --dtypes fp8", CompareError, "%compare: 'fp8'"),
    ("%compare torch.sin torch.sin --inputs nope", UsageError, "%compare: could not evaluate"),
    ("%%trace --vmap\nx.sin()", OpmagicError, "%%trace: --vmap maps a function"),
    ("%opmagic nothing", UsageError, "%opmagic: argument what: invalid choice"),
]  # fmt: skip


@pytest.mark.parametrize(("cell", "error", "message"), FAILURES, ids=[f[0][:24] for f in FAILURES])
def test_a_failure_shows_its_class_and_one_message_once(
    cells: Cells, cell: str, error: type, message: str
) -> None:
    cells.run("x = torch.ones(2)\ndef one(n, dtype, device):\n    return torch.ones(n)")
    with capture_output() as captured:
        raised = cells.fail(cell)
    assert type(raised) is error
    number = cells.shell.execution_count - 1
    shown = captured.stdout + captured.stderr
    first = f"{error.__name__}: {message.format(n=number)}"
    assert shown.startswith(first), shown
    words = " ".join(shown.split())  # the message is wrapped to the terminal's width
    assert words.count(" ".join(str(raised).split())) == 1, shown
    assert shown.count(f"{error.__name__}:") == 1, shown
    assert "Traceback" not in shown and "opmagic/" not in shown  # no internal frames


def test_an_error_a_magic_displayed_is_not_shown_again(cells: Cells) -> None:
    """A displayed error (a notebook's CompileError) fails the cell silently: no second block
    (ipykernel would send an ``error`` output for the empty traceback), %debug still has it."""
    cells.run("from opmagic.errors import CompileError\nshown = CompileError('shown already')")
    cells.run("shown.displayed = True")
    with capture_output() as captured:
        raised = cells.fail("raise shown")
    assert raised is cells.ns["shown"] and sys.last_value is raised
    assert captured.stdout + captured.stderr == ""
    with capture_output() as captured:
        cells.fail("raise CompileError('not displayed')")
    assert (captured.stdout + captured.stderr).strip() == "CompileError: not displayed"


class _Mine(Exception):
    """An exception class a user gave IPython a handler for."""


def test_a_handler_the_user_set_keeps_its_exceptions_and_is_restored(ipython) -> None:
    seen: list[BaseException] = []
    ipython.set_custom_exc(
        (_Mine,), lambda shell, etype, value, tb, tb_offset=None: seen.append(value)
    )
    theirs = ipython.CustomTB
    ipython.user_ns["Mine"] = _Mine
    ipython.run_line_magic("load_ext", "opmagic")
    try:
        with capture_output() as captured:
            ipython.run_cell("raise Mine('mine')")
            ipython.run_cell("from opmagic.errors import OpmagicError\nraise OpmagicError('ours')")
        assert [str(e) for e in seen] == ["mine"]
        assert captured.stdout.strip() == "OpmagicError: ours"
    finally:
        ipython.run_line_magic("unload_ext", "opmagic")
    assert ipython.CustomTB == theirs and ipython.custom_exceptions == (_Mine,)
    ipython.set_custom_exc((), None)


@pytest.mark.slow
def test_in_a_jupyter_kernel_a_displayed_error_is_its_cell_s_only_output(tmp_path) -> None:
    """ipykernel sends an ``error`` output for every traceback IPython shows, an empty one
    too (JupyterLab draws that as a second block): a displayed error sends none, and the cell
    still fails, its reply carrying the message (what nbclient and nbconvert print)."""
    failing = nbformat.v4.new_code_cell(
        "from opmagic.errors import CompileError\n"
        "from IPython.display import display\n"
        "error = CompileError('libx.so: compile error at cell [2], line 3')\n"
        "display(error)\n"
        "error.displayed = True\n"
        "raise error"
    )
    after = nbformat.v4.new_code_cell("print('not reached')")
    notebook = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell("%load_ext opmagic"), failing, after]
    )
    with pytest.raises(CellExecutionError, match=r"CompileError: libx\.so: compile error at"):
        execute(notebook, tmp_path)
    assert [output.output_type for output in failing.outputs] == ["display_data"]
    assert after.execution_count is None  # the run stopped at the failing cell
