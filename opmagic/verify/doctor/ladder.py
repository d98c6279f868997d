"""What the rungs share while the doctor climbs: the target, the samples and the kernel's own
results on them, and the findings so far (one per root cause: a cause found at a lower rung
explains the failures it causes higher up, which add no finding of their own)."""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any

import torch

from ...dispatch.sites import label_location
from ...errors import OpmagicError
from ..values import first_line
from . import fixes
from .causes import classify
from .result import Finding
from .samples import Sample
from .target import Target

_NOT_USER_CODE = ("/torch/", "/opmagic/", "/site-packages/", "/dist-packages/", "<frozen")


class DoctorSampleError(OpmagicError, RuntimeError):
    """A sample the op's own kernel raises on: the samples are at fault, not the doctor."""


class RungFailed(Exception):
    """Ends a rung as failed: ``detail`` says why; the findings it made are already reported."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class RungSkipped(Exception):
    """Ends a rung as skipped: ``reason`` says why it cannot apply."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class Run:
    """The kernel's own result on one sample: what it returned and which arguments it wrote."""

    sample: Sample  # the arguments as they were before the call
    output: Any
    after: Sample  # the arguments after the call


@dataclass
class Ladder:
    """The doctor's state while it climbs."""

    target: Target
    samples: list[Sample]
    built: bool  # the samples were built from the schema
    runs: list[Run] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    failed: dict[str, tuple[str, ...]] = field(default_factory=dict)  # rung -> its causes
    rung: str = ""  # the rung climbing now
    causes_here: list[str] = field(default_factory=list)  # what the current rung found
    exported: Any = None  # the export rung's program, for AOTInductor

    @property
    def found(self) -> set[str]:
        """The codes found so far."""
        return {finding.cause for finding in self.findings}

    def call(self, sample: Sample) -> Any:
        """The op on ``sample``'s own tensors."""
        return self.target.overload(*sample.args, **sample.kwargs)

    def report(self, cause: str, message: str, evidence: str, site: str, fix: str) -> None:
        """Add a finding at the current rung, unless the cause was found already."""
        self.causes_here.append(cause)
        if cause not in self.found:
            self.findings.append(Finding(cause, self.rung, message, evidence, site, fix))

    def explain(self, error: BaseException, what: str, default: str, evidence: str = "") -> None:
        """A rung's failure: the cause its exception shows (reported unless found already),
        else an earlier finding that likely explains it, else ``default`` (compile-failure or
        export-failure) with the exception's first lines. Ends the rung as failed."""
        cause = classify(error)
        summary = f"{what}: {first_lines(error)}"
        if cause is not None:
            self.report_cause(cause, summary, evidence or summary)
            raise RungFailed(f"{what}: {cause}")
        if self.findings:
            codes = ", ".join(sorted(self.found))
            self.causes_here.extend(sorted(self.found))
            raise RungFailed(f"{summary} (likely a consequence of {codes}: fix those first)")
        self.report(default, summary, evidence or summary, self.target.kernel_site(), "")
        raise RungFailed(summary)

    def report_cause(self, cause: str, message: str, evidence: str) -> None:
        """Report a cause met as an exception, with the site and fix that cause takes."""
        target = self.target
        outputs = [run.output for run in self.runs]
        samples = [run.sample for run in self.runs]
        if cause in ("no-fake", "data-dependent-shape", "fake-raises"):
            fix = fixes.fake_impl(target, samples, outputs) if outputs else ""
            self.report(cause, message, evidence, target.fake_site(), fix)
        elif cause == "no-autograd":
            self.report(
                cause, message, evidence, target.definition_site(), fixes.autograd_skeleton(target)
            )
        elif cause == "backward-arity":
            self.report(
                cause, message, evidence, target.backward_site(), fixes.backward_return(target)
            )
        elif cause == "output-aliases-input":
            site, fix = self.clone_fix()
            self.report(cause, message, evidence, site, fix)
        else:
            self.report(cause, message, evidence, target.definition_site(), "")

    def clone_fix(self) -> tuple[str, str]:
        """The site and fix of a kernel returning (a view of) an input."""
        kernel = None
        if self.target.opdef is not None:
            parts = self.target.parts
            kernel = next(iter(parts["device_kernels"].values()), None) or parts["impl"]
        found = fixes.cloned_return(kernel) if kernel is not None else None
        if found is not None:
            return found
        return self.target.kernel_site(), "return a new tensor: out.clone() instead of out"

    def sample_error(self, index: int, error: BaseException) -> DoctorSampleError:
        """The error for a sample the kernel raises on (the user's, not the doctor's)."""
        where = user_frame(error)
        at = f" at {where}" if where else ""
        built = (
            "the sample built from the schema (2 x 2 float32 tensors, the simplest values)"
            if self.built
            else f"sample {index}"
        )
        return DoctorSampleError(
            f"doctor: {self.target.name} raised on {built} "
            f"{self.samples[index].described}{at}: {first_line(error)}. The doctor needs "
            "samples the kernel runs on: pass them, as doctor(op, *args) or "
            "doctor(op, samples=[(args, kwargs), ...])."
        )


def first_lines(error: BaseException, count: int = 3) -> str:
    """``Type: message``, the message's first non-empty lines joined."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return f"{type(error).__name__}: {' '.join(lines[:count])}"


def user_frame(error: BaseException) -> str | None:
    """The innermost frame of the traceback in the user's code (a cell, their module)."""
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        if frame.lineno and not any(part in frame.filename for part in _NOT_USER_CODE):
            return label_location(frame.filename, frame.lineno)
    return None


def tensors_of(value: Any) -> list[torch.Tensor]:
    """The tensors of an output (a tensor, a tuple or list of them, None)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in tensors_of(item)]
    return []
