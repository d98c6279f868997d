"""Does an op do what it should: :func:`check_op` runs torch.library.opcheck (and gradcheck),
:func:`compare` checks a candidate against a reference and times both across a sweep."""

from __future__ import annotations

from .checks import CheckReport, CheckRow, check_op
from .compare import CaseResult, Comparison, Mismatch, SweepProgress, compare

__all__ = [
    "CaseResult",
    "CheckReport",
    "CheckRow",
    "Comparison",
    "Mismatch",
    "SweepProgress",
    "check_op",
    "compare",
]
