"""``notebooks/prototyping.ipynb``: one op three ways, compared with torch's, a buggy kernel
edited until it passes, tables and the plot (saved to build/notebooks/ as a test artefact)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import base64

import pytest

from opmagic.native.cuda.toolkit import gpu_unavailable_reason
from opmagic.view.style import FAIL_FILL

from .conftest import ROOT

if TYPE_CHECKING:
    import nbformat

pytestmark = pytest.mark.slow  # runs a notebook in a kernel

pytest.importorskip("cuda.bindings.nvrtc", reason='needs pip install "opmagic[cuda]"')

PLOT_ARTEFACT = ROOT / "build" / "notebooks" / "prototyping-plot.png"


@pytest.fixture(scope="module")
def executed(run_notebook) -> nbformat.NotebookNode:
    """The notebook after running every cell in a fresh kernel."""
    return run_notebook("prototyping")


def _outputs(notebook: nbformat.NotebookNode, first_line: str) -> list:
    """The outputs of the cells whose source starts with ``first_line``, in order."""
    return [
        cell.outputs
        for cell in notebook.cells
        if cell.cell_type == "code" and cell.source.startswith(first_line)
    ]


def _texts(outputs: list) -> list[str]:
    """What each output shows as text."""
    return [o.text if o.output_type == "stream" else o.data.get("text/plain", "") for o in outputs]


def test_each_version_is_compared_as_its_cell_runs(executed) -> None:
    (python,) = _outputs(executed, "%%custom_op proto_py::silu")
    assert any(
        t.startswith("proto_py::silu vs F.silu (cpu): all 8 cases pass") for t in _texts(python)
    )
    buggy, _typo, fixed = _outputs(executed, "%%torch_library")
    buggy_text = next(t for t in _texts(buggy) if t.startswith("proto_cpp::silu vs F.silu"))
    assert buggy_text.startswith(
        "proto_cpp::silu vs F.silu (cpu): 0 of 4 cases pass; 4 FAIL (values)"
    )
    buggy_html = next(
        o.data["text/html"]
        for o in buggy
        if "text/html" in o.get("data", {}) and "proto_cpp::silu vs" in o.data["text/html"]
    )
    assert buggy_html.count(f"background:{FAIL_FILL}") == 4  # every failing row highlighted
    assert '<img src="data:image/png;base64,' in buggy_html  # and the plot below the table
    assert any(
        t.startswith("proto_cpp::silu vs F.silu (cpu): all 4 cases pass") for t in _texts(fixed)
    )
    assert any(t.startswith("compare: 4 cases in ") for t in _texts(fixed))  # the progress bar


def test_a_compile_error_is_its_cell_s_one_output_at_the_cell_line(executed) -> None:
    """Shown once: the formatted error replaces the build's progress, and no ``error``
    output repeats it (JupyterLab would draw that as a second block)."""
    _buggy, typo, _fixed = _outputs(executed, "%%torch_library")
    (shown,) = typo
    assert shown.output_type == "display_data"
    text = shown.data["text/plain"]
    assert text.startswith("libproto_cpp.so: compile error at cell [")
    assert "line 13:" in text.splitlines()[0] and "expected ';'" in text
    assert "<details>" in shown.data["text/html"]  # the compiler's log, folded


def test_the_cuda_comparison_runs_on_a_gpu_and_skips_without_one(executed) -> None:
    (gpu,) = _outputs(executed, "if GPU:")
    text = "\n".join(_texts(gpu))
    if gpu_unavailable_reason() is None:
        assert "proto_cuda::silu vs torch.nn.functional.silu (cuda:0): all 4 cases pass" in text
    else:
        assert text.startswith("skipped (needs a GPU): No GPU can run kernels here")


def test_the_plot_is_a_png_saved_as_a_test_artefact(executed) -> None:
    (plot,) = _outputs(executed, "cpp.plot(bandwidth=True)")
    (figure,) = [o for o in plot if "image/png" in o.get("data", {})]
    png = base64.b64decode(figure.data["image/png"])
    assert png.startswith(b"\x89PNG")
    PLOT_ARTEFACT.parent.mkdir(parents=True, exist_ok=True)
    PLOT_ARTEFACT.write_bytes(png)
    (table,) = _outputs(executed, "cpp = %compare")
    assert "speedup" in table[-1].data["text/html"]  # the DataFrame
    (printed,) = _outputs(executed, "print(cpp)")
    assert printed[0].text.startswith("proto_cpp::silu vs F.silu (cpu): all 4 cases pass")
