"""Does an op do what it should: :func:`check_op` runs torch.library.opcheck (and gradcheck),
:func:`compare` checks a candidate against a reference and times both across a sweep,
:func:`doctor` climbs a ladder of rungs and names each root cause with its fix."""

from __future__ import annotations

from .checks import CheckReport, CheckRow, check_op
from .compare import CaseResult, Comparison, Mismatch, SweepProgress, compare
from .doctor import Diagnosis, DoctorSampleError, Finding, RungResult, doctor

__all__ = [
    "CaseResult",
    "CheckReport",
    "CheckRow",
    "Comparison",
    "Diagnosis",
    "DoctorSampleError",
    "Finding",
    "Mismatch",
    "RungResult",
    "SweepProgress",
    "check_op",
    "compare",
    "doctor",
]
