"""What changed in the dispatcher: snapshots of its whole state and their differences.

``opmagic.snapshot()`` keeps every operator's registrations, the backend fallbacks and the
``torch._native`` override routes; ``opmagic.diff(before)`` (or ``with opmagic.diff() as
d:``) names every operator, kernel, fallback and route that was added, removed or replaced
since, the table entries that changed as a consequence, and which calls of a model now run
something else (``DispatchDiff.affected``).
"""

from .affected import AffectedCall, AffectedCalls
from .compare import diff
from .result import Change, DispatchDiff, OpTableDiff, TableRow
from .state import DispatchSnapshot, snapshot

__all__ = [
    "AffectedCall",
    "AffectedCalls",
    "Change",
    "DispatchDiff",
    "DispatchSnapshot",
    "OpTableDiff",
    "TableRow",
    "diff",
    "snapshot",
]
