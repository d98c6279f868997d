"""Closeness: how a candidate's results differ from the reference's, each difference named
(structure, type, shape, dtype, device, strides, NaNs, then the values by
``torch.testing.assert_close`` with torch's default tolerances for the dtype, or the given
``rtol``/``atol``), with the largest absolute and relative errors."""

from __future__ import annotations

import re
from typing import Any

import torch

from ...errors import CompareError
from ..values import describe_value, dtype_name
from .result import Mismatch


def tolerances(rtol: float | None, atol: float | None) -> str:
    """How values are judged, in words, for ``rtol``/``atol`` checked to be given together."""
    for what, value in (("rtol", rtol), ("atol", atol)):
        if value is not None and (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not 0 <= value < float("inf")  # NaN compares false: no tolerance at all
        ):
            raise CompareError(f"{what} must be a finite number >= 0 or None, got {value!r}.")
    if rtol is None and atol is None:
        return "torch's default tolerances per dtype"
    if rtol is None or atol is None:
        raise CompareError(
            "Give rtol and atol together (torch.testing.assert_close needs both), or neither "
            "to use torch's default tolerances for each dtype."
        )
    return f"rtol={rtol:g}, atol={atol:g}"


def leaves(value: Any, where: str) -> list[tuple[str, Any]]:
    """(where, value) of every leaf of nested tuples, lists and dicts."""
    if isinstance(value, (tuple, list)):
        return [leaf for i, item in enumerate(value) for leaf in leaves(item, f"{where}[{i}]")]
    if isinstance(value, dict):
        return [leaf for k, item in value.items() for leaf in leaves(item, f"{where}[{k!r}]")]
    return [(where, value)]


def tensor_leaves(value: Any) -> list[torch.Tensor]:
    """The tensors among a result's leaves."""
    return [leaf for _, leaf in leaves(value, "") if isinstance(leaf, torch.Tensor)]


def differentiable(value: Any) -> list[torch.Tensor]:
    """The floating-point (or complex) tensors of a result: what gradients flow from."""
    return [t for t in tensor_leaves(value) if t.is_floating_point() or t.is_complex()]


def compare_results(
    actual: Any, expected: Any, where: str, rtol: float | None, atol: float | None
) -> tuple[list[Mismatch], tuple[float | None, float | None]]:
    """The mismatches between two results, and the largest absolute and relative errors."""
    actual_leaves, expected_leaves = leaves(actual, where), leaves(expected, where)
    if [w for w, _ in actual_leaves] != [w for w, _ in expected_leaves]:
        detail = f"{describe_value(actual)} vs reference {describe_value(expected)}"
        return [Mismatch("structure", where, detail)], (None, None)
    mismatches: list[Mismatch] = []
    abs_errors, rel_errors = [], []
    for (leaf_where, a), (_, e) in zip(actual_leaves, expected_leaves, strict=True):
        if isinstance(a, torch.Tensor) and isinstance(e, torch.Tensor):
            found, errors = compare_tensors(a, e, leaf_where, rtol, atol)
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


def compare_tensors(
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
        detail = f"{dtype_name(actual.dtype)} vs reference {dtype_name(expected.dtype)}"
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


# the candidate runs with new tensors filled with NaN (see case.py)
_UNWRITTEN = "; new tensors start as NaN, so these may be elements the candidate never wrote"


def _nan_mismatches(
    actual: torch.Tensor, expected: torch.Tensor, where: str
) -> tuple[torch.Tensor, list[Mismatch]]:
    """NaNs where the reference has numbers (and the reverse), named with their first index;
    returns ``actual`` with those elements set to the reference's, for the value check."""
    actual_nan, expected_nan = torch.isnan(actual), torch.isnan(expected)
    mismatches = []
    for mask, what, why in (
        (actual_nan & ~expected_nan, "NaN where the reference is not", _UNWRITTEN),
        (expected_nan & ~actual_nan, "numbers where the reference is NaN", ""),
    ):
        count = int(mask.sum())
        if count:
            first = tuple(int(i) for i in torch.nonzero(mask)[0])
            detail = f"{count} of {mask.numel()} elements are {what} (first at index {first})"
            mismatches.append(Mismatch("NaN", where, detail + why))
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
