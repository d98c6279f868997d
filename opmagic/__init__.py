"""opmagic: define, compile and inspect PyTorch operators from a notebook or a script.

The plain-Python API lives here; ``%load_ext opmagic`` adds the IPython magics on top of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import view  # noqa: F401  (importing it says which view module draws each result type)
from .cells.cuda_kernel import CudaKernelResult, CudaOp, cuda_kernel_from_source
from .cells.custom_op import CustomOpResult, KernelRow, custom_op_from_source
from .cells.session import Session, SessionReport, active_session, registration_site
from .cells.triton_op import TritonKernelRow, TritonOpResult, triton_op_from_source
from .dispatch import (
    AutogradNode,
    CodeLocation,
    Compilation,
    CompiledRegion,
    DispatchTable,
    KeyInfo,
    OverloadTables,
    Resolution,
    Step,
    Surprise,
    Surprises,
    TableEntry,
    Trace,
    TraceComparison,
    TracedCall,
    TracedGroup,
    ValueSummary,
    compare_traces,
    dispatch_table,
    kernels,
    key_info,
    resolve,
    runtime_keys,
    trace,
)
from .dispatch.contexts import CallContext
from .dispatch.diff import (
    AffectedCalls,
    DispatchDiff,
    DispatchSnapshot,
    OpTableDiff,
    diff,
    snapshot,
)
from .errors import (
    ArgumentsMismatchError,
    ArgumentTypeError,
    ArgumentValueError,
    BuildError,
    CacheDirectoryError,
    CacheFullError,
    CellSourceError,
    CompareError,
    CompileError,
    CudaLaunchError,
    CudaToolkitError,
    ExportError,
    ForeignOperatorError,
    LoadError,
    NoGPUError,
    NotAnOperatorError,
    OperatorNameError,
    OpmagicError,
    RegistrationError,
    ToolchainError,
    TritonKernelError,
    TritonNotInstalledError,
    UnknownDispatchKeyError,
    UnknownOperatorError,
)
from .native import (
    CudaKernel,
    CudaKernels,
    LoadedLibrary,
    cdiv,
    compile_cuda_kernels,
    compile_cuda_library,
    compile_library,
    precompile_headers,
)
from .native.triton import TritonLaunch
from .package import Export, Verification, export
from .verify import (
    CaseResult,
    CheckReport,
    CheckRow,
    Comparison,
    Diagnosis,
    DoctorSampleError,
    Finding,
    Mismatch,
    RungResult,
    SweepProgress,
    check_op,
    compare,
    doctor,
)

if TYPE_CHECKING:
    from .view.explorer.widgets import Explorer

__version__ = "0.1.0"


def explore(op: Any = None) -> Explorer:
    """The dispatch explorer widget (ipywidgets): search an operator, build inputs from its
    schema, toggle contexts, and watch the path redraw. ``op=None`` starts at aten::add.Tensor.
    """
    from .view.explorer.widgets import Explorer

    return Explorer(op)


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
