"""One case of a sweep: run the reference and the candidate on fresh copies of its
arguments, compare their results (the arguments afterwards too, for in-place kernels, and with
``backward=True`` the gradients), then time both."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
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
        mismatches: list[Mismatch], errors: tuple, timings: tuple, size: int | None
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

    no_errors, no_timings = (None, None), (None, None, None, None)
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
        actual = candidate(*candidate_args)
        synchronize(device)
    except Exception as error:
        return result(
            [Mismatch("error", "candidate", first_line(error))], no_errors, no_timings, None
        )
    mismatches, errors = compare_results(actual, expected, "output", rtol, atol)
    for index, (after, reference_after) in enumerate(
        zip(candidate_args, reference_args, strict=True)
    ):  # in-place kernels: the arguments afterwards are results too
        if isinstance(reference_after, torch.Tensor):
            mismatches += compare_results(
                after, reference_after, f"argument {index} after the call", rtol, atol
            )[0]
    grad_outputs = None  # with backward=True: the same output gradients for both
    if backward and not any(m.kind in ("structure", "shape") for m in mismatches):
        grad_outputs = [torch.randn_like(t) for t in differentiable(expected)]
        mismatches += _compare_gradients(candidate, reference, args, grad_outputs, rtol, atol)
        if any(m.kind == "error" for m in mismatches):
            grad_outputs = None  # a backward that raises is not timed
    size = sum(_nbytes(t) for t in [*tensors, *tensor_leaves(expected)])
    try:
        timings = (
            measure(lambda: candidate(*args), device, min_run_time),
            measure(lambda: reference(*args), device, min_run_time),
            *(
                _measure_backward(fn, args, grad_outputs, device, min_run_time)
                for fn in (candidate, reference)
            ),
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
        elif a is not None:
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
