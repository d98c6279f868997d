"""The public API's definitions, imported on first use (see ``opmagic/__init__.py``): every
room's public names."""

# ruff: noqa: F401  (re-exported through opmagic.__getattr__)
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
