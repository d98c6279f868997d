"""``%compare`` and ``--compare`` of the cell magics, in a real IPython shell with the session."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from opmagic.errors import CompareError
from opmagic.native.cuda.toolkit import gpu_unavailable_reason
from opmagic.verify.compare import Comparison

from ..native.sources import VADD, op_source
from ..shell import Cells

SETUP = """
def make(n, dtype, device):
    a = torch.randn(n, dtype=dtype, device=device)
    return a, torch.randn_like(a)

def one(n, dtype, device):
    return torch.randn(n, dtype=dtype, device=device)

def my_add(a, b):
    return a + b
"""
QUICK = "--min-run-time 0.002"
ADD_CELL = """%%custom_op t_mcmp::add --compare "torch.add --inputs make --sizes 32 64 {quick}"
def add(a: Tensor, b: Tensor) -> Tensor:
    return a + b{bug}
"""


def comparisons(captured: capture_output) -> list[str]:
    """The text of every comparison a cell displayed (its summary is the cell's result)."""
    texts = [output.data.get("text/plain", "") for output in captured.outputs]
    return [text for text in texts if " vs " in text.splitlines()[0]]


def test_compare_evaluates_its_arguments_in_the_user_namespace(cells: Cells) -> None:
    cells.run(SETUP)
    line = f"my_add torch.add --inputs make --sizes 16 '[2**k for k in (5, 6)]' {QUICK}"
    result = cells.shell.run_line_magic("compare", line + " --dtypes float32,float16")
    assert isinstance(result, Comparison) and result.passed
    assert (result.candidate, result.reference) == ("my_add", "torch.add")
    assert [(r.size, r.dtype) for r in result.rows] == [
        (16, "float32"), (32, "float32"), (64, "float32"),
        (16, "float16"), (32, "float16"), (64, "float16"),
    ]  # fmt: skip
    ops = cells.shell.run_line_magic(
        "compare", f"aten::add.Tensor torch.add --inputs make --sizes 8 --backward {QUICK}"
    )
    assert ops.candidate == "aten::add.Tensor" and ops.backward and ops.passed


@pytest.mark.parametrize(
    ("line", "error", "message"),
    [
        ("my_add --inputs make", UsageError,
         "%compare: takes the candidate and the reference, got 1"),
        ("my_add torch.add", UsageError,
         "%compare: the following arguments are required: --inputs. "
         "Write e.g. %compare my_add torch.add --inputs"),
        ("my_add nothing --inputs make", UsageError,
         "%compare: could not evaluate the reference 'nothing': NameError"),
        ("my_add torch.add --inputs make --dtypes fp8", CompareError,
         "%compare: 'fp8' is not a torch dtype"),
        ("my_add torch.add --inputs 42", CompareError,
         "%compare: inputs must build one case's arguments"),
        ("my_add torch.add --inputs make --rtol 0.1", CompareError,
         "%compare: Give rtol and atol together"),
    ],
)  # fmt: skip
def test_bad_arguments_are_one_error_of_their_class(
    cells: Cells, line: str, error: type, message: str
) -> None:
    """A bad line or expression is a UsageError; arguments compare refuses, a CompareError."""
    cells.run(SETUP)
    raised = cells.fail(f"%compare {line}")
    assert type(raised) is error and str(raised).startswith(message), str(raised)


def test_custom_op_compare_shows_the_new_numbers_on_every_rerun(cells: Cells) -> None:
    cells.run(SETUP)
    with capture_output() as captured:
        result = cells.run(ADD_CELL.format(quick=QUICK, bug=""), cell_id="add").result
    (text,) = comparisons(captured)
    assert text.startswith("t_mcmp::add vs torch.add (cpu): all 2 cases pass")
    assert str(result).startswith("t_mcmp::add(Tensor a, Tensor b) -> Tensor")  # as before
    with capture_output() as captured:
        cells.run(ADD_CELL.format(quick=QUICK, bug=" + 1e-3 * b"), cell_id="add")
    (text,) = comparisons(captured)
    assert text.startswith("t_mcmp::add vs torch.add (cpu): 0 of 2 cases pass; 2 FAIL (values)")


def test_compare_can_name_its_own_candidate(cells: Cells) -> None:
    cells.run(SETUP)
    cell = ADD_CELL.format(quick=QUICK, bug="").replace('"torch.add', '"my_add torch.add')
    with capture_output() as captured:
        cells.run(cell)
    assert comparisons(captured)[0].startswith("my_add vs torch.add (cpu): all 2 cases pass")


def test_a_bad_compare_spec_says_why_and_leaves_the_op_made(cells: Cells) -> None:
    cells.run(SETUP)
    cell = ADD_CELL.format(quick=QUICK, bug="").replace("--inputs make", "--inputs nothing")
    with capture_output() as captured:
        cells.run(cell)
    assert captured.stderr == (
        "UsageError: %%custom_op --compare: could not evaluate --inputs 'nothing': "
        "NameError: name 'nothing' is not defined\n"
    )
    with capture_output() as captured:
        cells.run(cell.replace("--inputs nothing", "--inputs make --dtypes fp8"))
    assert captured.stderr.startswith(
        "CompareError: %%custom_op --compare: 'fp8' is not a torch dtype"
    )
    assert torch.ops.t_mcmp.add(torch.ones(1), torch.ones(1)).item() == 2.0


@pytest.mark.skipif(
    importlib.util.find_spec("cuda") is None, reason='needs pip install "opmagic[cuda]"'
)
def test_cuda_kernel_compare_takes_the_cells_op(cells: Cells) -> None:
    cells.run(SETUP)
    launch = (
        '--launch "out = torch.empty_like(a); vadd[cdiv(a.numel(), 256), 256](a, b, out, '
        'a.numel()); return out"'
    )
    line = (
        f'%%cuda_kernel --op t_mcuda::vadd --schema "(Tensor a, Tensor b) -> Tensor" {launch} '
        f'--compare "torch.add --inputs make --sizes 64 {QUICK}"'
    )
    with capture_output() as captured:
        cells.run(f"{line}\n{VADD}")
    (text,) = comparisons(captured)
    if gpu_unavailable_reason() is None:  # the default device is cuda
        assert text.startswith("t_mcuda::vadd vs torch.add (cuda:0): the case passes")
    else:  # on the CPU the op has no kernel: compared all the same, as an error row
        assert text.startswith("t_mcuda::vadd vs torch.add (cpu): 0 of 1 cases pass; 1 error")
        words = " ".join(text.split())  # the mismatch line wraps at the terminal's width
        assert "candidate raised NotImplementedError: Could not run 't_mcuda::vadd'" in words


@pytest.mark.slow
def test_torch_library_compare_takes_the_op_the_cell_defines(cells: Cells, build_cache) -> None:
    cells.run(SETUP)
    twice = op_source(
        "t_mcmp_lib",
        schema="twice(Tensor x) -> Tensor",
        op="twice",
        kernel="at::Tensor twice(const at::Tensor& x) { return x.mul(2); }",
    )
    spec = f"--compare \"'lambda x: 2 * x' --inputs one --sizes 64 {QUICK}\""
    with capture_output() as captured:
        cells.run(f"%%torch_library {spec}\n{twice}")
    (text,) = comparisons(captured)
    assert text.startswith("t_mcmp_lib::twice vs lambda x: 2 * x (cpu): the case passes")
    other = 'TORCH_LIBRARY_FRAGMENT(t_mcmp_lib, m) { m.def("other(Tensor x) -> Tensor"); }\n'
    with capture_output() as captured:
        library = cells.run(f"%%torch_library {spec}\n{twice}{other}").result
    assert (
        "UsageError: %%torch_library --compare: the cell made 2 operators (t_mcmp_lib::twice, "
        "t_mcmp_lib::other), so name the candidate before the reference: --compare "
        "\"CANDIDATE 'lambda x: 2 * x' --inputs ...\"" in captured.stderr
    )
    assert not library.closed and torch.ops.t_mcmp_lib.twice(torch.ones(1)).item() == 2.0
