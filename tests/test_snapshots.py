"""Results are snapshots: every result type shows the same, byte for byte and in every form
(text, pretty, HTML, mime bundle, diagram, DataFrame), after its operator is destroyed and
after it is redefined: a view never reads the live dispatcher.

Real operators throughout: ``torch.library.Library`` ops destroyed with ``lib._destroy()``,
``custom_op`` cells of a session re-run and unloaded, a compiled library (slow).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas
import pytest
import torch

from opmagic import (
    AffectedCalls,
    AutogradNode,
    CheckReport,
    Comparison,
    Compilation,
    CompiledRegion,
    CompileError,
    CudaKernelResult,
    CudaKernels,
    CustomOpResult,
    Diagnosis,
    DispatchDiff,
    DispatchSnapshot,
    DispatchTable,
    Export,
    LoadedLibrary,
    OpTableDiff,
    OverloadTables,
    Resolution,
    SessionReport,
    Surprises,
    SweepProgress,
    Trace,
    TraceComparison,
    TracedCall,
    TritonLaunch,
    TritonOpResult,
    Verification,
    check_op,
    compare,
    compare_traces,
    compile_library,
    cuda_kernel_from_source,
    custom_op_from_source,
    diff,
    dispatch_table,
    doctor,
    export,
    kernels,
    resolve,
    snapshot,
    trace,
)
from opmagic.display import Displayable, renderer_for
from opmagic.package import VerifyStep
from opmagic.view.diagram import Diagram
from opmagic.view.frames import KernelsView

from .native.sources import VADD, op_source
from .shell import Cells

FORMS = ("text", "pretty", "html", "mimebundle", "diagram", "frame")
# every result type opmagic displays, and the test below that shows it survives
CHECKED = {
    DispatchTable: "test_library_op_results_survive_destroy_and_redefinition",
    OverloadTables: "test_library_op_results_survive_destroy_and_redefinition",
    Resolution: "test_library_op_results_survive_destroy_and_redefinition",
    Trace: "test_library_op_results_survive_destroy_and_redefinition",
    TracedCall: "test_library_op_results_survive_destroy_and_redefinition",
    Surprises: "test_library_op_results_survive_destroy_and_redefinition",
    CheckReport: "test_library_op_results_survive_destroy_and_redefinition",
    Diagnosis: "test_library_op_results_survive_destroy_and_redefinition",
    Comparison: "test_library_op_results_survive_destroy_and_redefinition",
    SweepProgress: "test_library_op_results_survive_destroy_and_redefinition",
    KernelsView: "test_library_op_results_survive_destroy_and_redefinition",
    Diagram: "test_library_op_results_survive_destroy_and_redefinition",
    CustomOpResult: "test_cell_results_survive_a_rerun_and_unload",
    SessionReport: "test_cell_results_survive_a_rerun_and_unload",
    LoadedLibrary: "test_a_compiled_library_and_its_results_survive_an_override_and_close",
    CudaKernels: "test_a_cuda_kernel_cell_result_survives_its_op_being_removed",
    CudaKernelResult: "test_a_cuda_kernel_cell_result_survives_its_op_being_removed",
    DispatchSnapshot: "test_library_op_results_survive_destroy_and_redefinition",
    DispatchDiff: "test_library_op_results_survive_destroy_and_redefinition",
    OpTableDiff: "test_library_op_results_survive_destroy_and_redefinition",
    AffectedCalls: "test_library_op_results_survive_destroy_and_redefinition",
    TritonOpResult: "test_a_triton_op_cell_and_its_launches_survive_a_rerun_and_unload",
    TritonLaunch: "test_a_triton_op_cell_and_its_launches_survive_a_rerun_and_unload",
    Export: "test_cell_results_survive_a_rerun_and_unload",
    Verification: "test_cell_results_survive_a_rerun_and_unload",
    AutogradNode: "test_backward_and_compiled_traces_survive_destroy_and_redefinition",
    CompiledRegion: "test_backward_and_compiled_traces_survive_destroy_and_redefinition",
    Compilation: "test_backward_and_compiled_traces_survive_destroy_and_redefinition",
    TraceComparison: "test_backward_and_compiled_traces_survive_destroy_and_redefinition",
}
NOT_ABOUT_OPERATORS = {CompileError}  # the compiler's output it carries, and nothing else


def shown(result: Displayable) -> dict[str, str]:
    """Every form a view module registered for ``result``, as text to compare byte for byte
    (a table's and a resolution's diagram also with every key)."""
    forms = {form: result.view(form) for form in FORMS if renderer_for(result, form)}
    if isinstance(result, (DispatchTable, Resolution)):
        forms["diagram of every key"] = result.view("diagram", show_all=True)
    return {form: _as_text(value) for form, value in forms.items()}


def _as_text(value: Any) -> str:
    """A rendered form as one string: diagrams by DOT source and text, frames as text."""
    if isinstance(value, Diagram):
        return f"{value.dot}\n{value.text}"
    if isinstance(value, pandas.DataFrame):
        return value.to_string()
    return repr(value)


def all_shown(results: dict[str, Displayable]) -> dict[str, dict[str, str]]:
    """:func:`shown` of each named result."""
    return {name: shown(result) for name, result in results.items()}


@pytest.fixture(autouse=True)
def _fixed_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """Text views fit the terminal: one width for the whole test."""
    monkeypatch.setenv("COLUMNS", "100")


def test_every_result_type_is_checked_here() -> None:
    assert set(_displayables(Displayable)) == set(CHECKED) | NOT_ABOUT_OPERATORS


def _displayables(base: type) -> Iterator[type]:
    """Every subclass of ``base`` that opmagic defines."""
    for cls in base.__subclasses__():
        if cls.__module__.startswith("opmagic."):
            yield cls
        yield from _displayables(cls)


def _checked_by(test: str) -> set[type]:
    """The result types :data:`CHECKED` says ``test`` shows."""
    return {cls for cls, checker in CHECKED.items() if checker == test}


def _define_scale(library: torch.library.Library, factor: float, meta: bool) -> None:
    """``scale(x)`` with a CPU kernel (and a Meta kernel when ``meta``), plus an overload."""
    library.define("scale(Tensor x) -> Tensor")
    library.define("scale.twice(Tensor x, Tensor y) -> Tensor")
    library.impl("scale", lambda x: x * factor, "CPU")
    library.impl("scale.twice", lambda x, y: (x + y) * factor, "CPU")
    if meta:
        library.impl("scale", lambda x: torch.empty_like(x), "Meta")


def test_library_op_results_survive_destroy_and_redefinition() -> None:
    before_library = snapshot()
    library = torch.library.Library("snap_lib", "DEF")
    _define_scale(library, 2.0, meta=False)
    op = torch.ops.snap_lib.scale
    x = torch.randn(3)
    traced = trace(lambda v: op(v).sum(), x)
    changes = diff(before_library)
    results: dict[str, Displayable] = {
        "table": dispatch_table(op.default),
        "overloads": dispatch_table(op, all_overloads=True),
        "resolution": resolve(op, x),
        "trace": traced,
        "call": traced.calls[0],
        "surprises": traced.surprises(),
        "check": check_op(op, (x,)),
        "diagnosis": doctor(op, x, until="fake", progress=False),
        "comparison": compare(op, lambda v: v * 2, [(x,)], min_run_time=0.01, progress=False),
        "progress": SweepProgress(1, 2, "case", 0.5),
        "kernels": KernelsView(kernels("snap_lib")),
        "diagram": dispatch_table(op.default).diagram(),
        "snapshot": before_library,
        "diff": changes,
        "op diff": changes.table("snap_lib::scale"),
        "affected": changes.affected([(op.default, (x,))]),
    }
    before = all_shown(results)
    assert {type(result) for result in results.values()} == _checked_by(
        "test_library_op_results_survive_destroy_and_redefinition"
    )
    assert "surprises" in before["trace"]["text"] and "no fake impl" in before["trace"]["text"]
    library._destroy()
    assert all_shown(results) == before
    again = torch.library.Library("snap_lib", "DEF")
    try:
        _define_scale(again, 3.0, meta=True)
        assert dispatch_table("snap_lib::scale")["Meta"].kind == "kernel"
        assert all_shown(results) == before
    finally:
        again._destroy()


CUSTOM_OP_CELL = """
%%custom_op snap_cell::twice --check "torch.randn(3)"
def twice(x: Tensor) -> Tensor:
    return x * {factor}
"""

LIBRARY_CELL = """
lib = torch.library.Library("snap_cell", "FRAGMENT")
lib.define("passed(Tensor x) -> Tensor")
lib.impl("passed", torch.library.fallthrough_kernel, "AutogradCPU")
lib.impl("passed", lambda x: x, "CPU")
"""


def test_cell_results_survive_a_rerun_and_unload(ipython, tmp_path) -> None:
    """A cell's summary, the session listing, an export (and a verification), and a table, a
    resolution and a trace made between the runs: a re-run redefines the op (with a fake impl
    this time), then ``%unload_ext`` removes it and the cell labels the session gave its
    sites."""
    ipython.run_line_magic("load_ext", "opmagic")
    loaded = True
    try:
        cells = Cells(ipython)
        cells.run("import torch\nfrom torch import Tensor")
        summary = cells.run(CUSTOM_OP_CELL.format(factor=2), cell_id="snap").result
        cells.run(LIBRARY_CELL, cell_id="snap-library")
        x = torch.randn(3)
        results: dict[str, Displayable] = {
            "summary": summary,
            "checks": summary.checks,
            "session": ipython.run_line_magic("opmagic", "session"),
            "table": dispatch_table("snap_cell::twice"),
            "resolution": resolve("snap_cell::twice", x),
            "trace": trace(torch.ops.snap_cell.twice, x),
            "library op": dispatch_table("snap_cell::passed"),
            "its path": resolve("snap_cell::passed", x),
            "export": export(tmp_path / "pkg", "snap_pkg"),
            "verification": Verification(
                tmp_path / "pkg",
                "snap_pkg",
                "snap_pkg-0.1.0-py3-none-any.whl",
                (VerifyStep("tests", "pass", 1.5, "3 passed"),),
            ),
        }
        before = all_shown(results)
        assert "fallthrough kernel · cell [" in before["library op"]["text"]  # the session's
        assert "cell [" in before["table"]["text"]  # labels of the cells' lines
        cells.run(
            CUSTOM_OP_CELL.format(factor=3)
            + "\n@fake\ndef _(x):\n    return torch.empty_like(x)\n",
            cell_id="snap",
        )
        assert "fake impl" in str(dispatch_table("snap_cell::twice"))
        assert all_shown(results) == before
        ipython.run_line_magic("unload_ext", "opmagic")
        loaded = False
        assert all_shown(results) == before
    finally:
        if loaded:
            ipython.run_line_magic("unload_ext", "opmagic")
        ipython.reset()


TRITON_CELL = """
%%triton_op snap_triton::add --interpret --check "torch.randn(100), torch.randn(100)"
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
    wrap_triton(add_kernel)[(triton.cdiv(out.numel(), {block}),)](
        x, y, out, out.numel(), BLOCK={block}
    )
    return out
"""


def test_a_triton_op_cell_and_its_launches_survive_a_rerun_and_unload(ipython) -> None:
    """Triton's interpreter (no GPU needed). A ``%%triton_op`` summary and a trace of the op,
    its call and the launch noted under it, show the same after the cell re-runs with another
    kernel and block size, and after ``%unload_ext`` removes the op and its kernels."""
    pytest.importorskip("triton")
    ipython.run_line_magic("load_ext", "opmagic")
    loaded = True
    try:
        cells = Cells(ipython)
        cells.run("import torch\nfrom torch import Tensor")
        summary = cells.run(TRITON_CELL.format(op="+", block=64), cell_id="snap-triton").result
        x, y = torch.randn(100), torch.randn(100)
        traced = trace(torch.ops.snap_triton.add, x, y)
        call = next(c for c in traced.walk() if c.notes)
        results: dict[str, Displayable] = {
            "summary": summary,
            "checks": summary.checks,
            "trace": traced,
            "call": call,
            "launch": call.notes[0],
        }
        assert {type(result) for result in results.values()} - {CheckReport, Trace, TracedCall} == (
            _checked_by("test_a_triton_op_cell_and_its_launches_survive_a_rerun_and_unload")
        )
        before = all_shown(results)
        assert "launch add_kernel grid (2,) BLOCK=64" in before["trace"]["text"]
        assert "launched by add" in before["summary"]["text"]
        cells.run(TRITON_CELL.format(op="*", block=32), cell_id="snap-triton")
        assert "BLOCK=32" in str(trace(torch.ops.snap_triton.add, x, y))
        assert all_shown(results) == before
        ipython.run_line_magic("unload_ext", "opmagic")
        loaded = False
        assert not hasattr(torch.ops.snap_triton, "add")
        assert all_shown(results) == before
    finally:
        if loaded:
            ipython.run_line_magic("unload_ext", "opmagic")
        ipython.reset()


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Warning only once for all operators:UserWarning")
def test_a_compiled_library_and_its_results_survive_an_override_and_close(build_cache) -> None:
    """Compiles C++. The library's summary and the table and resolution made while it is
    loaded stay the same when Python overrides its kernel and takes the override back; once
    the library is closed, the table and resolution still name its source lines."""
    library = compile_library(op_source("snap_native"), label="cell [7]", progress=None)
    try:
        x = torch.randn(2)
        results: dict[str, Displayable] = {
            "library": library,
            "table": dispatch_table("snap_native::scale"),
            "resolution": resolve("snap_native::scale", x),
        }
        before = all_shown(results)
        assert "cell [7], line 10" in before["table"]["text"]
        override = torch.library.Library("snap_native", "IMPL")
        override.impl("scale", lambda v: v * 5, "CPU")
        override.impl("scale", lambda v: torch.empty_like(v), "Meta")
        assert dispatch_table("snap_native::scale")["Meta"].kind == "kernel"
        assert all_shown(results) == before
        override._destroy()
        assert all_shown(results) == before
    finally:
        library.close()
    del results["library"], before["library"]  # a closed library says it is unregistered
    assert all_shown(results) == before
    assert "unregistered" in str(library)


@pytest.mark.slow
def test_a_cuda_kernel_cell_result_survives_its_op_being_removed(build_cache) -> None:
    """Compiles CUDA with NVRTC (no GPU needed). The quick path's result shows its op's
    table as the cell left it, after the op is removed and defined again differently."""
    pytest.importorskip("cuda.bindings.nvrtc", reason='needs pip install "opmagic[cuda]"')
    result = cuda_kernel_from_source(
        VADD,
        op="snap_cuda::vadd",
        schema="(Tensor a, Tensor b) -> Tensor",
        launch="out = torch.empty_like(a); return out",
        namespace={},
    )
    results: dict[str, Displayable] = {"result": result, "kernels": result.kernels}
    before = all_shown(results)
    assert "dispatch table" in before["result"]["text"]
    result.close()
    assert all_shown(results) == before
    again = torch.library.Library("snap_cuda", "DEF")
    try:
        again.define("vadd(Tensor a, Tensor b) -> Tensor")
        again.impl("vadd", lambda a, b: a + b, "CPU")
        assert all_shown(results) == before
    finally:
        again._destroy()


TWICE = "def twice(x: Tensor) -> Tensor:\n    return x * 2\n"


def test_a_result_shown_first_after_its_op_changed_shows_the_op_as_it_was() -> None:
    """Nothing is left to read when a result is first shown: of two results made alike, the
    one first shown after the op was redefined, then destroyed, shows what the other showed
    before."""
    namespace = {"torch": torch, "Tensor": torch.Tensor}
    x = torch.randn(3)

    def made() -> dict[str, Displayable]:
        """Results made alike each time (no timings in them)."""
        result = custom_op_from_source(TWICE, "snap_twin::twice", namespace=namespace)
        return {
            "summary": result,
            "table": dispatch_table("snap_twin::twice"),
            "resolution": resolve("snap_twin::twice", x),
            "surprises": trace(torch.ops.snap_twin.twice, x).surprises(),
        }

    custom_op_from_source(TWICE, "snap_twin::twice", namespace=namespace)  # later ones replace it
    before = all_shown(made())
    unshown = made()
    edited = TWICE.replace("2", "3") + "\n@fake\ndef _(x):\n    return torch.empty_like(x)\n"
    custom_op_from_source(edited, "snap_twin::twice", namespace=namespace)
    namespace["twice"]._lib._destroy()
    assert all_shown(unshown) == before


def test_a_resolution_drawn_after_its_op_is_gone_does_not_raise() -> None:
    """The bug this file guards against, in its plainest form: a resolution made before
    ``lib._destroy()`` draws its path (and every key around it) afterwards."""
    library = torch.library.Library("snap_gone", "DEF")
    library.define("f(Tensor x) -> Tensor")
    library.impl("f", lambda x: x.clone(), "CPU")
    resolution = resolve(torch.ops.snap_gone.f, torch.randn(2))
    library._destroy()
    assert "CPU" in resolution.diagram(show_all=True).dot


def _define_halve(library: torch.library.Library, factor: float) -> None:
    """``halve(x)``: a CPU kernel, a fake impl, a backward formula that scales by ``factor``."""
    library.define("halve(Tensor x) -> Tensor")
    library.impl("halve", lambda x: x * factor, "CPU")
    library.impl("halve", lambda x: torch.empty_like(x), "Meta")
    torch.library.register_autograd(
        "snap_backward::halve", lambda ctx, grad: grad * factor, lib=library
    )


@pytest.mark.slow
def test_backward_and_compiled_traces_survive_destroy_and_redefinition() -> None:
    """A training step through an op with a backward formula (its autograd node), the same op
    in a function torch.compile compiles inside the trace (the compilation, the region) and
    a comparison of two traces with values show the same once the op is gone and again once
    it is defined anew."""
    torch._dynamo.reset()
    library = torch.library.Library("snap_backward", "DEF")
    _define_halve(library, 0.5)
    op = torch.ops.snap_backward.halve
    x = torch.randn(3, requires_grad=True)

    def step() -> None:
        op(x).sum().backward()

    def f(v: torch.Tensor) -> torch.Tensor:
        return op(v).cos()

    stepped = trace(step, values=True)
    compiled = trace(torch.compile(f, backend="aot_eager"), x.detach())
    again = trace(step, values=True)
    results: dict[str, Displayable] = {
        "step": stepped,
        "node": next(n for n in stepped.nodes() if n.name.startswith("GeneratedBackward")),
        "compiled": compiled,
        "compilation": next(i for i in compiled.calls if isinstance(i, Compilation)),
        "region": compiled.regions()[0],
        "comparison": compare_traces(stepped, again),
    }
    before = all_shown(results)
    assert {type(result) for result in results.values()} >= _checked_by(
        "test_backward_and_compiled_traces_survive_destroy_and_redefinition"
    )
    assert "snap_backward::halve" in before["node"]["text"]
    library._destroy()
    assert all_shown(results) == before
    redefined = torch.library.Library("snap_backward", "DEF")
    try:
        _define_halve(redefined, 2.0)
        assert all_shown(results) == before
    finally:
        redefined._destroy()
        torch._dynamo.reset()
