"""What the doctor found: a :class:`Finding` per root cause, a :class:`RungResult` per rung of
the ladder, and the :class:`Diagnosis` holding both (a snapshot: its views read nothing else)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...display import Displayable
from .causes import CAUSES

if TYPE_CHECKING:
    import pandas

RUNG_STATUSES = ("pass", "fail", "skip")


@dataclass(frozen=True)
class Finding:
    """One root cause: what is wrong, the proof, where it was written and what to change."""

    cause: str  # a code of CAUSES
    rung: str  # the rung that showed it (the lowest one)
    message: str  # what happened, in the op author's terms
    evidence: str  # the dispatch-table row or the comparison that proves it
    site: str  # where the registration at fault was written ("cell [3], line 5", "ops.py:12")
    fix: str  # a concrete change: a snippet, an option, a line to write

    @property
    def meaning(self) -> str:
        """What the cause's code means, in a line."""
        return CAUSES[self.cause].meaning


@dataclass(frozen=True)
class RungResult:
    """One rung of the ladder: how it went, why, and how long it took."""

    name: str  # "fake", "aot_eager", ...
    title: str  # "fake vs real"
    status: str  # one of RUNG_STATUSES
    detail: str  # why it was skipped or failed ("" when it passed)
    seconds: float
    samples: int  # how many samples it ran on
    causes: tuple[str, ...] = ()  # the codes it found, or that made it fail


@dataclass(frozen=True)
class Diagnosis(Displayable):
    """The doctor's verdict on one operator: its ladder of rungs and its findings.

    ``ok`` when there is no finding; ``causes`` is the set of codes found. ``str()`` is text
    fitting the terminal, notebooks show the ladder with each finding's fix highlighted,
    :meth:`frame` is a DataFrame of the rungs.
    """

    op: str  # "ns::name" or "ns::name.overload"
    schema: str
    samples: tuple[str, ...]  # each sample's arguments, described
    rungs: tuple[RungResult, ...]
    findings: tuple[Finding, ...]
    seconds: float  # the whole ladder

    @property
    def ok(self) -> bool:
        """No finding."""
        return not self.findings

    @property
    def causes(self) -> frozenset[str]:
        """The codes of the findings."""
        return frozenset(finding.cause for finding in self.findings)

    @property
    def summary(self) -> str:
        """``"healthy: 9 rungs pass, 4 skipped"`` or ``"2 findings: no-fake, backward-arity"``."""
        counts = {s: sum(r.status == s for r in self.rungs) for s in RUNG_STATUSES}
        ladder = f"{counts['pass']} rungs pass"
        if counts["fail"]:
            ladder += f", {counts['fail']} fail"
        if counts["skip"]:
            ladder += f", {counts['skip']} skipped"
        if self.ok:
            return f"healthy: {ladder}"
        codes = ", ".join(finding.cause for finding in self.findings)
        count = len(self.findings)
        return f"{count} finding{'s' if count > 1 else ''}: {codes} ({ladder})"

    def rung(self, name: str) -> RungResult:
        """The result of one rung, by name (``diagnosis.rung("fake")``)."""
        for rung in self.rungs:
            if rung.name == name:
                return rung
        raise KeyError(f"no rung {name!r}; the rungs are {', '.join(r.name for r in self.rungs)}")

    def frame(self) -> pandas.DataFrame:
        """A DataFrame with a row per rung: status, detail, seconds, causes."""
        return self.view("frame")
