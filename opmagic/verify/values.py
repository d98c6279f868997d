"""Values and errors in a few characters, for the rows of check and compare reports."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def describe_arguments(args: Sequence[Any], kwargs: dict[str, Any]) -> str:
    """Short descriptions of sample arguments (tensors by dtype and shape)."""
    parts = [describe_value(value) for value in args]
    parts += [f"{name}={describe_value(value)}" for name, value in kwargs.items()]
    return "(" + ", ".join(parts) + ")"


def describe_value(value: Any) -> str:
    """A value in a few characters: tensors by dtype and shape (``float32[3]``)."""
    if isinstance(value, torch.Tensor):
        grad = ", requires_grad" if value.requires_grad else ""
        device = "" if value.device.type == "cpu" else f", {value.device}"
        # a strided nested tensor has no sizes: its components are counted instead
        shape = f"nested[{value.size(0)}]" if value.is_nested else str(list(value.shape))
        return f"{dtype_name(value.dtype)}{shape}{device}{grad}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(describe_value(v) for v in value) + "]"
    return repr(value)


def dtype_name(dtype: torch.dtype) -> str:
    """``float32`` for ``torch.float32``."""
    return str(dtype).removeprefix("torch.")


def first_line(error: BaseException) -> str:
    """``Type: first line of the message``, to fit a table cell."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"
