"""``%%triton_op`` in a real IPython shell: the summary at cell lines, re-runs and edits, errors
once at the kernel's line (the magic's line is line 1), --check, --compare, unload, and the
message without Triton. Kernels run in Triton's interpreter (no GPU here)."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest
import torch
from IPython.utils.capture import capture_output

import opmagic
from opmagic.errors import TritonKernelError
from opmagic.native.triton import choose_mode, install_command

from ..shell import Cells

pytest.importorskip("triton")

ADD = """%%triton_op {name} {options}
import triton
import triton.language as tl
from torch.library import wrap_triton

@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x {op} tl.load(y_ptr + offsets, mask=mask), mask=mask)

def add(x: Tensor, y: Tensor) -> Tensor:
    out = torch.empty_like(x)
    n = out.numel()
    wrap_triton(add_kernel)[(triton.cdiv(n, 256),)](x, y, out, n, BLOCK=256)
    return out
"""
CHECK = '--check "torch.randn(1000), torch.randn(1000)"'


def add_cell(name: str, op: str = "+", options: str = "") -> str:
    return ADD.format(name=name, op=op, options=options)


def shown(cells: Cells, source: str) -> tuple[BaseException | None, str]:
    """Run a cell: what it raised, and everything it showed."""
    with capture_output() as captured:
        result = cells.shell.run_cell(source, store_history=True)
    return result.error_in_exec or result.error_before_exec, captured.stdout + captured.stderr


def test_the_summary_shows_the_kernels_and_the_launcher_at_their_cell_lines(cells: Cells):
    result = cells.run(add_cell("tm_sum::add"))
    number = result.execution_count
    summary = result.result
    assert isinstance(summary, opmagic.TritonOpResult)
    words = " ".join(str(summary).split())  # whatever the terminal's width
    assert words.startswith("tm_sum::add(Tensor x, Tensor y) -> Tensor call it as add(...)")
    reason = choose_mode(None)[1]  # a CPU build of torch, or a CUDA one without a GPU
    assert f"kernels: Triton's interpreter ({reason[:30]}" in words
    assert f"add_kernel launched by add cell [{number}], line 6" in words
    assert f"CompositeExplicitAutograd kernel add · cell [{number}], line 13" in words
    assert (
        f"triton_op launcher add (cell [{number}], line 13) launching add_kernel "
        f"(cell [{number}], line 6)" in words
    )
    html = summary._repr_html_()
    assert "<th>Triton kernel</th>" in html and f"cell [{number}], line 6" in html
    x, y = torch.randn(1000), torch.randn(1000)
    torch.testing.assert_close(cells.ns["add"](x, y), x + y)
    torch.testing.assert_close(torch.ops.tm_sum.add(x, y), x + y)


def test_a_rerun_of_the_edited_cell_runs_the_new_kernel(cells: Cells):
    x, y = torch.randn(1000), torch.randn(1000)
    cells.run(add_cell("tm_edit::add"), cell_id="cell")
    torch.testing.assert_close(cells.ns["add"](x, y), x + y)
    first_kernel = cells.ns["add_kernel"]
    cells.run(add_cell("tm_edit::add", op="*"), cell_id="cell")
    torch.testing.assert_close(cells.ns["add"](x, y), x * y)
    assert first_kernel.fn not in type(first_kernel).rewritten_fn  # Triton's copy dropped
    session = str(cells.shell.run_line_magic("opmagic", "session"))
    assert session.count("Triton kernels (interpreter): add_kernel") == 1


def test_a_failing_edit_is_reported_once_at_the_kernels_line_and_keeps_the_previous_op(
    cells: Cells,
):
    x, y = torch.randn(1000), torch.randn(1000)
    cells.run(add_cell("tm_fail::add"), cell_id="cell")
    broken = add_cell("tm_fail::add", op="-", options=CHECK).replace("BLOCK: tl.constexpr", "BLOCK")
    error, output = shown(cells, broken)
    assert isinstance(error, TritonKernelError) and error.line == 8
    number = cells.shell.execution_count - 1
    assert output.count("arange's arguments must be of type tl.constexpr") == 1
    head = f"TritonKernelError: %%triton_op: Triton kernel add_kernel (cell [{number}], line 8)"
    assert head in output
    assert "  > 8 |     offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)" in output
    assert "Traceback" not in output and "site-packages" not in output
    torch.testing.assert_close(cells.ns["add"](x, y), x + y)  # the previous kernel and op
    torch.testing.assert_close(torch.ops.tm_fail.add(x, y), x + y)


@pytest.mark.parametrize(
    ("edit", "line", "message"),
    [
        (("x {op} tl.load", "x {op} undefined_name + tl.load"), 11, "NameError: undefined_name"),
        (("x {op} tl.load", "x {op} y_ptr + tl.load"), 11, "invalid operands of type"),
        (
            ("    x = tl.load", "    double = lambda v: v * 2\n    x = tl.load"),
            10,
            "unsupported AST node type: Lambda",
        ),
    ],
)
def test_a_kernel_error_found_at_the_first_call_is_shown_once_at_its_line(
    cells: Cells, edit: tuple[str, str], line: int, message: str
):
    old, new = (part.replace("{op}", "+") for part in edit)
    source = add_cell("tm_first::add").replace(old, new)
    result = cells.run(source)  # defining it finds nothing: no launch yet
    error, output = shown(cells, "add(torch.randn(10), torch.randn(10))")
    assert isinstance(error, TritonKernelError) and error.line == line
    words = " ".join(output.split())  # the message is wrapped to the terminal's width
    assert re.search(
        rf"TritonKernelError: Triton kernel add_kernel \(cell \[{result.execution_count}\], "
        rf"line {line}\): .*{re.escape(message)}",
        words,
    )
    assert words.count(message) == 1 and "Traceback" not in output
    assert "triton/" not in output and "site-packages" not in output


def test_an_out_of_bounds_access_names_the_kernel_and_the_offsets(cells: Cells):
    source = add_cell("tm_oob::add").replace(
        "x {op} tl.load(y_ptr + offsets, mask=mask)".replace("{op}", "+"),
        "x + tl.load(y_ptr + offsets)",
    )
    number = cells.run(source).execution_count
    error, output = shown(cells, "add(torch.randn(1000), torch.randn(1000))")
    assert isinstance(error, TritonKernelError)
    assert (
        f"TritonKernelError: Triton kernel add_kernel (cell [{number}], line 11): "
        "out-of-bounds load in program (3, 0, 0): it reads 24 elements past the memory of "
        "y_ptr (float32, 1000 elements): offsets 1000..1023 from y_ptr."
        in " ".join(output.split())  # wrapped to the terminal's width
    )


def test_check_runs_opcheck_and_compare_times_against_torch(cells: Cells):
    cells.run("def inputs(n, dtype, device):\n    return torch.randn(n), torch.randn(n)")
    options = f'{CHECK} --compare "torch.add --inputs inputs --sizes 1000 --min-run-time 0.01"'
    with capture_output() as captured:
        result = cells.run(add_cell("tm_check::add", options=options))
    checks = result.result.checks
    assert checks.passed and [row.status for row in checks.rows] == ["pass"] * 4
    assert "checks (4 passed)" in str(result.result)
    assert "add vs torch.add" in captured.stdout or "tm_check::add" in captured.stdout


def test_sample_arguments_the_op_refuses_are_failed_checks_not_a_failed_cell(cells: Cells):
    checks = cells.run(add_cell("tm_refused::add", options='--check "3"')).result.checks
    assert not checks.passed
    assert "Expected a value of type 'Tensor' for argument 'x'" in checks.rows[0].detail


def test_interpret_asks_for_the_interpreter_and_unload_removes_the_op(cells: Cells):
    summary = cells.run(add_cell("tm_unload::add", options="--interpret")).result
    assert summary.mode == "interpreter" and summary.why == "asked for"
    cells.shell.run_line_magic("unload_ext", "opmagic")
    assert not hasattr(torch.ops.tm_unload, "add")
    from torch._library import triton as torch_triton

    assert "tm_unload::add" not in torch_triton.triton_ops_to_kernels
    cells.shell.run_line_magic("load_ext", "opmagic")  # the fixture unloads it again


def test_help_shows_the_options(cells: Cells):
    with capture_output() as captured:
        cells.shell.run_cell("%%triton_op?", store_history=False)
    for option in ("--mutates-args", "--check", "--interpret", "--compare", "wrap_triton"):
        assert option in captured.stdout


@pytest.mark.slow
def test_without_triton_the_magic_says_how_to_install_it():
    script = textwrap.dedent(
        """
        import importlib.abc, sys

        class HideTriton(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "triton" or name.startswith("triton."):
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)

        sys.meta_path.insert(0, HideTriton())
        from IPython.core.interactiveshell import InteractiveShell

        shell = InteractiveShell.instance()
        shell.run_line_magic("load_ext", "opmagic")
        shell.run_cell("%%triton_op t::f\\ndef f(x: int) -> int:\\n    return x\\n")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True
    )
    output = done.stdout + done.stderr
    words = " ".join(output.split())  # the message is wrapped to the terminal's width
    assert "TritonNotInstalledError: %%triton_op: Triton is not installed in this Python" in words
    assert install_command().split(" (")[0] in words
    assert "Traceback" not in output
