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
:class:`Comparison` keeps the cases measured so far. How results look lives in
``opmagic.view.compare``.
"""

from __future__ import annotations

import re
import time
import timeit
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from .._torch import dispatcher
from ..dispatch.ops import op_ref
from ..display import Displayable
from ..errors import CompareError, OpmagicError
from ..native.cuda.toolkit import gpu_unavailable_reason
from .checks import describe_arguments, describe_value

if TYPE_CHECKING:
    import pandas
    from matplotlib.figure import Figure
    from torch.utils.benchmark import Measurement

DEFAULT_SIZES = (1 << 10, 1 << 14, 1 << 18, 1 << 22)
DEFAULT_MIN_RUN_TIME = 0.2  # seconds blocked_autorange measures each function per case
PROGRESS_DELAY_S = 0.5  # a sweep shows its progress bar once it has run this long

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
    """How far a sweep is: reported before every case and when it ends."""

    done: int  # cases finished
    total: int
    case: str  # the case running now ("" when finished)
    elapsed: float  # seconds since the sweep started
    finished: bool = False
    stopped: bool = False  # ended before every case ran (Ctrl-C, or an error)


ProgressCallback = Callable[[SweepProgress], None]


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
    for what, value in (("rtol", rtol), ("atol", atol)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise CompareError(f"{what} must be a number or None, got {value!r}.")
    if (rtol is None) != (atol is None):
        raise CompareError(
            "Give rtol and atol together (torch.testing.assert_close needs both), or neither "
            "to use torch's default tolerances for each dtype."
        )
    if not isinstance(min_run_time, (int, float)) or not min_run_time > 0:
        raise CompareError(f"min_run_time is seconds to measure, above 0; got {min_run_time}.")
    cases = _plan(inputs, sizes, dtypes, devices)
    tolerances = (
        "torch's default tolerances per dtype" if rtol is None else f"rtol={rtol:g}, atol={atol:g}"
    )
    reporter = _Reporter(progress, len(cases))
    rows: list[CaseResult] = []
    interrupted = False
    try:
        for case in cases:
            reporter.report(len(rows), case.label)
            rows.append(
                _run_case(candidate_fn, reference_fn, case, rtol, atol, backward, min_run_time)
            )
    except KeyboardInterrupt:
        interrupted = True
    finally:
        reporter.finish(len(rows))
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


@dataclass(frozen=True)
class _Case:
    """One case of a sweep: how to build its arguments, and what it is called."""

    size: int | None
    dtype: torch.dtype | None
    device: torch.device | None
    build: Callable[[], Any]  # returns the argument tuple (or the single argument)

    @property
    def label(self) -> str:
        """How the progress bar names the case."""
        dtype = _dtype_name(self.dtype) if self.dtype is not None else "-"
        return case_label(dtype, str(self.device or "-"), self.size)


def case_label(dtype: str, device: str, size: int | None) -> str:
    """A case in a few words: ``"float32 cpu, size 4096"``."""
    return f"{dtype} {device}" + (f", size {size}" if size is not None else "")


def _plan(
    inputs: Callable[..., Any] | Sequence[Any],
    sizes: Iterable[int] | None,
    dtypes: Iterable[torch.dtype | str] | None,
    devices: Iterable[torch.device | str] | None,
) -> list[_Case]:
    """The sweep's cases: device x dtype x size through the builder, or the given list."""
    for what, value in (("sizes", sizes), ("dtypes", dtypes), ("devices", devices)):
        if value is not None and (isinstance(value, str) or not isinstance(value, Iterable)):
            raise CompareError(f"{what} must be a list (or None for the default), got {value!r}.")
    if callable(inputs):
        size_list = _sizes(sizes)
        dtype_list = [_dtype(d) for d in (dtypes or [torch.float32])]
        device_list = [_device(d) for d in (devices or [_default_device()])]
        return [
            _Case(size, dtype, device, _builder(inputs, size, dtype, device))
            for device in device_list
            for dtype in dtype_list
            for size in size_list
        ]
    if isinstance(inputs, (list, tuple)) and inputs:
        given = [
            name
            for name, value in (("sizes", sizes), ("dtypes", dtypes), ("devices", devices))
            if value is not None
        ]
        if given:
            raise CompareError(
                f"{', '.join(given)} go with an inputs builder, inputs(size, dtype, device); a "
                "list of argument tuples is used as it is. Drop them, or pass a builder."
            )
        return [_listed_case(arguments) for arguments in inputs]
    raise CompareError(
        "inputs must build one case's arguments, inputs(size, dtype, device) -> tuple, or be a "
        f"non-empty list of argument tuples; got {type(inputs).__name__} {inputs!r}."
    )


def _builder(
    inputs: Callable[..., Any], size: int, dtype: torch.dtype, device: torch.device
) -> Callable[[], Any]:
    """Calls ``inputs(size, dtype, device)``, naming the case when the builder raises."""

    def build() -> Any:
        try:
            return inputs(size, dtype, device)
        except Exception as error:
            raise CompareError(
                f"inputs({size}, {dtype}, {str(device)!r}) raised {type(error).__name__}: "
                f"{error}. The inputs builder must make the arguments of every case."
            ) from error

    return build


def _listed_case(arguments: Any) -> _Case:
    """A case from an argument tuple of a list: size, dtype and device from its tensors."""
    tensors = [a for a in _as_tuple(arguments) if isinstance(a, torch.Tensor)]
    largest = max(tensors, key=torch.Tensor.numel, default=None)
    return _Case(
        largest.numel() if largest is not None else None,
        tensors[0].dtype if tensors else None,
        tensors[0].device if tensors else None,
        lambda: arguments,
    )


def _sizes(sizes: Iterable[int] | None) -> list[int]:
    """The sizes to sweep, checked to be non-negative integers."""
    chosen = list(DEFAULT_SIZES if sizes is None else sizes)
    if not chosen:
        raise CompareError("sizes is empty: give at least one size, or None for the defaults.")
    for size in chosen:
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise CompareError(f"sizes must be non-negative integers; got {size!r}.")
    return chosen


def _dtype(value: torch.dtype | str) -> torch.dtype:
    """A torch dtype from itself or its name (``"float16"``, ``"torch.bfloat16"``, ``"half"``)."""
    if isinstance(value, torch.dtype):
        return value
    found = getattr(torch, str(value).removeprefix("torch."), None)
    if not isinstance(found, torch.dtype):
        raise CompareError(
            f"{value!r} is not a torch dtype: use a name such as float32, float16, bfloat16, "
            "float64 or int32 (or the torch.dtype itself)."
        )
    return found


def _dtype_name(dtype: torch.dtype) -> str:
    """``float32`` for ``torch.float32``."""
    return str(dtype).removeprefix("torch.")


def _device(value: torch.device | str) -> torch.device:
    """A device that can run kernels here; CUDA without a GPU says why not."""
    try:
        device = torch.device(value)
    except (RuntimeError, TypeError, ValueError) as error:
        raise CompareError(f"{value!r} is not a device: {error}") from None
    if device.type == "cuda":
        reason = gpu_unavailable_reason()
        if reason is not None:
            raise CompareError(f"Cannot compare on {str(value)!r}. {reason}")
        if device.index is None:  # rows and headings say which GPU ran
            device = torch.device("cuda", torch.cuda.current_device())
    return device


def _default_device() -> torch.device:
    """CUDA when a GPU can run kernels here, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _as_tuple(arguments: Any) -> tuple:
    """A builder's result as an argument tuple: a tuple is the arguments, else the one."""
    return arguments if isinstance(arguments, tuple) else (arguments,)


def _run_case(
    candidate: Callable[..., Any],
    reference: Callable[..., Any],
    case: _Case,
    rtol: float | None,
    atol: float | None,
    backward: bool,
    min_run_time: float,
) -> CaseResult:
    """Check, then time, the candidate against the reference on one case."""
    args = _as_tuple(case.build())
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    dtype = case.dtype or (tensors[0].dtype if tensors else None)
    device = case.device or (tensors[0].device if tensors else torch.device("cpu"))

    def result(
        mismatches: list[Mismatch], errors: tuple, timings: tuple, size: int | None
    ) -> CaseResult:
        return CaseResult(
            case.size,
            _dtype_name(dtype) if dtype is not None else "-",
            str(device),
            describe_arguments(args, {}),
            tuple(mismatches),
            *errors,
            *timings,
            size,
        )

    no_errors, no_timings = (None, None), (None, None, None, None)
    reference_args, candidate_args = _fresh(args), _fresh(args)
    try:
        expected = reference(*reference_args)
        _synchronize(device)  # a kernel's asynchronous error belongs to the call that ran it
    except Exception as error:
        return result(
            [Mismatch("error", "reference", _first_line(error))], no_errors, no_timings, None
        )
    try:
        actual = candidate(*candidate_args)
        _synchronize(device)
    except Exception as error:
        return result(
            [Mismatch("error", "candidate", _first_line(error))], no_errors, no_timings, None
        )
    mismatches, errors = _compare_results(actual, expected, "output", rtol, atol)
    for index, (after, reference_after) in enumerate(
        zip(candidate_args, reference_args, strict=True)
    ):  # in-place kernels: the arguments afterwards are results too
        if isinstance(reference_after, torch.Tensor):
            mismatches += _compare_results(
                after, reference_after, f"argument {index} after the call", rtol, atol
            )[0]
    grad_outputs = None  # with backward=True: the same output gradients for both
    if backward and not any(m.kind in ("structure", "shape") for m in mismatches):
        grad_outputs = [torch.randn_like(t) for t in _differentiable(expected)]
        mismatches += _compare_gradients(candidate, reference, args, grad_outputs, rtol, atol)
        if any(m.kind == "error" for m in mismatches):
            grad_outputs = None  # a backward that raises is not timed
    size = sum(_nbytes(t) for t in [*tensors, *_tensor_leaves(expected)])
    try:
        timings = (
            _measure(lambda: candidate(*args), device, min_run_time),
            _measure(lambda: reference(*args), device, min_run_time),
            *(
                _measure_backward(fn, args, grad_outputs, device, min_run_time)
                for fn in (candidate, reference)
            ),
        )
    except Exception as error:  # e.g. a CUDA error surfacing at the timer's synchronise
        mismatches.append(Mismatch("error", "timing", _first_line(error)))
        timings = no_timings
    return result(mismatches, errors, timings, size)


def _fresh(args: tuple) -> tuple:
    """Copies of the tensor arguments (same strides), so in-place kernels change neither."""
    return tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args)


def _nbytes(tensor: torch.Tensor) -> int:
    """Bytes of a tensor's elements."""
    return tensor.numel() * tensor.element_size()


def _leaves(value: Any, where: str) -> list[tuple[str, Any]]:
    """(where, value) of every leaf of nested tuples, lists and dicts."""
    if isinstance(value, (tuple, list)):
        return [leaf for i, item in enumerate(value) for leaf in _leaves(item, f"{where}[{i}]")]
    if isinstance(value, dict):
        return [leaf for k, item in value.items() for leaf in _leaves(item, f"{where}[{k!r}]")]
    return [(where, value)]


def _tensor_leaves(value: Any) -> list[torch.Tensor]:
    """The tensors among a result's leaves."""
    return [leaf for _, leaf in _leaves(value, "") if isinstance(leaf, torch.Tensor)]


def _differentiable(value: Any) -> list[torch.Tensor]:
    """The floating-point (or complex) tensors of a result: what gradients flow from."""
    return [t for t in _tensor_leaves(value) if t.is_floating_point() or t.is_complex()]


def _compare_results(
    actual: Any, expected: Any, where: str, rtol: float | None, atol: float | None
) -> tuple[list[Mismatch], tuple[float | None, float | None]]:
    """The mismatches between two results, and the largest absolute and relative errors."""
    actual_leaves, expected_leaves = _leaves(actual, where), _leaves(expected, where)
    if [w for w, _ in actual_leaves] != [w for w, _ in expected_leaves]:
        detail = f"{describe_value(actual)} vs reference {describe_value(expected)}"
        return [Mismatch("structure", where, detail)], (None, None)
    mismatches: list[Mismatch] = []
    abs_errors, rel_errors = [], []
    for (leaf_where, a), (_, e) in zip(actual_leaves, expected_leaves, strict=True):
        if isinstance(a, torch.Tensor) and isinstance(e, torch.Tensor):
            found, errors = _compare_tensors(a, e, leaf_where, rtol, atol)
            mismatches += found
            if errors is not None:
                abs_errors.append(errors[0])
                rel_errors.append(errors[1])
        else:
            mismatches += _compare_values(a, e, leaf_where, rtol, atol)
    if not abs_errors:
        return mismatches, (None, None)
    return mismatches, (max(abs_errors), max(rel_errors))


def _compare_values(
    actual: Any, expected: Any, where: str, rtol: float | None, atol: float | None
) -> list[Mismatch]:
    """Two non-tensor leaves (numbers, None, ...) or a tensor against something else."""
    if isinstance(actual, torch.Tensor) != isinstance(expected, torch.Tensor) or (
        type(actual) is not type(expected) and not _both_numbers(actual, expected)
    ):
        detail = f"{describe_value(actual)} vs reference {describe_value(expected)}"
        return [Mismatch("type", where, detail)]
    if _both_numbers(actual, expected):
        try:
            torch.testing.assert_close(
                actual, expected, rtol=rtol, atol=atol, equal_nan=True, check_dtype=False
            )
        except AssertionError:
            return [Mismatch("values", where, f"{actual!r} vs reference {expected!r}")]
        return []
    if actual != expected:
        return [Mismatch("values", where, f"{actual!r} vs reference {expected!r}")]
    return []


def _both_numbers(a: Any, b: Any) -> bool:
    """Whether both are Python numbers (int, float, complex; bools aside)."""
    numbers = (int, float, complex)
    return all(isinstance(v, numbers) and not isinstance(v, bool) for v in (a, b))


def _compare_tensors(
    actual: torch.Tensor,
    expected: torch.Tensor,
    where: str,
    rtol: float | None,
    atol: float | None,
) -> tuple[list[Mismatch], tuple[float, float] | None]:
    """Shape, dtype, device, strides, NaNs, then values (``assert_close``) of two tensors."""
    if actual.shape != expected.shape:
        detail = f"{list(actual.shape)} vs reference {list(expected.shape)}"
        return [Mismatch("shape", where, detail)], None
    mismatches = []
    if actual.dtype != expected.dtype:
        detail = f"{_dtype_name(actual.dtype)} vs reference {_dtype_name(expected.dtype)}"
        mismatches.append(Mismatch("dtype", where, detail))
    if actual.device != expected.device:
        mismatches.append(
            Mismatch("device", where, f"{actual.device} vs reference {expected.device}")
        )
        actual = actual.to(expected.device)
    if actual.layout != torch.strided or expected.layout != torch.strided:
        return mismatches, None  # sparse and other layouts: assert_close alone decides
    if _significant_strides(actual) != _significant_strides(expected):
        detail = f"{actual.stride()} vs reference {expected.stride()}"
        mismatches.append(Mismatch("stride", where, detail))
    if actual.is_floating_point() or actual.is_complex():
        actual, found = _nan_mismatches(actual, expected, where)
        mismatches += found
    try:
        torch.testing.assert_close(
            actual, expected, rtol=rtol, atol=atol, equal_nan=True, check_dtype=False
        )
    except AssertionError as error:
        mismatches.append(Mismatch("values", where, _closeness_detail(str(error))))
    return mismatches, _errors(actual, expected)


def _significant_strides(tensor: torch.Tensor) -> tuple[int | None, ...]:
    """Strides of the dimensions longer than 1 (the others' strides never matter)."""
    return tuple(s if n > 1 else None for n, s in zip(tensor.shape, tensor.stride(), strict=True))


def _nan_mismatches(
    actual: torch.Tensor, expected: torch.Tensor, where: str
) -> tuple[torch.Tensor, list[Mismatch]]:
    """NaNs where the reference has numbers (and the reverse), named with their first index;
    returns ``actual`` with those elements set to the reference's, for the value check."""
    actual_nan, expected_nan = torch.isnan(actual), torch.isnan(expected)
    mismatches = []
    for mask, what in (
        (actual_nan & ~expected_nan, "NaN where the reference is not"),
        (expected_nan & ~actual_nan, "numbers where the reference is NaN"),
    ):
        count = int(mask.sum())
        if count:
            first = tuple(int(i) for i in torch.nonzero(mask)[0])
            detail = f"{count} of {mask.numel()} elements are {what} (first at index {first})"
            mismatches.append(Mismatch("NaN", where, detail))
    if mismatches:
        actual = torch.where(actual_nan != expected_nan, expected.to(actual.dtype), actual)
    return actual, mismatches


_MISMATCHED = re.compile(r"Mismatched elements: (\d+) / (\d+) \(([^)]*)\)")
_GREATEST = re.compile(r"Greatest absolute difference: (.*)")


def _closeness_detail(message: str) -> str:
    """``3 / 4096 elements differ (0.1%); the greatest by 0.5 at index (17,) (up to 1e-05
    allowed)`` from ``assert_close``'s message (its own lines if they read otherwise)."""
    mismatched, greatest = _MISMATCHED.search(message), _GREATEST.search(message)
    if mismatched is None or greatest is None:
        lines = [line.strip() for line in message.splitlines()[1:] if line.strip()]
        return "; ".join(lines) or message.strip()
    count, total, share = mismatched.groups()
    return f"{count} / {total} elements differ ({share}); the greatest by {greatest[1]}"


def _errors(actual: torch.Tensor, expected: torch.Tensor) -> tuple[float, float] | None:
    """The largest absolute and relative differences where both are finite (NaNs and
    infinities are judged by the checks, not averaged into numbers)."""
    if actual.numel() == 0:
        return 0.0, 0.0
    wide = torch.complex128 if actual.is_complex() or expected.is_complex() else torch.float64
    a, e = actual.detach().to(wide), expected.detach().to(wide)
    finite = torch.isfinite(a) & torch.isfinite(e)
    if not bool(finite.any()):
        return None
    difference = (a - e).abs()[finite].to(torch.float64)
    scale = e.abs()[finite].to(torch.float64)
    relative = torch.where(difference == 0, torch.zeros_like(difference), difference / scale)
    return float(difference.max()), float(relative.max())


def _grad_leaves(args: tuple) -> tuple[tuple, list[torch.Tensor]]:
    """The arguments with every floating-point tensor a fresh leaf needing grad, and those."""
    leaves = tuple(
        a.detach().clone().requires_grad_(True)
        if isinstance(a, torch.Tensor) and (a.is_floating_point() or a.is_complex())
        else a
        for a in args
    )
    return leaves, [a for a in leaves if isinstance(a, torch.Tensor) and a.requires_grad]


def _gradients(
    fn: Callable[..., Any], args: tuple, grad_outputs: list[torch.Tensor]
) -> tuple[torch.Tensor | None, ...]:
    """d(outputs . grad_outputs)/d(each floating-point tensor argument); None: unused."""
    leaves, wanted = _grad_leaves(args)
    if not wanted:
        raise CompareError(
            "backward=True needs a floating-point tensor argument to take gradients for; "
            f"the arguments are {describe_arguments(args, {})}."
        )
    outputs = _differentiable(fn(*leaves))
    return torch.autograd.grad(outputs, wanted, grad_outputs, allow_unused=True)


def _compare_gradients(
    candidate: Callable[..., Any],
    reference: Callable[..., Any],
    args: tuple,
    grad_outputs: list[torch.Tensor],
    rtol: float | None,
    atol: float | None,
) -> list[Mismatch]:
    """The gradients of both for the same output gradients, compared argument by argument."""
    expected = _gradients(reference, args, grad_outputs)  # a failing reference is the user's
    try:
        actual = _gradients(candidate, args, grad_outputs)
    except Exception as error:
        return [Mismatch("error", "backward of the candidate", _first_line(error))]
    positions = [
        i
        for i, a in enumerate(args)
        if isinstance(a, torch.Tensor) and (a.is_floating_point() or a.is_complex())
    ]
    mismatches = []
    for index, a, e in zip(positions, actual, expected, strict=True):
        where = f"grad of argument {index}"
        if (a is None) != (e is None):
            detail = "none" if a is None else "a tensor"
            mismatches.append(
                Mismatch(
                    "values",
                    where,
                    f"the candidate gives {detail}, the reference "
                    f"{'a tensor' if a is None else 'none'}",
                )
            )
        elif a is not None:
            mismatches += _compare_tensors(a, e, where, rtol, atol)[0]
    return mismatches


def _measure(run: Callable[[], Any], device: torch.device, min_run_time: float) -> Measurement:
    """``run``'s time per call from ``torch.utils.benchmark`` (blocked autorange).

    On an accelerator every clock read first waits for the device (``torch.cuda.synchronize``),
    so the time is the kernels' run time, not how long launching them took.
    """
    from torch.utils import benchmark

    return benchmark.Timer(
        "run()",
        globals={"run": run},
        timer=_clock(device),
        num_threads=torch.get_num_threads(),  # as the op runs outside the benchmark
    ).blocked_autorange(min_run_time=min_run_time)


def _measure_backward(
    fn: Callable[..., Any],
    args: tuple,
    grad_outputs: list[torch.Tensor] | None,
    device: torch.device,
    min_run_time: float,
) -> Measurement | None:
    """The time of forward + backward (None without ``backward=True``)."""
    if grad_outputs is None:
        return None
    leaves, wanted = _grad_leaves(args)

    def step() -> None:
        outputs = _differentiable(fn(*leaves))
        torch.autograd.grad(outputs, wanted, grad_outputs, allow_unused=True)

    return _measure(step, device, min_run_time)


def _clock(device: torch.device) -> Callable[[], float]:
    """The benchmark's clock for ``device``: synchronised with it unless it is the CPU."""
    if device.type == "cpu":
        return timeit.default_timer

    def synchronised() -> float:
        _synchronize(device)
        return timeit.default_timer()

    return synchronised


def _synchronize(device: torch.device) -> None:
    """Wait for the kernels queued on ``device`` (nothing to wait for on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return
    accelerator = torch.accelerator.current_accelerator()
    if accelerator is not None and accelerator.type == device.type:  # xpu, mps, ...
        torch.accelerator.synchronize(device)


def _first_line(error: BaseException) -> str:
    """``Type: first line of the message``, to fit a table cell."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


class _Reporter:
    """Sends a sweep's progress to a callback, or shows it once the sweep has taken
    :data:`PROGRESS_DELAY_S` (through the ``"live"`` view of :class:`SweepProgress`)."""

    def __init__(self, progress: bool | ProgressCallback, total: int) -> None:
        self.callback = progress if callable(progress) else None
        self.show = progress is True
        self.total = total
        self.started = time.perf_counter()
        self.live: Any = None  # what shows the bar, once it is shown

    def report(self, done: int, case: str) -> None:
        """Case ``done + 1`` is starting."""
        self._send(SweepProgress(done, self.total, case, self._elapsed()))

    def finish(self, done: int) -> None:
        """The sweep ended, after ``done`` cases (fewer than planned: it was stopped)."""
        stopped = done < self.total
        self._send(SweepProgress(done, self.total, "", self._elapsed(), True, stopped))

    def _elapsed(self) -> float:
        return time.perf_counter() - self.started

    def _send(self, event: SweepProgress) -> None:
        if self.callback is not None:
            self.callback(event)
        elif self.live is not None:
            self.live.update(event)
        elif self.show and event.elapsed >= PROGRESS_DELAY_S:
            self.live = event.view("live")
