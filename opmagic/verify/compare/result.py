"""What a comparison found: a :class:`Mismatch` per difference, a :class:`CaseResult` per case,
the :class:`Comparison` of a sweep, and the :class:`SweepProgress` reported while it runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...display import Displayable

if TYPE_CHECKING:
    import pandas
    from matplotlib.figure import Figure
    from torch.utils.benchmark import Measurement

# the kinds of mismatch a case can have, in the order they are looked for
MISMATCH_KINDS = (
    "error",
    "structure",
    "type",
    "shape",
    "dtype",
    "device",
    "stride",
    "NaN",
    "values",
)


@dataclass(frozen=True)
class Mismatch:
    """One way the candidate's results differ from the reference's, or why a call failed."""

    kind: str  # one of MISMATCH_KINDS
    where: str  # "output", "output 1", "grad of argument 0", "argument 0 after the call", ...
    detail: str

    def __str__(self) -> str:
        if self.kind == "error":
            return f"{self.where} raised {self.detail}"
        return f"{self.kind}: {self.where}: {self.detail}"


@dataclass(frozen=True)
class CaseResult:
    """The verdict and the timings of one case of a sweep."""

    size: int | None  # what ``inputs`` was given (or the largest argument's numel)
    dtype: str  # "float32"
    device: str  # "cpu", "cuda:0"
    inputs: str  # the arguments, described: "(float32[1024], float32[1024])"
    mismatches: tuple[Mismatch, ...]
    max_abs_error: float | None  # over the outputs; None when nothing could be compared
    max_rel_error: float | None
    timing: Measurement | None  # the candidate's, from torch.utils.benchmark
    reference_timing: Measurement | None
    backward_timing: Measurement | None  # forward + backward, with ``backward=True``
    reference_backward_timing: Measurement | None
    nbytes: int | None  # bytes of the tensor arguments and the reference's tensor outputs

    @property
    def status(self) -> str:
        """``"pass"``, ``"FAIL"`` (results differ) or ``"error"`` (a call raised)."""
        if any(m.kind == "error" for m in self.mismatches):
            return "error"
        return "FAIL" if self.mismatches else "pass"

    @property
    def verdict(self) -> str:
        """``"pass"``, or the status with the kinds of mismatch: ``"FAIL: shape, NaN"``."""
        if not self.mismatches:
            return "pass"
        if self.status == "error":
            return "error: " + ", ".join(m.where for m in self.mismatches if m.kind == "error")
        kinds = sorted({m.kind for m in self.mismatches}, key=MISMATCH_KINDS.index)
        return f"{self.status}: {', '.join(kinds)}"

    @property
    def label(self) -> str:
        """The case in a few words: ``"float32 cpu, size 4096"``."""
        return case_label(self.dtype, self.device, self.size)

    @property
    def time(self) -> float | None:
        """The candidate's median time per call, in seconds."""
        return self.timing.median if self.timing is not None else None

    @property
    def reference_time(self) -> float | None:
        """The reference's median time per call, in seconds."""
        return self.reference_timing.median if self.reference_timing is not None else None

    @property
    def backward_time(self) -> float | None:
        """The candidate's median time of forward + backward, in seconds."""
        return self.backward_timing.median if self.backward_timing is not None else None

    @property
    def reference_backward_time(self) -> float | None:
        """The reference's median time of forward + backward, in seconds."""
        timing = self.reference_backward_timing
        return timing.median if timing is not None else None

    @property
    def speedup(self) -> float | None:
        """Reference time / candidate time: above 1 the candidate is faster."""
        if self.time is None or self.reference_time is None or self.time <= 0:
            return None
        return self.reference_time / self.time

    @property
    def bandwidth(self) -> float | None:
        """The candidate's achieved bandwidth in GB/s (bytes in and out / time)."""
        return _bandwidth(self.nbytes, self.time)

    @property
    def reference_bandwidth(self) -> float | None:
        """The reference's achieved bandwidth in GB/s."""
        return _bandwidth(self.nbytes, self.reference_time)


def _bandwidth(size: int | None, seconds: float | None) -> float | None:
    """GB/s moving ``size`` bytes in ``seconds``; None without bytes or a time."""
    if not size or not seconds:
        return None
    return size / seconds / 1e9


@dataclass(frozen=True)
class Comparison(Displayable):
    """A candidate checked against a reference and both timed, one row per case.

    ``str()`` is a text table that fits the terminal, notebooks show the table (failures
    highlighted) and the plot; :meth:`frame` and :meth:`plot` give the DataFrame and the
    matplotlib figure.
    """

    candidate: str
    reference: str
    rows: tuple[CaseResult, ...]
    planned: int  # cases in the sweep; more than ``len(rows)`` when it was stopped
    backward: bool
    tolerances: str  # "torch's defaults per dtype" or "rtol=..., atol=..."
    interrupted: bool = False

    @property
    def passed(self) -> bool:
        """Every planned case ran and passed."""
        return not self.interrupted and all(row.status == "pass" for row in self.rows)

    @property
    def summary(self) -> str:
        """``"all 6 cases pass"``, ``"4 of 6 cases pass; 2 FAIL (values)"``, ..."""
        ran = len(self.rows)
        passing = sum(row.status == "pass" for row in self.rows)
        parts = []
        if self.interrupted:
            parts.append(f"interrupted after {ran} of {self.planned} cases")
        if passing == ran == 1:
            parts.append("the case passes" if not self.interrupted else "it passes")
        elif passing == ran and ran:
            parts.append(f"all {ran} cases pass" if not self.interrupted else "all pass")
        elif ran:
            parts.append(f"{passing} of {ran} cases pass")
        for status in ("FAIL", "error"):
            failing = [row for row in self.rows if row.status == status]
            if failing:
                kinds = sorted(
                    {m.kind for row in failing for m in row.mismatches if m.kind != "error"},
                    key=MISMATCH_KINDS.index,
                )
                named = f" ({', '.join(kinds)})" if kinds and status == "FAIL" else ""
                parts.append(f"{len(failing)} {status}{named}")
        return "; ".join(parts) or "no case ran"

    def frame(self) -> pandas.DataFrame:
        """A DataFrame with a row per case (times in µs, bandwidths in GB/s)."""
        return self.view("frame")

    def plot(self, bandwidth: bool = False) -> Figure:
        """A matplotlib figure: time and speedup against size, a line per dtype (and device);
        with ``bandwidth=True`` also the achieved bandwidth."""
        return self.view("plot", bandwidth=bandwidth)


@dataclass(frozen=True)
class SweepProgress(Displayable):
    """How far a sweep is: reported before every case and when it ends (compare's cases,
    the doctor's rungs)."""

    done: int  # cases finished
    total: int
    case: str  # the case running now ("" when finished)
    elapsed: float  # seconds since the sweep started
    finished: bool = False
    stopped: bool = False  # ended before every case ran (Ctrl-C, or an error)
    task: str = "compare"  # what sweeps: "compare", "doctor"
    unit: str = "cases"  # what it counts: "cases", "rungs"


def case_label(dtype: str, device: str, size: int | None) -> str:
    """A case in a few words: ``"float32 cpu, size 4096"``."""
    return f"{dtype} {device}" + (f", size {size}" if size is not None else "")
