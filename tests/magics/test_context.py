"""The one error policy, magic by magic, in a real IPython shell: a failure shows its own
class and one message that starts with the magic's name, printed once, without a traceback."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from opmagic.errors import (
    BuildOptionError,
    CellSourceError,
    CompareError,
    NotAnOperatorError,
    OpmagicError,
    UnknownDispatchKeyError,
)

from ..native.sources import op_source
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
