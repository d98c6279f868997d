"""Re-runnable cells: a session owns every torch.library registration each cell makes.

While a :class:`Session` is started, ``begin``/``finish`` bracket each cell. Every
torch.library registration made by code written in a cell while it runs (``define``,
``impl``, ``custom_op`` and its ``register_*`` companions, ``register_fake``,
``register_autograd``, ``register_kernel``, ``register_vmap``, ``register_autocast``,
``register_torch_dispatch``, ``Library`` objects and their methods, ``OpOverload.py_impl``
for a dispatch key) is recorded for that cell, each in a C++ library of its own (or as the
Python-side entry it is) so that it can be removed and re-applied alone.

- Re-running a cell (same key) first removes the kernels and Python-side registrations of its
  previous run and reverts that run's changes to custom ops of other cells. Its operator
  definitions stay until the new run defines them again or succeeds.
- Otherwise torch.library's own rules hold, whichever cells register: a kernel or fake impl
  sits on top of an earlier one for the same operator and key, and removing it (destroying
  its Library, re-running its cell) brings the earlier one back; torch's own errors
  (``allow_override=False``, a second fallback for a key, a second torch_dispatch rule) keep
  their wording. What torch keeps one of (a definition, a namespace claim, a Python kernel
  of an OpOverload) replaces the session's earlier one; defining an operator again removes
  every registration that other cells made on it.
- A run that fails is rolled back: what it registered goes, what it removed comes back.
- A run that succeeds drops for good what it replaced and what is left of its cell's previous
  run (definitions it no longer makes, its Library objects, tracked handles).
- Which earlier cell a run replaces is one rule for every front end (:func:`_reruns`, and
  :meth:`Session.superseded` for handles swapped in place): the cell's previous run (same cell
  key); without a cell key (a terminal IPython, or a client that sends no cell id) every run
  is a new cell, but a key-less run that defines every operator and namespace an earlier
  key-less cell defined (or, defining none, registers the same C++ blocks) is that cell's
  re-run. What torch keeps one of (an operator's definition, a namespace's ``TORCH_LIBRARY``)
  is replaced from whichever cell made it, and the run's notes name that cell.
- Registrations made by imported modules, by torch itself, or outside a cell are not tracked.
- ``close()`` removes everything, leaving the dispatcher as it was before ``start()``.

Other front ends track their own resources (e.g. loaded C++ libraries) per cell with
:meth:`Session.track`: any object with ``close()``.

Besides registrations the session keeps each cell's history (:mod:`.history`), which the export
reads (:meth:`Session.history`): what the cell ran (its Python code, or what a front end made
from it: :meth:`Session.note_source`), which of its top-level statements registered, and the
checks run in it (:meth:`Session.record_check`: opcheck, gradcheck, comparisons; any feature
that checks an op records its runs there).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import os
import signal
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch

from .._torch import compilers, custom_op_state, dispatcher, library_hooks, triton
from ..dispatch.sites import label_location
from ..display import Displayable
from ..errors import ForeignOperatorError, OpmagicError
from ..native.blocks import scan_blocks
from .history import (
    CellEntry,
    CellRun,
    CellSource,
    CheckRun,
    CheckSample,
    UnkeptValue,
    kept_sample,
    operator_label,
)

Site = tuple[str, int]

_active: Session | None = None
_DEFAULT_TEST_UTILS = inspect.signature(torch.library.opcheck).parameters["test_utils"].default
_site_override: ContextVar[Site | None] = ContextVar("opmagic_registration_site", default=None)


def active_session() -> Session | None:
    """The started session of this process, if any (``%load_ext opmagic`` starts one)."""
    return _active


@contextlib.contextmanager
def registration_site(filename: str, line: int) -> Iterator[None]:
    """Record the registrations made inside as made by a cell at ``filename:line``.

    Front ends that register on a cell's behalf (``%%custom_op``) use it, so that the
    session tracks what they register and tables name the cell's line. Registrations made
    by modules imported meanwhile (torch imports some lazily) stay theirs.
    """
    token = _site_override.set((filename, line))
    try:
        yield
    finally:
        _site_override.reset(token)


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Hold Ctrl-C back while the block runs, then deliver it: the session's bookkeeping cut
    in half by a ``KeyboardInterrupt`` would leave a cell that can never run again, or an
    operator that outlives ``%unload_ext``. Only the main thread receives signals; elsewhere
    (and inside an outer hold) the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = signal.getsignal(signal.SIGINT)
    if previous is None or getattr(previous, "holds_interrupts", False):
        yield  # a handler Python cannot put back, or held already by an outer block
        return

    def hold(signum: int, frame: Any) -> None:
        received.append(signum)

    hold.holds_interrupts = True  # type: ignore[attr-defined]
    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            signal.raise_signal(signal.SIGINT)  # to the handler that was there: now


@dataclass(frozen=True)
class CellIdentity:
    """What a cell's run defines and registers: which earlier cell it replaces (:func:`_reruns`).

    ``defines``: ``("def", "ns::name")`` and ``("namespace", "ns")`` (a ``Library(ns, "DEF")``
    or a ``TORCH_LIBRARY`` block: torch keeps one of each); ``registers``: ``(namespace, key)``
    of a C++ source's other blocks (``"FRAGMENT"`` for a fragment's key).
    """

    defines: frozenset[tuple[str, str]] = frozenset()
    registers: frozenset[tuple[str, str]] = frozenset()

    @classmethod
    def of_source(cls, source: str) -> CellIdentity:
        """A C++ source's: its ``TORCH_LIBRARY`` namespaces, and its other blocks."""
        blocks = scan_blocks(source)
        return cls(
            frozenset(("namespace", b.namespace) for b in blocks if b.kind == "DEF"),
            frozenset((b.namespace, b.key or "FRAGMENT") for b in blocks if b.kind != "DEF"),
        )

    def __or__(self, other: CellIdentity) -> CellIdentity:
        return CellIdentity(self.defines | other.defines, self.registers | other.registers)


@dataclass(eq=False)
class TrackedHandle:
    """A resource a front end asked the session to close with its cell (``Session.track``)."""

    handle: Any
    description: str
    identity: CellIdentity = CellIdentity()
    closed: bool = False

    def close(self) -> None:
        """Close the resource once."""
        if not self.closed:
            self.closed = True
            self.handle.close()

    @property
    def is_open(self) -> bool:
        """Neither closed by the session nor by its owner (a handle whose ``closed`` is True)."""
        return not self.closed and getattr(self.handle, "closed", False) is not True


@dataclass(eq=False)
class CellRecord:
    """What one run of a cell registered, and what to undo when it goes."""

    key: str
    label: str
    has_key: bool
    registrations: list[library_hooks.Registration] = field(default_factory=list)
    libraries: list[weakref.ref] = field(default_factory=list)
    handles: list[TrackedHandle] = field(default_factory=list)
    changes: list[custom_op_state.CustomOpChange] = field(default_factory=list)
    # custom_op entries this run changed: qualname -> the (CustomOpDef, Library) torch had
    custom_op_entries: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    created_opdefs: dict[str, weakref.ref] = field(default_factory=dict)
    defined: set[tuple[str, str]] = field(default_factory=set)  # ("def", op) / ("namespace", ns)
    notes: list[str] = field(default_factory=list)

    def live_libraries(self) -> list[Any]:
        """Library objects this run created that still exist."""
        return [lib for lib in (ref() for ref in self.libraries) if lib is not None]

    @property
    def identity(self) -> CellIdentity:
        """What the run defines and registers: its torch.library definitions and namespace
        claims, and the identities of the handles it tracks that are open."""
        own = CellIdentity(frozenset(self.defined))
        return functools.reduce(
            CellIdentity.__or__, (t.identity for t in self.handles if t.is_open), own
        )

    @property
    def empty(self) -> bool:
        """Nothing of the run is left to undo or to show."""
        return not (
            self.registrations
            or any(h.is_open for h in self.handles)
            or self.changes
            or any(not library_hooks.is_torch_held_library(lib) for lib in self.live_libraries())
        )


@dataclass(frozen=True)
class CellReport:
    """One cell in a session listing."""

    label: str
    key: str
    items: tuple[tuple[str, str], ...]  # (what, where)
    notes: tuple[str, ...]


def _checked_name(op: Any) -> str | None:
    """The name a recorded check gives its operator (``"ns::name.overload"``)."""
    return op if isinstance(op, str) else operator_label(op)


@dataclass(frozen=True)
class SessionReport(Displayable):
    """What each cell of the session registered (``%opmagic session``)."""

    cells: tuple[CellReport, ...]


class _CaptureRule:
    """Decides from the call stack whether code written in a cell is registering.

    Frames of torch's registration API, of opmagic and of the standard library's wrappers
    (functools, contextlib, warnings) are looked through; the first other frame decides: a
    cell captures, anything else (an imported module, torch internals, an import) does not.
    """

    def __init__(self, is_cell_code: Callable[[str], bool]) -> None:
        self.is_cell_code = is_cell_code
        wrappers = [  # torch's registration API and opmagic's hooks into it
            *library_hooks.registration_machinery_paths(),
            library_hooks.__file__,
            *(module.__file__ for module in (functools, contextlib, warnings)),
        ]
        with contextlib.suppress(ImportError):
            import typing_extensions

            wrappers.append(typing_extensions.__file__)
        self._wrappers = tuple(p for p in wrappers if p)
        self._opmagic = os.path.dirname(os.path.dirname(__file__)) + os.sep  # all of opmagic
        self._prefixes = (*self._wrappers, self._opmagic)
        self._looked_through: dict[str, bool] = {}

    def by_opmagic(self, frame: Any) -> bool:
        """Whether opmagic itself makes the registration (a front end registering on a cell's
        behalf), not a module imported on the way: torch imports some lazily (the first
        ``triton_op`` imports ``torch._inductor``), and their registrations are not the cell's.
        """
        while frame is not None:
            filename = frame.f_code.co_filename
            if filename.startswith("<frozen importlib"):
                return False
            if filename.startswith(self._opmagic) and not filename.startswith(self._wrappers):
                return True
            frame = frame.f_back
        return False

    def site(self, frame: Any) -> Site | None:
        """The cell line a registration comes from, or ``None`` when no cell makes it."""
        while frame is not None:
            filename = frame.f_code.co_filename
            through = self._looked_through.get(filename)
            if through is None:
                through = self._looked_through[filename] = filename.startswith(self._prefixes)
            if not through:
                return (filename, frame.f_lineno) if self.is_cell_code(filename) else None
            frame = frame.f_back
        return None

    def statement_line(self, frame: Any) -> int | None:
        """The line of the running cell's top-level statement that ``frame`` runs under: the
        outermost frame of cell code (a function defined in a cell and called by another
        registers for the statement that called it)."""
        line = None
        while frame is not None:
            if self.is_cell_code(frame.f_code.co_filename):
                line = frame.f_lineno
            frame = frame.f_back
        return line


def _is_exec_source(filename: str) -> bool:
    """Default cell test outside IPython: code compiled from a string (``<...>``), not frozen."""
    return filename.startswith("<") and not filename.startswith("<frozen")


class Session:
    """Owns the torch.library registrations of each cell; see the module docstring for rules.

    ``is_cell_code(filename)`` tells which code objects are cells (IPython: the files of its
    compile cache). Use ``start()``/``close()``, and ``cell(...)`` or ``begin``/``finish`` per
    cell.
    """

    def __init__(self, is_cell_code: Callable[[str], bool] = _is_exec_source) -> None:
        self._rule = _CaptureRule(is_cell_code)
        self._records: dict[str, CellRecord] = {}
        self._outside = CellRecord("", "outside cells", has_key=False)
        self._run: CellRecord | None = None
        self._previous: CellRecord | None = None
        self._depth = 0
        self._evicted: list[tuple[library_hooks.Registration, CellRecord]] = []
        self._dropped: set[int] = set()  # ids of evicted registrations nothing replaces
        # (new def, previous identical def, its record): C++ definitions taken over in place
        self._adopted: list[
            tuple[
                library_hooks.DispatcherRegistration,
                library_hooks.DispatcherRegistration,
                CellRecord,
            ]
        ] = []
        self._stashes: dict[str, Any] = {}  # cached torch.ops packets of replaced definitions
        self._reverted: list[custom_op_state.CustomOpChange] = []
        self._states: dict[int, tuple[Any, dict]] = {}
        self._namespace: dict[str, Any] | None = None
        self._bindings: dict[str, Any] = {}
        self._held: list[Any] = []  # recorded Libraries, kept alive while a cell runs
        # handles of other cells that the running cell's new ones replace (for its notes)
        self._taken_over: list[tuple[TrackedHandle, CellRecord]] = []
        # Libraries that registrations went through which a later cell replaced for good
        self._emptied: weakref.WeakSet[Any] = weakref.WeakSet()
        self._anonymous = itertools.count(1)
        self._sequence = itertools.count(1)
        # the history (see .history): the latest successful run of each cell, by cell key;
        # a later run that failed; cells a key-less re-run replaced (with its label); who took
        # the last registration of a cell that has none left
        self._cell_run: CellRun | None = None
        self._kept_runs: dict[str, CellRun] = {}
        self._failed_runs: dict[str, CellRun] = {}
        # by cell place: a cell re-run again and again without a cell id is listed once
        self._replaced_runs: dict[int, tuple[CellRun, str]] = {}
        self._emptied_by: dict[str, str] = {}
        self._rerun_keys: list[str] = []
        self._orders = itertools.count(1)

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> Session:
        """Begin routing torch.library registrations to this session (one per process)."""
        global _active
        if _active is not None:
            raise OpmagicError(
                "An opmagic session is already running in this process; close it first "
                "(%unload_ext opmagic) before starting another."
            )
        library_hooks.install_registration_hooks(self)
        _active = self
        return self

    def close(self) -> None:
        """Remove everything the session registered and stop routing registrations.

        Every cell's teardown runs to its end even when a step of it fails (a tracked handle
        whose ``close()`` raises, say); the first failure is raised once all of it is done.
        Ctrl-C waits until it is done (:func:`interrupts_held`).
        """
        with interrupts_held():
            self._close()

    def _close(self) -> None:
        """:meth:`close`, Ctrl-C held back."""
        global _active
        failures = _Failures()
        if self._run is not None:
            self._depth = 0
            with failures.kept():
                self.finish(success=True)
        for record in [*reversed(self._records.values()), self._outside]:
            with failures.kept():
                self._teardown(record, revert=True)
        self._records.clear()
        library_hooks.remove_registration_hooks()
        _active = None
        failures.raise_first()

    @contextlib.contextmanager
    def cell(
        self,
        key: str | None = None,
        label: str | None = None,
        namespace: dict | None = None,
        source: str | None = None,
    ) -> Iterator[None]:
        """Run the body as one cell: kept when it succeeds, rolled back when it raises."""
        self.begin(key, label, namespace, source)
        try:
            yield
        except BaseException as error:
            self.finish(success=False, error=error)
            raise
        self.finish(success=True)

    def begin(
        self,
        key: str | None,
        label: str | None = None,
        namespace: dict | None = None,
        source: str | None = None,
    ) -> None:
        """A cell starts. ``key`` identifies the cell across runs (``None``: a new cell).

        ``namespace`` (the user namespace) lets a failed run rebind names that it pointed
        at its new custom ops back to the previous ones. ``source``: the cell's Python code as
        it is compiled (IPython syntax translated), for its history. Ctrl-C waits until it is
        done, and anything else that interrupts it undoes what it did (the cell then runs
        untracked).
        """
        if self._run is not None:  # a cell run from inside a cell belongs to the outer cell
            self._depth += 1
            return
        with interrupts_held():
            try:
                self._begin(key, label, namespace, source)
            except BaseException:
                self._undo_begin()
                raise

    def _undo_begin(self) -> None:
        """Put back what a :meth:`begin` that was interrupted took off."""
        previous = self._previous
        for registration, _ in sorted(self._evicted, key=lambda pair: pair[0].seq):
            with contextlib.suppress(Exception):
                self._reapply(registration)
        for change in self._reverted:
            with contextlib.suppress(Exception):
                change.reapply()
        if previous is not None:
            self._records[previous.key] = previous
        self._run = self._previous = self._namespace = self._cell_run = None
        self._evicted, self._reverted, self._states, self._bindings, self._held = [], [], {}, {}, []

    def _begin(
        self, key: str | None, label: str | None, namespace: dict | None, source: str | None
    ) -> None:
        """:meth:`begin` of a cell that is not run from inside another."""
        has_key = key is not None
        key = key if key is not None else f"#{next(self._anonymous)}"
        earlier = self._kept_runs.get(key) or self._failed_runs.get(key)
        order = earlier.order if earlier is not None else next(self._orders)
        self._cell_run = CellRun(key, label or key, order)
        if source is not None:
            self._cell_run.sources.append(CellSource("python", source))
        previous = self._records.get(key)
        self._previous, self._evicted, self._reverted = previous, [], []
        if previous is not None:
            for registration in previous.registrations:
                if registration.kind not in ("def", "namespace") and registration.applied:
                    self._evict(registration, previous)
            self._reverted = previous.changes
            for change in reversed(self._reverted):
                change.revert()
        self._states = custom_op_state.custom_op_states()
        self._namespace = namespace
        self._bindings = (
            {k: v for k, v in namespace.items() if _is_registering_object(v)}
            if namespace is not None
            else {}
        )
        # a cell that rebinds a Library name must not destroy what a rollback restores
        self._held = [lib for record in self._records.values() for lib in record.live_libraries()]
        self._run = CellRecord(key, label or key, has_key)

    def finish(self, success: bool, error: BaseException | None = None) -> None:
        """The cell ended: keep its registrations (``success``) or roll it back (``error``:
        what it raised, for its history). Ctrl-C waits until that is done
        (:func:`interrupts_held`)."""
        if self._depth:
            self._depth -= 1
            return
        if self._run is None:
            return
        with interrupts_held():
            self._finish(success, error)

    def _finish(self, success: bool, error: BaseException | None) -> None:
        """:meth:`finish` of the outermost cell, Ctrl-C held back."""
        try:
            if success:
                self._commit()
                self._keep_run()
            else:
                self._rollback()
                self._fail_run(error)
        finally:
            self._run = self._previous = self._namespace = self._cell_run = None
            self._rerun_keys = []
            self._evicted, self._reverted, self._states, self._bindings = [], [], {}, {}
            self._held, self._adopted, self._stashes, self._taken_over = [], [], {}, []
            self._dropped = set()

    # ---------------------------------------------------------------- for other front ends

    def track(
        self,
        handle: Any,
        description: str | None = None,
        identity: CellIdentity = CellIdentity(),
    ) -> Any:
        """Close ``handle`` (anything with ``close()``) when its cell is re-run or rolled back.

        Called while a cell runs, the handle belongs to that cell: it is closed when the
        cell runs again and succeeds, when the run that tracked it fails, or at
        ``close()``. Outside a cell it is closed at ``close()``. ``%opmagic session`` shows
        ``description``, else the handle's own ``description`` attribute, else ``str(handle)``.
        ``identity`` is what the handle defines and registers (for :meth:`superseded`). A
        handle listing ``operators`` (objects with a ``name``) defines those: cells are told
        so when they try to redefine one. Returns ``handle``.
        """
        record = self._run if self._run is not None else self._outside
        description = description or getattr(handle, "description", None) or str(handle)
        record.handles.append(TrackedHandle(handle, description, identity))
        return handle

    def drop_registrations_on(self, qualnames: Iterable[str]) -> bool:
        """Remove for the running cell the kernels and Python-side registrations that other
        cells made on these operators (``ns::name``), as defining them again does: a C++
        re-run that changes an operator's kernel signatures needs its dispatcher entry free
        of them. Gone for good when the cell succeeds, back when it fails; its notes name
        them. Whether there were any."""
        run = self._run
        if run is None:
            return False
        names = set(qualnames)
        victims = [
            (record, registration)
            for record, registration in self._applied()
            if record is not run
            and registration.kind not in ("def", "namespace")
            and (registration.op or "").partition(".")[0] in names
        ]
        for record, registration in victims:
            self._evict(registration, record)
            self._dropped.add(id(registration))
        return bool(victims)

    def superseded(self, kind: type, identity: CellIdentity) -> Any | None:
        """The open handle of type ``kind`` that the running cell's new one, which will define
        and register ``identity``, replaces (hot reload in place: a C++ library).

        First the handle of any cell that defines something the new one defines (torch keeps
        one ``TORCH_LIBRARY`` per namespace; the run's notes then name that cell), else the
        newest handle of a cell this run re-runs (:func:`_reruns`).
        """
        run = self._run
        if run is None:
            return None
        handles = [
            (record, tracked)
            for record in reversed(self._records.values())
            for tracked in reversed(record.handles)
            if tracked.is_open and isinstance(tracked.handle, kind)
        ]
        for record, tracked in handles:
            if tracked.identity.defines & identity.defines:
                if not _reruns(run, identity, record):
                    self._taken_over.append((tracked, record))
                return tracked.handle
        return next(
            (tracked.handle for record, tracked in handles if _reruns(run, identity, record)),
            None,
        )

    def note_source(self, source: CellSource) -> None:
        """The running cell made an operator (or loaded a library) from ``source``: what the
        export writes for the cell instead of its Python code. Outside a cell: nothing."""
        if self._cell_run is not None:
            self._cell_run.sources.append(source)

    def note_earlier_cell(self, label: str, source: str) -> None:
        """A cell that ran before the session started (``%load_ext opmagic``'s own, and those
        before it): nothing of it is tracked, but its code is in the history, where the
        export finds the imports and definitions later cells use."""
        run = CellRun(f"before {label}", label, next(self._orders))
        run.sources.append(CellSource("python", source))
        run.detail = "it ran before the opmagic session started (nothing of it is tracked)"
        self._kept_runs[run.key] = run

    def record_check(
        self, kind: str, op: Any, samples: Iterable[CheckSample], **details: Any
    ) -> bool:
        """Remember that the running cell checked ``op`` on ``samples``; the export makes tests
        of what each cell's latest successful run recorded.

        ``kind``: ``"opcheck"``, ``"gradcheck"``, ``"compare"`` (``details``: ``reference``,
        ``rtol``, ``atol``), or a new feature's own kind; ``op``: an OpOverload, a packet, a
        custom op or ``"ns::name.overload"``. The samples are copied now (tensors cloned). A
        sample holding something else than tensors, numbers, strings, dtypes, devices and
        lists, tuples and dicts of them, or over 16 MiB of tensors, is not kept (the export
        lists it). Returns whether anything was recorded: nothing is outside a cell.
        """
        run = self._cell_run
        name = _checked_name(op)
        if run is None or name is None:
            return False
        kept = []
        for sample in samples:
            try:
                kept.append(kept_sample(sample))
            except UnkeptValue as why:
                run.unkept.append(f"a {kind} sample of {name} holds {why}")
        if kept:
            run.checks.append(CheckRun(kind, name, tuple(kept), dict(details), run.label))
        return bool(kept)

    # ---------------------------------------------------------------- queries

    def records(self) -> list[CellRecord]:
        """The cells whose registrations are in effect, oldest first."""
        return list(self._records.values())

    def history(self) -> tuple[CellEntry, ...]:
        """Every cell of the session, in cell order (a cell keeps the place of its first run):
        what its latest successful run ran, recorded and left in effect, and cells that
        failed or were replaced (see :class:`~opmagic.cells.history.CellEntry`)."""
        owners = {
            (r.kind, r.op): record.label
            for record, r in self._applied()
            if r.kind in ("def", "namespace")
        }
        entries = []
        for key, run in self._kept_runs.items():
            record = self._records.get(key)
            failed = self._failed_runs.get(key)
            detail = run.detail
            if record is None and key in self._emptied_by:
                detail = f"what it registered was replaced by cell {self._emptied_by[key]}"
            defines = frozenset(record.defined) if record is not None else frozenset()
            elsewhere = tuple(
                (f"{kind} {name}", owners[(kind, name)])
                for kind, name in sorted(defines)
                if record is not None and owners.get((kind, name), record.label) != record.label
            )
            entries.append(
                _entry(
                    run,
                    "in effect" if record is not None else "nothing in effect",
                    detail,
                    defines=defines,
                    defined_elsewhere=elsewhere,
                    handles=tuple(t.handle for t in record.handles if t.is_open)
                    if record is not None
                    else (),
                    failed_rerun=f"its later run, cell {failed.label}, failed: {failed.error}"
                    if failed is not None
                    else "",
                )
            )
        entries += [
            _entry(run, "failed", run.error)
            for key, run in self._failed_runs.items()
            if key not in self._kept_runs
        ]
        entries += [
            _entry(run, "replaced", f"re-run as cell {by}")
            for run, by in self._replaced_runs.values()
        ]
        return tuple(sorted(entries, key=lambda e: (e.order, e.state == "replaced")))

    def displaced(self) -> list[str]:
        """What of other cells the running cell has replaced so far, for its summary (not
        what it replaced of its own earlier run: see :func:`_reruns`)."""
        run, previous = self._run, self._previous
        identity = run.identity if run is not None else CellIdentity()

        def other(owner: CellRecord) -> bool:
            return (
                run is not None
                and owner not in (run, previous)
                and not _reruns(run, identity, owner)
            )

        by_operator: dict[tuple[str, str | None], list[library_hooks.Registration]] = {}
        notes = []
        for registration, owner in self._evicted:
            if not other(owner):
                continue
            if id(registration) in self._dropped:
                notes.append(
                    f"dropped cell {owner.label}'s {registration.describe()} (re-run that cell "
                    "to add it again)"
                )
            else:
                by_operator.setdefault((owner.label, registration.op), []).append(registration)
        for (label, op), replaced in by_operator.items():
            if op is not None and len(replaced) > 1:  # one note per operator
                parts = ", ".join(
                    dict.fromkeys(registration.summary() for registration in replaced)
                )
                notes.append(f"replaced cell {label}'s {parts} for {op}")
            else:
                notes += [f"replaced cell {label}'s {r.describe()}" for r in replaced]
        notes += [
            f"replaced cell {owner.label}'s {tracked.description}"
            for tracked, owner in self._taken_over
            if not tracked.is_open
        ]
        defined = {op for kind, op in run.defined if kind == "def"} if run else set()
        notes += [
            f"dropped cell {record.label}'s {change.describe()} (re-run that cell to add it again)"
            for record in self._records.values()
            if record is not previous
            for change in record.changes
            if change.qualname in defined
        ]
        return notes

    def definition_site(self, qualname: str) -> str | None:
        """``cell [3], line 2``: where the session's definition of ``ns::name`` in effect was
        made, named by the run that made it (a later run of the same source has another
        number), or ``None`` when no cell made it."""
        for record, registration in self._applied():
            defines = (
                registration.kind == "def"
                and registration.defined_name.partition(".")[0] == qualname
            )
            if defines and record is not self._outside:
                return f"cell {record.label}, line {registration.site[1]}"
        return None

    def owns_definition(self, qualname: str) -> bool:
        """Whether the session made the definition of ``ns::name`` (any overload)."""
        return any(
            r.kind == "def"
            and (r.defined_name == qualname or r.defined_name.startswith(qualname + "."))
            for _, r in self._applied()
        )

    def redefinition_refused(self, qualname: str) -> str:
        """Why a cell may not redefine ``ns::name``, which the session did not define with
        torch.library: a C++ library that one of its cells loaded defines it, or code outside
        the session does."""
        for record in self._records.values():
            for tracked in record.handles:
                if tracked.is_open and qualname in _operators_defined_by(tracked.handle):
                    loader = f"cell {record.label}"
                    return _loaded_library_message(qualname, tracked.description, loader)
        return foreign_operator_message(qualname)

    def report(self) -> SessionReport:
        """What each cell registered that is in effect, an operator per line, for display.
        A cell, or a Library, whose registrations later cells replaced is left out."""
        in_use = {id(r.made_through) for _, r in self._applied() if r.made_through is not None}
        cells = []
        for record in [*self._records.values(), self._outside]:
            items = _grouped(r for r in record.registrations if r.applied)
            items += [(c.describe(), "") for c in record.changes]
            items += [
                (f"Library({lib.ns!r}, {lib.kind!r})", "")
                for lib in record.live_libraries()
                if not library_hooks.is_torch_held_library(lib)
                and (id(lib) in in_use or lib not in self._emptied)
            ]
            items += [(t.description, "") for t in record.handles if t.is_open]
            if items:  # a cell whose registrations later cells replaced holds nothing now
                notes = tuple(record.notes)
                cells.append(CellReport(record.label, record.key, tuple(items), notes))
        return SessionReport(tuple(cells))

    # ---------------------------------------------------------------- the router (see _torch)

    def capture_site(self) -> Site | None:
        """Where the registration being made now comes from, if a running cell makes it."""
        if self._run is None:
            return None
        override = _site_override.get()
        frame = sys._getframe(1)
        if override is not None and self._rule.by_opmagic(frame):
            return override
        site = self._rule.site(frame)
        if site is not None and self._cell_run is not None:
            line = self._rule.statement_line(frame)
            if line is not None:
                self._cell_run.statement_lines.add(line)
        return site

    def make_room(self, registration: library_hooks.Registration) -> Callable[[bool], None]:
        """Evict what ``registration`` replaces; the returned callable gets whether it applied.

        Evicted registrations come back if the registration fails, or the cell does. Only
        registrations torch keeps one of replace each other (see ``Registration.exclusive``);
        defining an operator again replaces every registration other cells made on it. An
        identical definition is adopted instead of made again: the operator's dispatcher
        entry, and every OpOverload pointing at it, stay as they are. A changed one lets the
        entry go, as torch does, after putting its cached OpOverloads aside for a rollback.
        """
        run = self._run
        assert run is not None
        if (
            not isinstance(registration, library_hooks.DispatcherRegistration)
            or registration.kind != "def"
        ):
            if not registration.exclusive:  # torch stacks it, or refuses it in its own words
                return self._evict_for([])
            identity = registration.identity
            return self._evict_for(
                [(rec, r) for rec, r in self._applied() if r.identity == identity]
            )
        op = registration.defined_name
        definition = registration.definition  # a bad schema raises before anything is evicted
        self._forget_custom_op(op)
        redefines = any(r.kind == "def" and r.op == op and r.applied for r in run.registrations)
        on_op = [(rec, r) for rec, r in self._applied() if r.op == op]
        others = [(rec, r) for rec, r in on_op if rec is not run or redefines]
        previous = next((pair for pair in others if pair[1].kind == "def"), None)
        if previous is None:
            return self._evict_for(others)
        owner, previous_def = previous
        assert isinstance(previous_def, library_hooks.DispatcherRegistration)
        if previous_def.definition == definition:
            registration.adopt(previous_def)
            # torch would make the operator's objects anew, failing the guards of code
            # compiled with its previous kernels; adopted, they stay: that code must go
            compilers.forget_all_compiled_code()
            adopted = (registration, previous_def, owner)
            self._adopted.append(adopted)
            return self._evict_for([pair for pair in others if pair is not previous], adopted)
        own = [(rec, r) for rec, r in on_op if rec is run and not redefines]
        self._stashes.setdefault(op, library_hooks.take_cached_overloads(op))
        return self._evict_for(others + own, reapply_after=own)

    def _evict_for(
        self,
        victims: list[tuple[CellRecord, library_hooks.Registration]],
        adopted: tuple | None = None,
        reapply_after: Sequence[tuple[CellRecord, library_hooks.Registration]] = (),
    ) -> Callable[[bool], None]:
        """Evict ``victims``; returns what to call once the replacing registration is done."""
        for record, victim in victims:
            self._evict(victim, record)

        def release(applied: bool) -> None:
            """Bring back the victims (all when the replacement failed, else ``reapply_after``)."""
            again = reapply_after if applied else victims
            for record, victim in sorted(again, key=lambda pair: pair[1].seq):
                self._reapply(victim)
                self._evicted.remove((victim, record))
            if not applied and adopted is not None:
                adopted[0].give_back(adopted[1])
                self._adopted.remove(adopted)
            if not applied and victims:
                self._restore_stashes([r.defined_name for _, r in victims if r.kind == "def"])

        return release

    def _forget_custom_op(self, op: str) -> None:
        """A plain define replaces a custom op: torch must stop routing to its CustomOpDef."""
        run = self._run
        assert run is not None
        opdef = custom_op_state.custom_op_def(op)
        if op not in run.custom_op_entries and opdef is not None:
            run.custom_op_entries[op] = (opdef, custom_op_state.custom_op_library(op))
            custom_op_state.set_custom_op_entry(op, None, None)

    def _restore_stashes(self, ops: Iterable[str]) -> None:
        """Re-created entries get the OpOverload objects that pointed at them before."""
        for op in ops:
            packet = self._stashes.pop(op, None)
            if packet is not None:
                library_hooks.restore_cached_overloads(op, packet)

    def added(self, registration: library_hooks.Registration) -> None:
        """Record a registration the running cell made."""
        assert self._run is not None
        registration.seq = next(self._sequence)
        self._run.registrations.append(registration)
        if registration.kind in ("def", "namespace"):
            self._run.defined.add((registration.kind, registration.defined_name))

    def library_created(self, library: Any) -> None:
        """Record a Library the running cell created; it is destroyed with the run."""
        assert self._run is not None
        self._run.libraries.append(weakref.ref(library))

    def custom_op_replacing(self, qualname: str, library: Any, opdef: Any) -> None:
        """Allow ``custom_op`` to redefine session operators only."""
        assert self._run is not None
        foreign = (
            library is not None
            and library.m is not None
            and not self.owns_definition(qualname)
            and dispatcher.find_schema(qualname, "") is not None
        )
        if foreign:
            raise ForeignOperatorError(self.redefinition_refused(qualname))
        self._run.custom_op_entries.setdefault(qualname, (opdef, library))

    def opcheck_called(
        self, op: Any, args: tuple, kwargs: dict, test_utils: Any
    ) -> Callable[[Any], None]:
        """The router's hook: a cell runs ``torch.library.opcheck``. Its sample is copied now
        (the op may change its arguments) and recorded with the tests that passed once it has
        run; a test that failed in the session is named, not made a test of the package."""
        if not isinstance(args, (tuple, list)) or not isinstance(kwargs, dict):
            return lambda outcomes: None  # opcheck refuses them in its own words
        sample = CheckSample(tuple(args), kwargs)
        with contextlib.suppress(UnkeptValue):  # record_check names what it cannot keep
            sample = kept_sample(sample)

        def finished(outcomes: Any) -> None:
            if not isinstance(outcomes, dict):
                return
            passed = tuple(test for test, outcome in outcomes.items() if outcome == "SUCCESS")
            failed = sorted(outcomes.keys() - set(passed))
            run = self._cell_run
            if run is not None and failed:
                name = _checked_name(op)
                run.unkept += [
                    f"opcheck's {test} of {name} failed here: it is not a test of the package"
                    for test in failed
                ]
            if passed:
                chosen = {} if set(passed) == set(_DEFAULT_TEST_UTILS) else {"test_utils": passed}
                self.record_check("opcheck", op, [sample], **chosen)

        return finished

    # ---------------------------------------------------------------- internals

    def _keep_run(self) -> None:
        """History: the running cell succeeded; it is its cell's latest run (a key-less re-run
        takes the place of the cells it re-ran)."""
        run = self._cell_run
        if run is None:
            return
        for key in self._rerun_keys:
            earlier = self._kept_runs.pop(key, None)
            if earlier is not None:
                run.order = min(run.order, earlier.order)
                # what the listing needs of it: its label and place, not its samples
                stub = CellRun(earlier.key, earlier.label, earlier.order, earlier.sources)
                self._replaced_runs[earlier.order] = (stub, run.label)
            self._failed_runs.pop(key, None)
        self._kept_runs[run.key] = run
        self._failed_runs.pop(run.key, None)
        self._emptied_by.pop(run.key, None)

    def _fail_run(self, error: BaseException | None) -> None:
        """History: the running cell failed (its registrations were rolled back)."""
        run = self._cell_run
        if run is None:
            return
        message = str(error).strip().splitlines() if error is not None else []
        kind = type(error).__name__ if error is not None else "the cell failed"
        run.error = f"{kind}: {message[0]}" if message else kind
        run.checks.clear()  # a failed run's checks make no test: let their samples go
        self._failed_runs[run.key] = run

    def _applied(self) -> Iterator[tuple[CellRecord, library_hooks.Registration]]:
        """Every registration in effect, with the record of the run that made it."""
        for record in [*self._records.values(), self._outside, self._run]:
            if record is not None:
                for registration in record.registrations:
                    if registration.applied:
                        yield record, registration

    def _evict(self, registration: library_hooks.Registration, owner: CellRecord) -> None:
        """Remove a registration for the running cell, remembering it for a rollback."""
        registration.remove()
        self._evicted.append((registration, owner))

    def _reapply(self, registration: library_hooks.Registration) -> None:
        """Make a removed registration again where it was in torch's stack: under the ones
        with its identity that were made after it (taken off and made again over it)."""
        identity, seq = registration.identity, registration.seq
        later_ones = (r for _, r in self._applied() if r.identity == identity and r.seq > seq)
        above = [] if registration.exclusive else sorted(later_ones, key=lambda r: r.seq)
        for later in reversed(above):
            later.remove()
        registration.reapply()
        for later in above:
            later.reapply()

    def _commit(self) -> None:
        """The cell succeeded: drop for good what it replaced, and record what it made."""
        run, previous = self._run, self._previous
        assert run is not None
        run.changes = custom_op_state.custom_op_changes(self._states)
        for qualname in run.custom_op_entries:
            opdef = custom_op_state.custom_op_def(qualname)
            if opdef is not None:
                run.created_opdefs[qualname] = weakref.ref(opdef)
        run.notes.extend(self.displaced())
        replaced = [(old, owner) for _, old, owner in self._adopted] + self._evicted
        for registration, owner in replaced:
            if registration in owner.registrations:
                owner.registrations.remove(registration)
            if registration.made_through is not None:
                self._emptied.add(registration.made_through)
            registration.discard()
        if previous is not None:
            self._records.pop(previous.key, None)
            self._teardown(previous, revert=False)
        identity = run.identity
        for record in list(self._records.values()):
            if _reruns(run, identity, record):  # key-less cells it re-runs (keyed: done above)
                del self._records[record.key]
                self._rerun_keys.append(record.key)
                self._teardown(record, revert=True)
        changed = {(id(c.opdef()), c.part) for c in run.changes}
        for record in list(self._records.values()):
            # registrations whose Library was destroyed or collected are gone already
            record.registrations = [r for r in record.registrations if r.state != "dead"]
            record.changes = [
                c for c in record.changes if c.current and (id(c.opdef()), c.part) not in changed
            ]
            if record.empty:
                del self._records[record.key]
                self._emptied_by[record.key] = run.label
                self._teardown(record, revert=True)
        if not run.empty:
            self._records[run.key] = run

    def _rollback(self) -> None:
        """The cell failed: remove what it registered and bring back what it replaced."""
        run = self._run
        assert run is not None
        changes = custom_op_state.custom_op_changes(self._states)
        created = {id(library) for library in run.live_libraries()}
        adopted = {id(new): (new, old) for new, old, _ in self._adopted}
        defined = set()
        for registration in reversed(run.registrations):
            if id(registration) in adopted:
                new, old = adopted[id(registration)]
                new.give_back(old)
                continue
            if registration.kind == "def" and registration.applied:
                defined.add(registration.defined_name)
            registration.discard()
        dispatcher.refresh_operators(defined)  # objects made for the failed run's definitions
        if adopted:  # code compiled during the run used its kernels on the kept objects
            compilers.forget_all_compiled_code()
        for change in reversed(changes):
            change.revert()
        self._release_resources(run)
        self._restore_bindings(created)  # only now: the run's Libraries must outlive give_back
        for qualname, (opdef, library) in run.custom_op_entries.items():
            custom_op_state.set_custom_op_entry(qualname, opdef, library)
        for registration, owner in sorted(self._evicted, key=lambda pair: pair[0].seq):
            if owner is not run:
                self._reapply(registration)
        self._restore_stashes(list(self._stashes))
        for change in self._reverted:
            change.reapply()

    def _restore_bindings(self, created: set[int]) -> None:
        """Names the failed run bound to its new custom ops, Libraries (``created``: ids of
        the Libraries) and Triton kernels (which launchers find by name) get their previous
        values."""
        namespace = self._namespace
        if namespace is None:
            return
        kept = {id(value) for value in self._bindings.values()}
        for name, value in list(namespace.items()):
            new_opdef = custom_op_state.is_custom_op_def(value) and id(value) not in self._states
            new_kernel = triton.is_kernel(value) and id(value) not in kept
            if new_opdef or new_kernel or id(value) in created:
                if name in self._bindings:
                    namespace[name] = self._bindings[name]
                else:
                    del namespace[name]

    def _teardown(self, record: CellRecord, revert: bool) -> None:
        """Undo everything a run left in effect; every step runs, the first failure is raised
        after."""
        failures = _Failures()
        refreshed = {r.defined_name for r in record.registrations if r.kind == "def" and r.applied}
        for registration in reversed(record.registrations):
            with failures.kept():
                registration.discard()
        record.registrations.clear()
        if revert:
            for change in reversed(record.changes):
                with failures.kept():
                    change.revert()
        record.changes = []
        for qualname, opdef_ref in record.created_opdefs.items():
            opdef = opdef_ref()
            if opdef is not None and custom_op_state.custom_op_def(qualname) is opdef:
                library = custom_op_state.custom_op_library(qualname)
                custom_op_state.set_custom_op_entry(qualname, None, library)
        with failures.kept():
            self._release_resources(record)
        dispatcher.refresh_operators(refreshed)
        failures.raise_first()

    @staticmethod
    def _release_resources(record: CellRecord) -> None:
        """Destroy the run's Library objects and close the handles it tracked (all of them,
        raising the first failure after)."""
        failures = _Failures()
        for library in record.live_libraries():
            with failures.kept():
                library_hooks.destroy_library(library)
        record.libraries.clear()
        for tracked in reversed(record.handles):
            with failures.kept():
                tracked.close()
        failures.raise_first()


def _entry(run: CellRun, state: str, detail: str, **more: Any) -> CellEntry:
    """A history entry for ``run``."""
    return CellEntry(
        key=run.key,
        label=run.label,
        order=run.order,
        state=state,
        detail=detail,
        sources=run.source(),
        checks=tuple(run.checks),
        statement_lines=frozenset(run.statement_lines),
        unkept=tuple(run.unkept),
        **more,
    )


def _reruns(run: CellRecord, identity: CellIdentity, earlier: CellRecord) -> bool:
    """Whether ``run`` (defining and registering ``identity``) is a re-run of the cell that
    made ``earlier``: the same cell key; without keys, a run that defines all that the
    earlier one defined, or, where neither defines anything, registers the same C++ blocks."""
    if run.has_key or earlier.has_key:
        return run.key == earlier.key
    before = earlier.identity
    if before.defines:
        return before.defines <= identity.defines
    same_blocks = bool(before.registers) and before.registers == identity.registers
    return same_blocks and not identity.defines


class _Failures:
    """Lets a teardown run all its steps, keeping the first exception to raise at the end."""

    def __init__(self) -> None:
        self.first: Exception | None = None

    @contextlib.contextmanager
    def kept(self) -> Iterator[None]:
        """Run a step; an exception it raises is kept (the first one) instead of propagating."""
        try:
            yield
        except Exception as error:
            if self.first is None:
                self.first = error

    def raise_first(self) -> None:
        """Raise the first kept exception, if any."""
        if self.first is not None:
            raise self.first


def _is_registering_object(value: Any) -> bool:
    """A CustomOpDef, a Library or a Triton kernel: what a failed cell's rebinding of a name
    must not lose."""
    return (
        custom_op_state.is_custom_op_def(value)
        or library_hooks.is_library(value)
        or triton.is_kernel(value)
    )


def _grouped(registrations: Iterator[library_hooks.Registration]) -> list[tuple[str, str]]:
    """One ``(what, where)`` row per operator: its registrations' kinds and their sites."""
    rows: dict[str, tuple[list[str], list[str]]] = {}
    for registration in registrations:
        parts, sites = rows.setdefault(registration.op or "(every operator)", ([], []))
        parts.append(registration.summary())
        site = label_location(*registration.site)
        if site not in sites:
            sites.append(site)
    return [(f"{op}: {', '.join(parts)}", "; ".join(sites)) for op, (parts, sites) in rows.items()]


def _operators_defined_by(handle: Any) -> set[str]:
    """``ns::name`` of the operators a tracked resource defines (a loaded C++ library lists
    them as ``operators``, each with a ``name``)."""
    return {op.name.partition(".")[0] for op in getattr(handle, "operators", ())}


def _loaded_library_message(qualname: str, library: str, loader: str) -> str:
    """Why a cell will not redefine an operator that a C++ library the session tracks defines
    (``library``: its description; ``loader``: the cell that loaded it, e.g. ``cell [3]``)."""
    name = qualname.split("::", 1)[1]
    return (
        f"{qualname} is defined by the C++ library that {loader} loaded ({library}); a "
        "Python custom op cannot replace it, as only unloading that whole library removes "
        f"its definition. Choose another name (e.g. mylib::{name}), or take the definition "
        f"out of {loader} and run it again; to add kernels to the operator, use "
        "torch.library.register_kernel or register_fake in a cell."
    )


def foreign_operator_message(qualname: str) -> str:
    """Why opmagic will not redefine an operator defined outside the session."""
    name = qualname.split("::", 1)[1]
    return (
        f"{qualname} is already defined outside this opmagic session (by code run before "
        "%load_ext opmagic, by an imported module, or by torch), so a cell may not redefine "
        "it: the session could not restore it on re-run or %unload_ext. Choose "
        f"another name (e.g. mylib::{name}); to add kernels to an existing operator, use "
        "torch.library.register_kernel or register_fake in a cell."
    )
