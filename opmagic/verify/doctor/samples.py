"""The doctor's samples: the call's arguments, the ``samples`` given, or one built from the
schema as the explorer builds it; fresh copies for every run, and same-shape variants."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from ...dispatch.ops import op_parameters, op_ref
from ...errors import ArgumentTypeError, is_list_of_values
from ..samples import call_arguments, plan_arguments
from ..values import describe_arguments


@dataclass(frozen=True)
class Sample:
    """One call's arguments."""

    args: tuple
    kwargs: dict[str, Any]

    @property
    def described(self) -> str:
        """``(float32[3], 2)``."""
        return describe_arguments(self.args, self.kwargs)

    def fresh(self) -> Sample:
        """A copy whose tensors are new (same values, strides, requires_grad): every run gets
        its own, so a kernel that mutates its arguments cannot change the next run's."""
        return self.mapped(_copy)

    def variant(self) -> Sample:
        """Same shapes, dtypes and devices, other values (floating tensors redrawn): an
        output whose size changes with it depends on the data."""
        return self.mapped(_redrawn)

    def mapped(self, fn: Callable[[torch.Tensor], Any]) -> Sample:
        """The sample with ``fn`` applied to each of its tensors (lists and tuples followed)."""

        args = tuple(_map_tensors(fn, value) for value in self.args)
        return Sample(args, {name: _map_tensors(fn, v) for name, v in self.kwargs.items()})

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor of the sample, in argument order."""
        found: list[torch.Tensor] = []
        self.mapped(found.append)
        return found


def given_samples(
    args: tuple, kwargs: dict[str, Any], samples: Iterable[Any] | None
) -> list[Sample] | None:
    """The samples given: ``samples`` (an iterable of ``(args, kwargs)`` pairs or argument
    tuples), else the call's ``args``/``kwargs`` as the one sample; ``None`` when neither is
    given (build one from the schema with :func:`schema_sample`)."""
    if samples is None:
        return [Sample(tuple(args), dict(kwargs))] if args or kwargs else None
    if args or kwargs:
        raise ArgumentTypeError("doctor: give the call's arguments or samples=[...], not both.")
    if not is_list_of_values(samples):
        raise ArgumentTypeError(
            f"doctor: samples must be an iterable of (args, kwargs) pairs or argument "
            f"tuples, got {type(samples).__name__} {samples!r:.60}."
        )
    collected = [_sample(item, index) for index, item in enumerate(samples)]
    if not collected:
        raise ArgumentTypeError("doctor: samples is empty; give at least one sample.")
    return collected


def schema_sample(name: str) -> Sample:
    """A sample built from the schema of ``name`` as the explorer builds it: 2 x 2 float32
    tensors and the simplest values."""
    built_args, built_kwargs = call_arguments(plan_arguments(op_parameters(op_ref(name))))
    return Sample(built_args, built_kwargs)


def _sample(item: Any, index: int) -> Sample:
    """One item of ``samples``: ``(args, kwargs)`` or an argument tuple."""
    if (
        isinstance(item, (tuple, list))
        and len(item) == 2
        and isinstance(item[0], (tuple, list))
        and isinstance(item[1], dict)
    ):
        args, kwargs = item
    elif isinstance(item, (tuple, list)):
        args, kwargs = item, {}
    else:
        raise ArgumentTypeError(
            f"doctor: sample {index} must be an argument tuple or an (args, kwargs) pair, got "
            f"{type(item).__name__} {item!r:.60}; write (x,) for one argument."
        )
    if not all(isinstance(key, str) for key in kwargs):
        raise ArgumentTypeError(f"doctor: sample {index}'s kwargs must be named by strings.")
    return Sample(tuple(args), dict(kwargs))


def _map_tensors(fn: Callable[[torch.Tensor], Any], value: Any) -> Any:
    """``value`` with ``fn`` applied to each tensor in it (lists and tuples followed)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_map_tensors(fn, item) for item in value)
    return value


def _copy(tensor: torch.Tensor) -> torch.Tensor:
    """A new tensor with the same values, sizes, requires_grad and (for dense tensors) strides."""
    return tensor.detach().clone().requires_grad_(tensor.requires_grad)


def _redrawn(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor like ``tensor`` with new random values when it is floating point (integer and
    boolean tensors are often indices or masks: they stay)."""
    copy = _copy(tensor)
    if tensor.is_floating_point() and tensor.numel():
        with torch.no_grad():
            copy.normal_()
    return copy
