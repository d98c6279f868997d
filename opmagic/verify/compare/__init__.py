"""``compare``: check a candidate kernel against a reference and time both, case by case.

The prototyping loop is: write a kernel, check its numbers against the torch ops it replaces,
time both across sizes and dtypes, change it, repeat. :func:`compare` does the middle part
for a sweep of cases. For every case it

- builds the arguments (``inputs(size, dtype, device)``, or one of a list of argument tuples),
- runs the reference and the candidate on fresh copies of them and compares what they return
  (and the arguments afterwards, for in-place kernels): structure, type, shape, dtype, device,
  strides, NaNs, then the values with ``torch.testing.assert_close`` and torch's default
  tolerances for the dtype unless ``rtol``/``atol`` are given; each mismatch is named,
- with ``backward=True``, compares the gradients of every floating-point tensor argument,
- times both with ``torch.utils.benchmark.Timer.blocked_autorange``, synchronising the
  case's device on every clock read when it is an accelerator (a CUDA kernel's time is its
  run time, not its launch time), and derives the speedup and the achieved bandwidth.

A sweep that takes more than a moment shows a progress bar; Ctrl-C stops it and the
:class:`Comparison` keeps the cases measured so far.

The parts: ``plan`` (the cases), ``case`` (running one), ``closeness`` (how results differ),
``timing`` (``torch.utils.benchmark`` on a synchronised clock), ``progress`` (the bar or a
callback), ``result`` (:class:`Comparison` and its rows). How results look lives in
``opmagic.view.compare``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from ..._torch import dispatcher
from ...cells.history import CheckSample, operator_label
from ...cells.session import active_session
from ...dispatch.ops import op_ref
from ...errors import CompareError, OpmagicError
from .case import run_case
from .closeness import tolerances as described_tolerances
from .plan import DEFAULT_SIZES, plan
from .progress import ProgressCallback, Reporter
from .result import MISMATCH_KINDS, CaseResult, Comparison, Mismatch, SweepProgress
from .timing import DEFAULT_MIN_RUN_TIME, MAX_MIN_RUN_TIME

__all__ = [
    "DEFAULT_MIN_RUN_TIME",
    "DEFAULT_SIZES",
    "MISMATCH_KINDS",
    "CaseResult",
    "Comparison",
    "Mismatch",
    "SweepProgress",
    "as_callable",
    "callable_name",
    "compare",
]


def compare(
    candidate: Any,
    reference: Any,
    inputs: Callable[..., Any] | Sequence[Any],
    *,
    sizes: Iterable[int] | None = None,
    dtypes: Iterable[torch.dtype | str] | None = None,
    devices: Iterable[torch.device | str] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    backward: bool = False,
    min_run_time: float = DEFAULT_MIN_RUN_TIME,
    names: tuple[str, str] | None = None,
    progress: bool | ProgressCallback = True,
) -> Comparison:
    """Check ``candidate`` against ``reference`` and time both, for every case of a sweep.

    ``candidate`` and ``reference`` are callables or operators (``"ns::name"``, ``torch.ops``
    objects, custom ops). ``inputs(size, dtype, device)`` builds one case's arguments (a
    tuple is the argument list, anything else the only argument) for every device x dtype x
    size, defaulting to ``DEFAULT_SIZES``, float32 and ``cuda`` when a GPU is here (else
    ``cpu``); or ``inputs`` is a list of argument tuples, used as they are. ``rtol`` and
    ``atol`` (given together) replace torch's default tolerances for the dtype.
    ``backward=True`` also compares and times the gradients of the floating-point tensor
    arguments. ``min_run_time`` is how long each function is measured per case. ``names``
    labels the two (default: their own names). ``progress``: a bar for sweeps that take
    more than a moment (``True``), none (``False``) or a callback taking
    :class:`SweepProgress`.

    Mismatches and exceptions of the two functions are rows of the result, not errors;
    Ctrl-C stops the sweep and returns the cases measured so far (``interrupted=True``).
    Raises :class:`~opmagic.errors.CompareError` for arguments that cannot make a sweep.
    """
    candidate_fn, candidate_name = as_callable(candidate, "candidate")
    reference_fn, reference_name = as_callable(reference, "reference")
    if names is not None:
        if not (
            isinstance(names, (list, tuple))
            and len(names) == 2
            and all(isinstance(n, str) for n in names)
        ):
            raise CompareError(f"names must be two labels, (candidate, reference); got {names!r}.")
        candidate_name, reference_name = names
    tolerances = described_tolerances(rtol, atol)
    if (
        isinstance(min_run_time, bool)
        or not isinstance(min_run_time, (int, float))
        or not 0 < min_run_time <= MAX_MIN_RUN_TIME
    ):
        raise CompareError(
            f"min_run_time is seconds to measure each function per case, above 0 and at most "
            f"{MAX_MIN_RUN_TIME:g}; got {min_run_time!r}."
        )
    cases = plan(inputs, sizes, dtypes, devices)
    reporter = Reporter(progress, len(cases))
    rows: list[CaseResult] = []
    session, candidate_op = active_session(), operator_label(candidate_fn)
    # the small cases an operator is compared on, for the export's tests
    kept: list[CheckSample] | None = [] if session is not None and candidate_op else None
    interrupted = False
    try:
        for case in cases:
            reporter.report(len(rows), case.label)
            rows.append(
                run_case(
                    candidate_fn, reference_fn, case, rtol, atol, backward, min_run_time, kept
                )
            )
    except KeyboardInterrupt:
        interrupted = True
    finally:
        reporter.finish(len(rows))
    if session is not None and candidate_op is not None and kept:
        session.record_check(
            "compare", candidate_op, kept, reference=reference_name, rtol=rtol, atol=atol
        )
    return Comparison(
        candidate_name,
        reference_name,
        tuple(rows),
        len(cases),
        backward,
        tolerances,
        interrupted,
    )


def as_callable(value: Any, role: str) -> tuple[Callable[..., Any], str]:
    """A function to call and its name, from a callable or an operator name."""
    if isinstance(value, str):
        try:
            ref = op_ref(value)
        except OpmagicError as error:
            raise CompareError(f"The {role} {value!r} is not an operator: {error}") from None
        packet = getattr(getattr(torch.ops, ref.namespace), ref.name)
        return (packet if ref.overload is None else ref.op_overload()), str(ref)
    if not callable(value):
        raise CompareError(
            f"The {role} must be a callable or an operator ('ns::name', torch.ops.ns.name, a "
            f"custom op), not {type(value).__name__} {value!r}."
        )
    return value, callable_name(value)


def callable_name(fn: Any) -> str:
    """``aten::add.Tensor``, ``mylib::myadd``, ``torch.add``, ``my_function``, ..."""
    parts = dispatcher.operator_parts(fn)
    if parts is not None:
        namespace, name, overload = parts
        return f"{namespace}::{name}" + (f".{overload}" if overload else "")
    module = getattr(fn, "__module__", None) or ""
    if module.split(".")[0] == "torch" and hasattr(fn, "__name__"):
        return f"{module}.{fn.__name__}"  # torch.add, torch.nn.functional.relu
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
