"""``%doctor <call>`` and ``--doctor`` of the cell magics, in a real IPython shell with the
session: findings name the cell's lines, and a cell fixed as ``.fix`` says turns healthy."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from opmagic import Diagnosis

from ..cells.test_triton_op import VECTOR_ADD

SAMPLE = '"torch.randn(3, requires_grad=True), 2."'
BROKEN = f"""%%custom_op t_mdoc::scale --until make_fx --doctor {SAMPLE}
def scale(x: Tensor, factor: float) -> Tensor:
    return x * factor
"""
FAKE = """
@fake
def _(x, factor):
    return torch.empty_like(x)
"""
AUTOGRAD = """
@setup_context
def _(ctx, inputs, output):
    ctx.factor = inputs[1]

@backward
def _(ctx, grad):
    return grad * ctx.factor, None
"""


def diagnoses(captured: capture_output) -> list[str]:
    """The text of every diagnosis a cell displayed."""
    texts = [output.data.get("text/plain", "") for output in captured.outputs]
    return [text for text in texts if text.startswith("doctor ")]


def test_a_custom_op_cell_is_diagnosed_and_fixed_cell_by_cell(cells) -> None:
    with capture_output() as captured:
        cells.run(BROKEN, cell_id="scale")
    (text,) = diagnoses(captured)
    assert text.startswith("doctor t_mdoc::scale: 2 findings: no-fake, no-autograd")
    assert "site: cell [" in text and ", line 2" in text  # the function, under the magic line
    assert "@fake\n" in text.replace("       ", "")  # the fix is the cell's own companion
    with capture_output() as captured:
        cells.run(BROKEN + FAKE, cell_id="scale")
    (text,) = diagnoses(captured)
    assert text.startswith("doctor t_mdoc::scale: 1 finding: no-autograd")
    assert "@backward" in text
    with capture_output() as captured:
        cells.run(BROKEN + FAKE + AUTOGRAD, cell_id="scale")
    (text,) = diagnoses(captured)
    assert text.startswith("doctor t_mdoc::scale: healthy")


def test_doctor_line_magic_diagnoses_a_call_from_the_namespace(cells) -> None:
    cells.run("%%custom_op t_mdoc::twice\ndef twice(x: Tensor) -> Tensor:\n    return x * 2\n")
    cells.run("x = torch.randn(4)")
    found = cells.run("%doctor --until fake twice(x)").result
    assert isinstance(found, Diagnosis)
    assert found.causes == {"no-fake"}
    assert found.findings[0].site.startswith("cell [")
    assert found.samples == ("(float32[4])",)
    only = cells.run("%doctor --rungs schema torch.ops.aten.sin(x)").result
    assert only.ok and only.rung("fake").detail == "not asked for"


def test_doctor_line_magic_errors_are_usage_errors(cells) -> None:
    assert isinstance(cells.fail("%doctor"), UsageError)
    assert isinstance(
        cells.fail("%doctor --until nowhere torch.ops.aten.sin(torch.ones(1))"), Exception
    )
    error = cells.fail("%doctor --until nowhere torch.ops.aten.sin(torch.ones(1))")
    assert "until='nowhere' is not a rung" in str(error) and str(error).startswith("%doctor: ")


def test_a_doctor_option_that_cannot_run_leaves_the_cells_op_in_place(cells) -> None:
    with capture_output() as captured:
        cells.run(
            "%%custom_op t_mdoc::kept --doctor 'undefined_name'\n"
            "def kept(x: Tensor) -> Tensor:\n    return x + 1\n"
        )
    assert "UsageError: %%custom_op --doctor: could not evaluate --doctor" in captured.stderr
    assert cells.eval("kept(torch.zeros(1)).item()") == 1.0


@pytest.mark.slow
def test_a_torch_library_cell_with_doctor_diagnoses_each_op_it_defines(cells) -> None:
    """Compiles C++. A library op with only a CPU kernel has no fake impl; the site is the
    registration in the cell."""
    source = """%%torch_library --doctor "torch.randn(3)," --until fake
#include <torch/extension.h>
at::Tensor twice_cpu(const at::Tensor& x) { return x * 2; }
TORCH_LIBRARY(t_mdoc_lib, m) { m.def("twice(Tensor x) -> Tensor"); }
TORCH_LIBRARY_IMPL(t_mdoc_lib, CPU, m) { m.impl("twice", &twice_cpu); }
"""
    with capture_output() as captured:
        cells.run(source)
    (text,) = diagnoses(captured)
    assert text.startswith("doctor t_mdoc_lib::twice: 1 finding: no-fake")
    assert "site: cell [" in text


TRITON_LINE = '%%triton_op t_mdoc::add --interpret --doctor "torch.randn(100), torch.randn(100)"'


@pytest.mark.slow
def test_a_triton_op_cell_is_healthy_its_launcher_tracing_as_its_fake(cells) -> None:
    """Triton's interpreter (no GPU needed): a triton_op needs no fake impl of its own."""
    pytest.importorskip("triton")
    with capture_output() as captured:
        cells.run(f"{TRITON_LINE} --until make_fx\n{VECTOR_ADD.format(op='+')}")
    (text,) = diagnoses(captured)
    assert text.startswith("doctor t_mdoc::add: healthy"), text
