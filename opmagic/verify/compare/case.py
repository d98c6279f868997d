"""One case of a sweep: run the reference and the candidate on fresh copies of its
arguments, compare their results (the arguments afterwards too, for in-place kernels, and with
``backward=True`` the gradients), then time both.

The candidate runs with every tensor it allocates filled with NaN (or an integer type's
largest value) at first, as ``torch.use_deterministic_algorithms`` fills new memory: an output
element it never writes then differs from the reference's, instead of passing with whatever
the allocator handed back (often the reference's own result, freed a moment before). An
argument the candidate changes while the reference leaves it as it was is a ``mutation``.
Each function is timed on arguments of its own, so that one's writes cannot slow the other.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from ...cells.history import CheckSample, UnkeptValue, kept_sample
from ...errors import CompareError
from ..values import describe_arguments, dtype_name, first_line
from .closeness import compare_results, compare_tensors, differentiable, tensor_leaves
from .plan import Case, as_arguments
from .result import CaseResult, Mismatch
from .timing import measure, synchronize

if TYPE_CHECKING:
    from torch.utils.benchmark import Measurement

# a case whose tensors (arguments and the reference's results) are at most this large is
# kept for the export's tests: the default sweep's two smaller sizes are, per dtype and device
KEPT_CASE_BYTES = 256 << 10
# a case's greatest absolute and relative errors; its four timings (as in CaseResult)
_Errors = tuple["float | None", "float | None"]
_Timings = tuple[
    "Measurement | None", "Measurement | None", "Measurement | None", "Measurement | None"
]


def run_case(
    candidate: Callable[..., Any],
    reference: Callable[..., Any],
    case: Case,
    rtol: float | None,
    atol: float | None,
    backward: bool,
    min_run_time: float,
    kept: list[CheckSample] | None = None,
) -> CaseResult:
    """Check, then time, the candidate against the reference on one case; ``kept`` gets the
    case's arguments and what the reference made of them when they are small
    (:data:`KEPT_CASE_BYTES`: the export makes tests of them)."""
    args = as_arguments(case.build())
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    dtype = case.dtype or (tensors[0].dtype if tensors else None)
    device = case.device or (tensors[0].device if tensors else torch.device("cpu"))

    def result(
        mismatches: list[Mismatch], errors: _Errors, timings: _Timings, size: int | None
    ) -> CaseResult:
        return CaseResult(
            case.size,
            dtype_name(dtype) if dtype is not None else "-",
            str(device),
            describe_arguments(args, {}),
            tuple(mismatches),
            *errors,
            *timings,
            size,
        )

    no_errors: _Errors = (None, None)
    no_timings: _Timings = (None, None, None, None)
    reference_args, candidate_args = _fresh(args), _fresh(args)
    try:
        expected = reference(*reference_args)
        synchronize(device)  # a kernel's asynchronous error belongs to the call that ran it
    except Exception as error:
        return result(
            [Mismatch("error", "reference", first_line(error))], no_errors, no_timings, None
        )
    if kept is not None and _case_bytes(args, expected) <= KEPT_CASE_BYTES:
        with contextlib.suppress(UnkeptValue):  # copies now: timing may change the arguments
            kept.append(kept_sample(CheckSample(args, {}, expected, reference_args)))
    try:
        with new_memory_filled():
            actual = candidate(*candidate_args)
            synchronize(device)
    except Exception as error:
        return result(
            [Mismatch("error", "candidate", first_line(error))], no_errors, no_timings, None
        )
    mismatches, errors = compare_results(actual, expected, "output", rtol, atol)
    mismatches += _arguments_afterwards(args, candidate_args, reference_args, rtol, atol)
    grad_outputs = None  # with backward=True: the same output gradients for both
    if backward and not any(m.kind in ("structure", "shape") for m in mismatches):
        grad_outputs = [torch.randn_like(t) for t in differentiable(expected)]
        mismatches += _compare_gradients(candidate, reference, args, grad_outputs, rtol, atol)
        if any(m.kind == "error" for m in mismatches):
            grad_outputs = None  # a backward that raises is not timed
    size = sum(_nbytes(t) for t in [*tensors, *tensor_leaves(expected)])
    candidate_args, reference_args = _fresh(args), _fresh(args)  # each times on its own
    try:
        timings: _Timings = (
            measure(lambda: candidate(*candidate_args), device, min_run_time),
            measure(lambda: reference(*reference_args), device, min_run_time),
            _measure_backward(candidate, args, grad_outputs, device, min_run_time),
            _measure_backward(reference, args, grad_outputs, device, min_run_time),
        )
    except Exception as error:  # e.g. a CUDA error surfacing at the timer's synchronise
        mismatches.append(Mismatch("error", "timing", first_line(error)))
        timings = no_timings
    return result(mismatches, errors, timings, size)


def _case_bytes(args: tuple, expected: Any) -> int:
    """Bytes of a case's tensors: its arguments and what the reference returned."""
    return sum(_nbytes(t) for t in [*tensor_leaves(args), *tensor_leaves(expected)])


def _fresh(args: tuple) -> tuple:
    """Copies of the tensor arguments (same strides), so in-place kernels change neither."""
    return tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args)


@contextlib.contextmanager
def new_memory_filled() -> Iterator[None]:
    """Tensors allocated inside start as NaN (integers: their largest value): torch's
    ``fill_uninitialized_memory`` under ``use_deterministic_algorithms``, in its warn-only
    form (an op without a deterministic kernel still runs, its warning dropped). The
    settings are restored after."""
    # torch swaps this module's class at import for one with the property; its stubs lack it
    fill: Any = torch.utils.deterministic
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        fill.fill_uninitialized_memory,
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have a deterministic implementation")
        torch.use_deterministic_algorithms(True, warn_only=True)
        fill.fill_uninitialized_memory = True
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(before[0], warn_only=before[1])
            fill.fill_uninitialized_memory = before[2]


def _arguments_afterwards(
    args: tuple,
    candidate_args: tuple,
    reference_args: tuple,
    rtol: float | None,
    atol: float | None,
) -> list[Mismatch]:
    """The tensor arguments after both calls: one the reference changes (an in-place kernel)
    is a result to compare; one only the candidate changes is a ``mutation``."""
    mismatches = []
    for index, (before, after, reference_after) in enumerate(
        zip(args, candidate_args, reference_args, strict=True)
    ):
        if not isinstance(reference_after, torch.Tensor):
            continue
        if _unchanged(before, reference_after) and not _unchanged(before, after):
            detail = (
                "the candidate changed it and the reference does not: a kernel writes only its "
                "outputs (and the arguments its schema marks as mutated)"
            )
            mismatches.append(Mismatch("mutation", f"argument {index}", detail))
        else:
            where = f"argument {index} after the call"
            mismatches += compare_results(after, reference_after, where, rtol, atol)[0]
    return mismatches


def _unchanged(before: torch.Tensor, after: torch.Tensor) -> bool:
    """Whether a tensor argument is as it was: the same shape, strides and bits (NaNs too)."""
    return (
        before.shape == after.shape
        and before.stride() == after.stride()
        and before.dtype == after.dtype
        and bool(torch.equal(before, after) or _same_nans(before, after))
    )


def _same_nans(before: torch.Tensor, after: torch.Tensor) -> bool:
    """Whether two floating-point tensors differ only where both are NaN."""
    if not (before.is_floating_point() or before.is_complex()):
        return False
    both_nan = torch.isnan(before) & torch.isnan(after)
    return bool(torch.equal(before[~both_nan], after[~both_nan]))


def _nbytes(tensor: torch.Tensor) -> int:
    """Bytes of a tensor's elements."""
    return tensor.numel() * tensor.element_size()


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
    outputs = differentiable(fn(*leaves))
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
        with new_memory_filled():
            actual = _gradients(candidate, args, grad_outputs)
    except Exception as error:
        return [Mismatch("error", "backward of the candidate", first_line(error))]
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
        elif a is not None and e is not None:
            mismatches += compare_tensors(a, e, where, rtol, atol)[0]
    return mismatches


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
        outputs = differentiable(fn(*leaves))
        torch.autograd.grad(outputs, wanted, grad_outputs, allow_unused=True)

    return measure(step, device, min_run_time)
