"""Reading the live dispatcher: dispatch tables, call resolution, traces, kernels, keys."""

from .kernels import kernels
from .keys import KeyInfo, key_info, runtime_keys
from .resolve import DispatchInput, Resolution, Skip, Step, resolve
from .table import DispatchTable, OverloadTables, Registration, TableEntry, dispatch_table
from .trace import (
    AutogradNode,
    CodeLocation,
    Compilation,
    CompiledRegion,
    Surprise,
    Surprises,
    TensorInfo,
    Trace,
    TraceComparison,
    TracedCall,
    TracedGroup,
    ValueSummary,
    compare_traces,
    trace,
)

__all__ = [
    "AutogradNode",
    "CodeLocation",
    "Compilation",
    "CompiledRegion",
    "DispatchInput",
    "DispatchTable",
    "KeyInfo",
    "OverloadTables",
    "Registration",
    "Resolution",
    "Skip",
    "Step",
    "Surprise",
    "Surprises",
    "TableEntry",
    "TensorInfo",
    "Trace",
    "TraceComparison",
    "TracedCall",
    "TracedGroup",
    "ValueSummary",
    "compare_traces",
    "dispatch_table",
    "kernels",
    "key_info",
    "resolve",
    "runtime_keys",
    "trace",
]
