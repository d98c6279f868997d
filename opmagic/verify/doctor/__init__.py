"""``doctor``: from "it fails under torch.compile" to "add this registration, here".

:func:`doctor` climbs a ladder of rungs (:data:`RUNGS`), each a place PyTorch takes an
operator: the dispatch table, the kernel against its schema, the fake impl, autograd and
gradients, ``opcheck``, ``make_fx``, ``torch.compile`` (``aot_eager``, Inductor), export and
AOTInductor, vmap, and on a GPU a side stream and CUDA-graph capture. A failure becomes a
:class:`Finding` with a cause from a closed set (``causes.CAUSES``), the registration's site
and a fix; a root cause is reported once, at the lowest rung that shows it, and the rungs it
breaks higher up name it instead of adding findings.

The parts: ``target`` (the op and where its parts were registered), ``samples``, ``ladder``
(the state rungs share), ``rungs`` (eager rungs), ``compiled`` (tracing and compiling rungs),
``causes``, ``fixes``, ``result``. How a diagnosis looks lives in ``opmagic.view.doctor``.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ..._torch import compilers, custom_op_state
from ...cells.history import CheckSample
from ...cells.session import active_session
from ...dispatch.ops import op_ref, overloads_of
from ...dispatch.torch_functions import unbind
from ...errors import ArgumentTypeError, is_list_of_values
from ..checks import checked_operator, gradcheck_row
from ..compare.progress import ProgressCallback, Reporter
from . import compiled, rungs
from .causes import CAUSES, Cause
from .ladder import DoctorSampleError, Ladder, RungFailed, RungSkipped
from .result import Diagnosis, Finding, RungResult
from .samples import Sample, given_samples, schema_sample
from .target import Target

__all__ = [
    "CAUSES",
    "RUNGS",
    "Cause",
    "Diagnosis",
    "DoctorSampleError",
    "Finding",
    "Rung",
    "RungResult",
    "doctor",
]


@dataclass(frozen=True)
class Rung:
    """One rung of the ladder: its name, what it checks, and the rungs it builds on."""

    name: str
    title: str
    climb: Callable[[Ladder], None]
    needs: tuple[str, ...] = ()  # skipped when one of these failed


RUNGS: tuple[Rung, ...] = (
    Rung("registrations", "registrations", rungs.registrations),
    Rung("schema", "schema vs behaviour", rungs.schema),
    Rung("fake_signature", "fake signature", rungs.fake_signature),
    Rung("fake", "fake vs real", rungs.fake, ("fake_signature",)),
    Rung("autograd", "autograd", rungs.autograd),
    Rung("gradients", "gradients (gradcheck)", rungs.gradients, ("autograd",)),
    Rung("opcheck", "opcheck", compiled.opcheck),
    Rung("make_fx", "make_fx, symbolic shapes", compiled.make_fx, ("fake",)),
    Rung("aot_eager", "torch.compile aot_eager", compiled.aot_eager, ("fake",)),
    Rung("inductor", "torch.compile Inductor", compiled.inductor, ("aot_eager",)),
    Rung("export", "torch.export", compiled.export, ("fake",)),
    Rung("aot_inductor", "AOTInductor package", compiled.aot_inductor, ("export",)),
    Rung("vmap", "vmap rule", rungs.vmap),
    Rung("cuda_stream", "side CUDA stream", rungs.cuda_stream),
    Rung("cuda_graph", "CUDA graph capture", rungs.cuda_graph),
)
RUNG_NAMES = tuple(rung.name for rung in RUNGS)
ALWAYS = "schema"  # its runs of the kernel are every later rung's reference


def doctor(
    op: Any,
    *args: Any,
    samples: Iterable[Any] | None = None,
    rungs: Iterable[str] | None = None,
    until: str | None = None,
    progress: bool | ProgressCallback = True,
    **kwargs: Any,
) -> Diagnosis:
    """Diagnose an operator: climb the ladder of rungs on every sample and report each root
    cause once, with where it was registered and what to change.

    ``op``: what :func:`opmagic.resolve` takes (``"ns::name"``, an OpOverload or packet, a
    custom op). The samples: the call's ``args``/``kwargs``, or ``samples``, an iterable of
    ``(args, kwargs)`` pairs or argument tuples; with neither, one is built from the schema as
    the explorer builds it. Pass tensors with ``requires_grad=True`` to check autograd.
    ``rungs`` names the rungs to climb (the others are skipped; :data:`RUNG_NAMES` lists them),
    ``until`` the last one (``until="aot_eager"`` leaves out Inductor, export and AOTInductor,
    which take seconds). ``progress``: a line for ladders that take more than a moment
    (``True``), none (``False``) or a callback taking :class:`~opmagic.SweepProgress`.

    The op, the dispatcher, dynamo's caches, torch's configs and random state are as they
    were afterwards. A sample the kernel itself raises on raises :class:`DoctorSampleError`;
    bad arguments raise :class:`~opmagic.errors.OpmagicError` subclasses naming them.
    """
    selected = _selected(rungs, until)
    if not isinstance(op, str) and not callable(op):
        raise ArgumentTypeError(
            f"doctor: op must be an operator ('ns::name', torch.ops.ns.name, a custom op), "
            f"got {type(op).__name__} {op!r:.60}."
        )
    op, args = unbind(op, args)  # x.add: x is the first argument
    given = given_samples(args, kwargs, samples)
    _, opdef, name = _operator(op, given)
    target = Target.of(op, name, opdef)
    reporter = Reporter(progress, len(selected), task="doctor", unit="rungs")
    results: list[RungResult] = []
    started = time.perf_counter()
    with _isolated():
        collected = given if given is not None else [schema_sample(name)]  # may draw numbers
        ladder = Ladder(target, collected, given is None)
        try:
            for rung in RUNGS:
                if rung.name in selected:
                    reporter.report(len(results), rung.title)
                results.append(_climb(ladder, rung, selected))
        except KeyboardInterrupt:
            results += [
                RungResult(rung.name, rung.title, "skip", "interrupted (Ctrl-C)", 0.0, 0)
                for rung in RUNGS[len(results) :]
            ]
        finally:
            reporter.finish(sum(r.name in selected for r in results if "Ctrl-C" not in r.detail))
    _record_for_export(target, collected, results)
    return Diagnosis(
        name,
        str(target.schema),
        tuple(sample.described for sample in collected),
        tuple(results),
        tuple(ladder.findings),
        time.perf_counter() - started,
    )


def _record_for_export(target: Target, samples: list[Sample], results: list[RungResult]) -> None:
    """In a cell, the gradients the ladder checked become the export's gradcheck cases (its
    opcheck rung records its passing tests through ``torch.library.opcheck``): each sample on
    which the package's test, gradcheck in float64 of every float argument, passes too."""
    session = active_session()
    climbed = {result.name: result.status for result in results}
    if session is None or climbed.get("gradients") != "pass":
        return
    for sample in samples:
        if any(t.requires_grad for t in sample.tensors()):
            fresh = sample.fresh()
            if gradcheck_row(target.overload, fresh.args, fresh.kwargs).status == "pass":
                session.record_check(
                    "gradcheck", target.overload, [CheckSample(sample.args, sample.kwargs)]
                )


def _selected(rungs_asked: Iterable[str] | None, until: str | None) -> set[str]:
    """The rung names to climb, from ``rungs=`` and ``until=``."""
    names = set(RUNG_NAMES)
    if rungs_asked is not None:
        if isinstance(rungs_asked, str):
            rungs_asked = [rungs_asked]
        if not is_list_of_values(rungs_asked):
            raise ArgumentTypeError(
                f"doctor: rungs must be rung names, got {type(rungs_asked).__name__} "
                f"{rungs_asked!r:.60}; the rungs are {', '.join(RUNG_NAMES)}."
            )
        asked = list(rungs_asked)
        unknown = [name for name in asked if name not in RUNG_NAMES]
        if unknown or not all(isinstance(name, str) for name in asked):
            raise ArgumentTypeError(
                f"doctor: unknown rung(s) {unknown or asked!r}; the rungs are "
                f"{', '.join(RUNG_NAMES)}."
            )
        names = set(asked)
    if until is not None:
        if not isinstance(until, str) or until not in RUNG_NAMES:
            raise ArgumentTypeError(
                f"doctor: until={until!r} is not a rung; the rungs are {', '.join(RUNG_NAMES)}."
            )
        names &= set(RUNG_NAMES[: RUNG_NAMES.index(until) + 1])
    return names | {ALWAYS}


def _operator(op: Any, samples: list[Sample] | None) -> tuple[Any, Any, str]:
    """:func:`~opmagic.verify.checks.checked_operator` for the first sample's call; without
    samples, a packet stands for its default overload (as ``dispatch_table`` takes it)."""
    if samples is not None:
        return checked_operator(op, samples[0].args, samples[0].kwargs)
    if not custom_op_state.is_custom_op_def(op):
        ref = op_ref(op)
        if ref.overload is None and "" in overloads_of(ref):
            op = ref.with_overload("").op_overload()
    return checked_operator(op, (), {})


def _climb(ladder: Ladder, rung: Rung, selected: set[str]) -> RungResult:
    """One rung: skipped when not asked for or when a rung it needs failed, else run and timed."""
    if rung.name not in selected:
        return RungResult(rung.name, rung.title, "skip", "not asked for", 0.0, 0)
    broken = [name for name in rung.needs if name in ladder.failed]
    if broken:
        causes = tuple(dict.fromkeys(c for name in broken for c in ladder.failed[name]))
        because = f" ({', '.join(causes)})" if causes else ""
        return RungResult(
            rung.name, rung.title, "skip", f"needs {', '.join(broken)} to pass{because}", 0.0, 0
        )
    ladder.rung, ladder.causes_here = rung.name, []
    started = time.perf_counter()
    status, detail = "pass", ""
    try:
        rung.climb(ladder)
    except RungFailed as failure:
        status, detail = "fail", failure.detail
    except RungSkipped as skip:
        status, detail = "skip", skip.reason
    except DoctorSampleError:
        raise
    except Exception as error:  # a rung the doctor could not run on this op: say so, go on
        status, detail = "skip", f"could not run: {type(error).__name__}: {error}"
    seconds = time.perf_counter() - started
    causes = tuple(dict.fromkeys(ladder.causes_here))
    if status == "fail":
        ladder.failed[rung.name] = causes
    samples = len(ladder.runs) if status != "skip" else 0
    return RungResult(rung.name, rung.title, status, detail, seconds, samples, causes)


@contextlib.contextmanager
def _isolated() -> Iterator[None]:
    """The ladder's side effects kept inside it: torch's random state (samples and gradcheck
    draw numbers), grad mode, and warnings and FakeTensorMode's logs (the rungs' own are not
    the user's: a finding reports the error)."""
    devices = [torch.cuda.current_device()] if torch.cuda.is_initialized() else []
    with (
        torch.random.fork_rng(devices=devices),
        torch.enable_grad(),
        warnings.catch_warnings(),
        compilers.fake_errors_unlogged(),
    ):
        warnings.simplefilter("ignore")
        yield
