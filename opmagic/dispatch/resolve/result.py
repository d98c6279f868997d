"""What ``resolve`` returns: the path of kernels a call takes, and why each one is on it."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...display import Displayable
from ..table import DispatchTable, TableEntry

NOT_RUN = ("missing", "ambiguous", "fallthrough")
"""Entry kinds whose step is where dispatch failed, with no kernel of the op run there."""


@dataclass(frozen=True)
class Skip:
    """A key the call's keyset had that the dispatcher passed over, and why."""

    key: str
    reason: str  # "excluded" | "fallthrough" | "masked"
    detail: str


@dataclass(frozen=True)
class Step:
    """One kernel on the path: the key, the table entry that served it, and what it does."""

    key: str
    entry: TableEntry
    via: str  # "dispatch" | "redispatch" | "call" (the previous kernel called the op again)
    origin: str  # what put the key in the keyset (arguments, TLS include, a kernel)
    skipped: tuple[Skip, ...]  # keys of the keyset passed over just before this one
    action: str  # "ends" | "redispatch" | "call" | "python" | "error"
    note: str  # what the kernel does next, in one line
    assumed: bool = False  # reached only if a Python handler calls the op again, as usual


@dataclass(frozen=True)
class DispatchInput:
    """One argument the dispatcher reads keys from."""

    name: str
    description: str
    keys: tuple[str, ...]


@dataclass(frozen=True)
class Resolution(Displayable):
    """The predicted dispatch of one call: the path of runtime keys and why each is there.

    ``table`` is the operator's dispatch table as the prediction read it (the steps' entries
    are its entries), so a resolution draws the same after the op is redefined or removed.
    """

    op: str
    schema: str
    steps: tuple[Step, ...]
    error: str | None
    inputs: tuple[DispatchInput, ...]
    context: tuple[str, ...]  # the thread-local state that matters, in words
    tls_included: tuple[str, ...]
    tls_excluded: tuple[str, ...]
    table: DispatchTable = field(repr=False, compare=False)  # the op's, as read for this call

    @property
    def path_steps(self) -> tuple[Step, ...]:
        """The steps whose kernels run, in order (:attr:`path` is their keys)."""
        return tuple(step for step in self.steps if step.entry.kind not in NOT_RUN)

    @property
    def path(self) -> tuple[str, ...]:
        """Runtime keys whose kernels run, in order (the first is the resolved key).

        A fallback that runs and raises (the Meta fallback) is on the path; a key with no
        kernel at all, where dispatch fails, is not, nor is a fallthrough dispatch reached.
        """
        return tuple(step.key for step in self.path_steps)

    @property
    def key(self) -> str | None:
        """The key resolved for the inputs (``path[0]``), or ``None``."""
        return self.path[0] if self.path else None

    @property
    def python(self) -> str | None:
        """Where the path hands over to Python code that opmagic does not follow, if it does."""
        last = self.steps[-1] if self.steps else None
        return last.note if last is not None and last.action == "python" else None

    def diagram(self, show_all: bool = False) -> Displayable:
        """The path as a Graphviz diagram (a :class:`~opmagic.view.diagram.Diagram`);
        ``show_all`` draws the op's whole table around it."""
        return self.view("diagram", show_all=show_all)
