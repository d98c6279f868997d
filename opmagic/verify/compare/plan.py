"""A sweep's plan: its cases, from an inputs builder (device x dtype x size) or a list of
argument tuples, each with the size, dtype and device its rows are labelled with."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ...errors import CompareError
from ...native.cuda.toolkit import gpu_unavailable_reason
from ..values import dtype_name
from .result import case_label

DEFAULT_SIZES = (1 << 10, 1 << 14, 1 << 18, 1 << 22)


@dataclass(frozen=True)
class Case:
    """One case of a sweep: how to build its arguments, and what it is called."""

    size: int | None
    dtype: torch.dtype | None
    device: torch.device | None
    build: Callable[[], Any]  # returns the argument tuple (or the single argument)

    @property
    def label(self) -> str:
        """How the progress bar names the case."""
        dtype = dtype_name(self.dtype) if self.dtype is not None else "-"
        return case_label(dtype, str(self.device or "-"), self.size)


def plan(
    inputs: Callable[..., Any] | Sequence[Any],
    sizes: Iterable[int] | None,
    dtypes: Iterable[torch.dtype | str] | None,
    devices: Iterable[torch.device | str] | None,
) -> list[Case]:
    """The sweep's cases: device x dtype x size through the builder, or the given list."""
    for what, value in (("sizes", sizes), ("dtypes", dtypes), ("devices", devices)):
        if value is not None and (isinstance(value, str) or not isinstance(value, Iterable)):
            raise CompareError(f"{what} must be a list (or None for the default), got {value!r}.")
    if callable(inputs):
        size_list = _sizes(sizes)
        dtype_list = [_dtype(d) for d in (dtypes or [torch.float32])]
        device_list = [_device(d) for d in (devices or [_default_device()])]
        return [
            Case(size, dtype, device, _builder(inputs, size, dtype, device))
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
            arguments = inputs(size, dtype, device)
        except Exception as error:
            raise CompareError(
                f"inputs({size}, {dtype}, {str(device)!r}) raised {type(error).__name__}: "
                f"{error}. The inputs builder must make the arguments of every case."
            ) from error
        _check_tensors(as_arguments(arguments))
        return arguments

    return build


def _listed_case(arguments: Any) -> Case:
    """A case from an argument tuple of a list: size, dtype and device from its tensors."""
    tensors = _check_tensors(as_arguments(arguments))
    largest = max(tensors, key=torch.Tensor.numel, default=None)
    return Case(
        largest.numel() if largest is not None else None,
        tensors[0].dtype if tensors else None,
        tensors[0].device if tensors else None,
        lambda: arguments,
    )


def _check_tensors(arguments: tuple) -> list[torch.Tensor]:
    """The tensor arguments of a case, refused when compare cannot judge them: meta tensors
    hold no values, and torch.testing.assert_close takes no nested tensors."""
    tensors = [a for a in arguments if isinstance(a, torch.Tensor)]
    for tensor in tensors:
        if tensor.is_meta:
            raise CompareError(
                "A case's arguments are meta tensors: they have shapes and dtypes but no values "
                "to compare or time. Use cpu (or cuda) tensors; to check a meta kernel, use "
                "opmagic.check_op or opmagic.doctor."
            )
        if tensor.is_nested:
            raise CompareError(
                "A case's arguments are nested tensors, which compare cannot judge "
                "(torch.testing.assert_close takes none): pass plain tensors, e.g. "
                "nested.to_padded_tensor(0)."
            )
    return tensors


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


def _device(value: torch.device | str) -> torch.device:
    """A device that can run kernels here; CUDA without a GPU says why not."""
    try:
        device = torch.device(value)
    except (RuntimeError, TypeError, ValueError) as error:
        raise CompareError(f"{value!r} is not a device: {error}") from None
    if device.type == "meta":
        raise CompareError(
            "Cannot compare on 'meta': meta tensors have no values to compare or time. Use "
            "cpu (or cuda); to check a meta kernel, use opmagic.check_op or opmagic.doctor."
        )
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


def as_arguments(arguments: Any) -> tuple:
    """A builder's result as an argument tuple: a tuple is the arguments, else the one."""
    return arguments if isinstance(arguments, tuple) else (arguments,)
