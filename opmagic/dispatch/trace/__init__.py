"""``trace(fn, *args, **kwargs)``: every operator call a piece of code makes, with its path.

How it sees the calls: the dispatcher's own observer hook (RecordFunction, what torch.profiler
uses) reports each operator call on this thread (a call from Python, from a C++ kernel, from
a ``__torch_dispatch__`` handler) after the call's keys are computed and before its first
kernel runs. The hook adds no dispatch key and changes no thread-local state, so every call
dispatches as it would untraced.

How it knows the path: at each reported call, under the thread-local state of that moment,
:func:`opmagic.resolve` gives the keys whose kernels run until a kernel calls the operator
again (an autocast wrapper, a functorch layer, a mode's handler); that call is reported too,
and its keys continue the path. Calls that run while a call's kernels run are its children.

The parts: ``recording`` (the observer's log built into a tree), ``arguments`` (what a call's
arguments looked like), ``surprises`` (what deserves a second look), ``result``
(:class:`Trace`, :class:`TracedCall`).
"""

from .arguments import TensorInfo
from .compare import TraceComparison, TracedValue, compare_traces
from .recording import prepare_in_background, trace
from .result import (
    AutogradNode,
    CodeLocation,
    Compilation,
    CompiledRegion,
    Surprise,
    Surprises,
    Trace,
    TracedCall,
    TracedGroup,
    ValueSummary,
)

__all__ = [
    "AutogradNode",
    "CodeLocation",
    "Compilation",
    "CompiledRegion",
    "Surprise",
    "Surprises",
    "TensorInfo",
    "Trace",
    "TraceComparison",
    "TracedCall",
    "TracedGroup",
    "TracedValue",
    "ValueSummary",
    "compare_traces",
    "prepare_in_background",
    "trace",
]
