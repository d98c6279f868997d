"""opmagic: define, compile and inspect PyTorch operators from a notebook or a script.

The plain-Python API lives here; ``%load_ext opmagic`` adds the IPython magics on top of it.
Its names are defined in ``opmagic._api`` and imported on first use (``opmagic.resolve``), so
``import opmagic`` and ``python -m opmagic --help`` do not import torch; a view module loads
the first time a result of its type is shown, however it was made.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import view  # noqa: F401  (it only says which view module draws each result type)

if TYPE_CHECKING:
    from .view.explorer.widgets import Explorer

__version__ = "0.1.0"


def explore(op: Any = None) -> Explorer:
    """The dispatch explorer widget (ipywidgets): search an operator, build inputs from its
    schema, toggle contexts, and watch the path redraw. ``op=None`` starts at aten::add.Tensor.
    In a notebook a placeholder shows at once while it opens.
    """
    from .view.explorer import open_explorer

    return open_explorer(op)


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext opmagic``: register the magics (IPython is imported only now)."""
    from .magics import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: object) -> None:
    """``%unload_ext opmagic``: remove the magics and what the session registered."""
    from .magics import unload_ipython_extension as unload

    unload(ipython)


__all__ = [
    "AffectedCalls",
    "ArgumentTypeError",
    "ArgumentValueError",
    "ArgumentsMismatchError",
    "AutogradNode",
    "BuildError",
    "CacheDirectoryError",
    "CacheFullError",
    "CallContext",
    "CaseResult",
    "CellSourceError",
    "CheckReport",
    "CheckRow",
    "CodeLocation",
    "CompareError",
    "Comparison",
    "Compilation",
    "CompileError",
    "CompiledRegion",
    "CudaKernel",
    "CudaKernelResult",
    "CudaKernels",
    "CudaLaunchError",
    "CudaOp",
    "CudaToolkitError",
    "CustomOpResult",
    "Diagnosis",
    "DispatchDiff",
    "DispatchSnapshot",
    "DispatchTable",
    "DoctorSampleError",
    "Export",
    "ExportError",
    "Finding",
    "ForeignOperatorError",
    "KernelRow",
    "KeyInfo",
    "LoadError",
    "LoadedLibrary",
    "Mismatch",
    "NoGPUError",
    "NotAnOperatorError",
    "OpTableDiff",
    "OperatorNameError",
    "OpmagicError",
    "OverloadTables",
    "RegistrationError",
    "Resolution",
    "RungResult",
    "Session",
    "SessionReport",
    "Step",
    "Surprise",
    "Surprises",
    "SweepProgress",
    "TableEntry",
    "ToolchainError",
    "Trace",
    "TraceComparison",
    "TracedCall",
    "TracedGroup",
    "TritonKernelError",
    "TritonKernelRow",
    "TritonLaunch",
    "TritonNotInstalledError",
    "TritonOpResult",
    "UnknownDispatchKeyError",
    "UnknownOperatorError",
    "ValueSummary",
    "Verification",
    "active_session",
    "cdiv",
    "check_op",
    "compare",
    "compare_traces",
    "compile_cuda_kernels",
    "compile_cuda_library",
    "compile_library",
    "cuda_kernel_from_source",
    "custom_op_from_source",
    "diff",
    "dispatch_table",
    "doctor",
    "explore",
    "export",
    "kernels",
    "key_info",
    "precompile_headers",
    "registration_site",
    "resolve",
    "runtime_keys",
    "snapshot",
    "trace",
    "triton_op_from_source",
]


def __getattr__(name: str) -> Any:
    """A public name, from ``opmagic._api`` (imported the first time one is asked for)."""
    if name not in __all__:
        raise AttributeError(f"module 'opmagic' has no attribute {name!r}")
    value = getattr(importlib.import_module("._api", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
