"""The explorer's state and logic, without widgets (``opmagic.explore`` draws it).

:class:`ExplorerModel` holds the operator, the sample arguments built from its schema and
the context toggles, and turns them into a :class:`~opmagic.dispatch.resolve.Resolution`
by building the inputs and resolving inside the contexts. Bad input never raises out of
:meth:`ExplorerModel.outcome`: it comes back as a message that names the cause and the fix.
"""

from __future__ import annotations

import difflib
import functools
from dataclasses import dataclass, replace
from typing import Any

import torch

from ...dispatch import DispatchTable, Resolution
from ...dispatch.contexts import CallContext
from ...dispatch.ops import all_qualnames, op_parameters, op_ref, overloads_of
from ...dispatch.table import table_for
from ...dispatch.trace import Trace
from ...errors import OpmagicError
from ...verify.samples import BATCH, ArgumentSlot, call_arguments, plan_arguments

DEFAULT_OP = "aten::add.Tensor"
MAX_MATCHES = 50


def namespaces() -> list[str]:
    """Every operator namespace of this process, sorted."""
    return sorted({name.split("::", 1)[0] for name in all_qualnames()})


def find_ops(query: str, namespace: str | None = None, limit: int = MAX_MATCHES) -> list[str]:
    """Operators (``ns::name``) matching ``query``, best first.

    Exact names first, then prefixes, substrings, close spellings (``sacle`` finds
    ``scale``) and letters in order (``adm`` finds ``addmm``).
    """
    names = all_qualnames()
    if namespace:
        names = [n for n in names if n.startswith(f"{namespace}::")]
    wanted = query.strip().lower().removeprefix("torch.ops.")
    if "::" not in wanted and "." in wanted:  # aten.add.Tensor spelling
        wanted = wanted.replace(".", "::", 1)
    wanted = wanted.split(".")[0]  # the overload plays no part in finding the operator
    short_wanted = wanted.split("::")[-1]
    if not short_wanted:
        return sorted(n for n in names if n.startswith(wanted))[:limit]
    by_short: dict[str, list[str]] = {}
    for name in names:
        by_short.setdefault(name.split("::", 1)[1].lower(), []).append(name)
    close = difflib.get_close_matches(short_wanted, list(by_short), n=limit, cutoff=0.7)
    close_names = {name for short in close for name in by_short[short]}
    ranked = sorted(
        (rank, len(name), name)
        for name in names
        if (rank := _match_rank(wanted, short_wanted, name.lower(), name in close_names))
        is not None
    )
    return [name for _, _, name in ranked[:limit]]


def _match_rank(query: str, short_query: str, name: str, close: bool) -> int | None:
    """0 exact, 1 prefix, 2 substring, 3 close spelling, 4 letters in order, None: no match."""
    short = name.split("::", 1)[1]
    if query in (short, name):
        return 0
    if short.startswith(query) or name.startswith(query):
        return 1
    if query in name:
        return 2
    if close:
        return 3
    letters = iter(short)
    return 4 if all(char in letters for char in short_query) else None


@functools.cache
def warm_up() -> None:
    """Pay torch's one-time lazy imports now, once per process: the first meta tensor and
    the first FakeTensorMode/vmap take about 1.5 s together, which would otherwise land on
    the first change of an input or toggle instead of the explorer's opening."""
    meta = torch.randn(1, 1, device="meta")
    CallContext(vmap=True, fake=True, logging=True).resolve("aten::mul.Tensor", meta, meta)


@dataclass(frozen=True)
class Outcome:
    """What the explorer shows for the current inputs: a resolution, or why there is none."""

    resolution: Resolution | None
    message: str | None


class ExplorerModel:
    """The operator, its sample arguments and the context, turned into resolutions."""

    def __init__(self, op: Any = None) -> None:
        self.qualname: str | None = None
        self.overloads: list[str] = []
        self.overload: str = ""
        self.slots: list[ArgumentSlot] = []
        self.context = CallContext()
        self.show_all = False
        self.problem: str | None = None  # why the selected operator cannot be explored
        self.select(DEFAULT_OP if op is None else op)

    # ------------------------------------------------------------------ choosing

    @property
    def op_name(self) -> str:
        """``ns::name.overload`` of the selection (``.default`` for the default overload)."""
        if self.qualname is None:
            return ""
        return f"{self.qualname}.{self.overload or 'default'}"

    def select(self, op: Any) -> None:
        """Choose an operator (any spelling ``opmagic.resolve`` accepts); a bad one sets
        :attr:`problem` instead of raising."""
        try:
            ref = op_ref(op)
        except OpmagicError as exc:
            self.qualname, self.overloads, self.slots = None, [], []
            self.problem = str(exc)
            return
        self.qualname = ref.qualname
        self.overloads = overloads_of(ref)
        chosen = ref.overload if ref.overload is not None else self.overloads[0]
        self.select_overload(chosen)

    def select_overload(self, overload: str) -> None:
        """Choose one overload of the selected operator (``""`` is the default one)."""
        self.overload = overload
        self.problem = None
        try:
            self.slots = plan_arguments(op_parameters(op_ref(self.op_name)))
        except OpmagicError as exc:
            self.slots = []
            self.problem = str(exc)

    def set_context(self, **changes: Any) -> None:
        """Turn context toggles on or off (``no_grad=True``, ``autocast="cpu"``, ...)."""
        self.context = replace(self.context, **changes)

    # ------------------------------------------------------------------ answers

    def outcome(self) -> Outcome:
        """Build the sample inputs, resolve inside the contexts; bad input becomes a message."""
        if self.problem is not None:
            return Outcome(None, self.problem)
        try:
            args, kwargs = call_arguments(self.slots, BATCH if self.context.vmap else None)
            resolution = self.context.resolve(self.op_name, *args, **kwargs)
        except OpmagicError as exc:
            return Outcome(None, str(exc))
        except Exception as exc:  # torch refusing the inputs or a context: say so, never raise
            return Outcome(
                None,
                f"torch refused these inputs or this context ({type(exc).__name__}: {exc}). "
                "Change the inputs or turn a context toggle off.",
            )
        if resolution.error is not None and not resolution.steps:  # refused before dispatch
            return Outcome(None, resolution.error)
        return Outcome(resolution, None)

    def table(self) -> DispatchTable | None:
        """The selected overload's dispatch table, or None without a valid selection."""
        return table_for(op_ref(self.op_name)) if self.qualname is not None else None

    def trace(self) -> Trace:
        """Run the call on the sample inputs inside the contexts and trace every operator it
        makes (``opmagic.trace``): the decompositions, casts and redispatches under it."""
        if self.problem is not None or self.qualname is None:
            raise OpmagicError(self.problem or "Choose an operator first.")
        args, kwargs = call_arguments(self.slots, BATCH if self.context.vmap else None)
        return self.context.trace(self.op_name, *args, **kwargs)

    def opcheck(self) -> dict[str, str]:
        """Run ``torch.library.opcheck`` on the sample inputs (no contexts): test -> result."""
        if self.problem is not None or self.qualname is None:
            raise OpmagicError(self.problem or "Choose an operator first.")
        args, kwargs = call_arguments(self.slots)
        results = torch.library.opcheck(
            op_ref(self.op_name).op_overload(), args, kwargs, raise_exception=False
        )
        return {test: str(result) for test, result in results.items()}
