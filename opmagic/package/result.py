"""What verifying an exported package found: each step's outcome, time and log excerpt."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..display import Displayable, format_duration


@dataclass(frozen=True)
class VerifyStep:
    """One step of :func:`~opmagic.package.verify.verify_package`."""

    name: str  # "build the wheel", "fresh environment", "install", ...
    status: str  # "pass", "FAIL" or "skip"
    seconds: float
    detail: str  # one line: what it made or found, or why it failed or was skipped
    log: str = ""  # the end of the step's output, when it failed


@dataclass(frozen=True)
class Verification(Displayable):
    """A package built into a wheel, installed where opmagic is not importable, its generated
    tests run there (and for stable-ABI libraries their symbols audited)."""

    directory: Path
    name: str
    wheel: str  # the wheel's file name ("" when it was not built)
    steps: tuple[VerifyStep, ...]

    @property
    def passed(self) -> bool:
        """Every step that ran succeeded."""
        return all(step.status != "FAIL" for step in self.steps)

    @property
    def seconds(self) -> float:
        """The time all steps took."""
        return sum(step.seconds for step in self.steps)

    @property
    def summary(self) -> str:
        """``"verified: 6 steps passed in 48 s"`` or ``"FAILED at install"``."""
        failed = [step.name for step in self.steps if step.status == "FAIL"]
        if failed:
            return f"FAILED at {failed[0]}"
        ran = sum(step.status == "pass" for step in self.steps)
        return f"verified: {ran} steps passed in {format_duration(self.seconds, 2)}"
