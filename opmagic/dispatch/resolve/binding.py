"""A call's arguments as the boxed dispatcher sees them: the overload a packet picks, each
argument bound to its schema slot (with type checks), and the tensors keys are read from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..._torch import dispatcher
from ...errors import ArgumentsMismatchError
from ..ops import OpRef, overloads_of


@dataclass(frozen=True)
class BoundArgument:
    """One schema argument and the value the call gives it (passed, or the default)."""

    name: str
    type: str  # the schema type, as torch prints it ("Tensor", "Optional[Tensor]", ...)
    value: Any


@dataclass(frozen=True)
class DispatchValue:
    """A tensor the dispatcher reads keys from, with the keys it carries at this point.

    Kernels change what the next dispatch sees (a math-bit fallback clears its bit, the
    Fake fallback swaps in meta tensors, functorch unwraps), so the keyset travels with it.
    """

    name: str  # the argument, with an index for list items ("tensors[1]")
    tensor: torch.Tensor
    keyset: int  # raw DispatchKeySet bits

    @classmethod
    def of(cls, name: str, tensor: torch.Tensor) -> DispatchValue:
        """The value of ``tensor`` with the keys it carries now."""
        return cls(name, tensor, dispatcher.tensor_keyset_raw(tensor))

    def unwrapped(self, inner: torch.Tensor) -> DispatchValue:
        """The same argument, now the tensor a wrapper held (with that tensor's keys)."""
        return DispatchValue.of(self.name, inner)

    def with_keyset(self, keyset: int) -> DispatchValue:
        """The same tensor, read by the next dispatch as carrying ``keyset``."""
        return DispatchValue(self.name, self.tensor, keyset)


def select_overload(ref: OpRef, args: tuple, kwargs: dict) -> str:
    """The overload of a packet that ``args``/``kwargs`` call, chosen as torch chooses it."""
    overloads = overloads_of(ref)
    if len(overloads) == 1:
        return overloads[0]
    try:
        chosen = dispatcher.select_overload(ref.qualname, args, kwargs)
    except RuntimeError as exc:
        schemas = "\n  ".join(str(dispatcher.find_schema(ref.qualname, o)) for o in overloads)
        given = ", ".join(
            [_type_name(a) for a in args] + [f"{k}={_type_name(v)}" for k, v in kwargs.items()]
        )
        raise ArgumentsMismatchError(
            f"No overload of {ref.qualname} accepts ({given}). Its overloads are:\n  {schemas}\n"
            f"Pass arguments matching one of them, or name one ('{ref.qualname}.<overload>')."
        ) from exc
    return "" if chosen == "default" else chosen


def bind_arguments(ref: OpRef, schema: Any, args: tuple, kwargs: dict) -> list[BoundArgument]:
    """Match call arguments to the schema's arguments, as the boxed Python call does."""
    params = list(schema.arguments)
    positional = [p for p in params if not p.kwarg_only]
    if len(args) > len(positional):
        raise ArgumentsMismatchError(
            f"{ref} takes at most {len(positional)} positional arguments, got {len(args)}.\n"
            f"Schema: {schema}"
        )
    unknown = [k for k in kwargs if k not in {p.name for p in params}]
    if unknown:
        raise ArgumentsMismatchError(
            f"{ref} has no argument named {', '.join(map(repr, unknown))}.\nSchema: {schema}"
        )
    bound = []
    for i, param in enumerate(params):
        if i < len(args) and not param.kwarg_only:
            if param.name in kwargs:
                raise ArgumentsMismatchError(
                    f"{ref} got argument {param.name!r} both by position and by keyword."
                )
            value = args[i]
        elif param.name in kwargs:
            value = kwargs[param.name]
        elif param.has_default_value():
            value = param.default_value
        else:
            raise ArgumentsMismatchError(
                f"{ref} is missing the required argument {param.name!r}.\nSchema: {schema}"
            )
        _check_tensor_type(ref, param.name, str(param.type), value)
        bound.append(BoundArgument(param.name, str(param.type), value))
    return bound


def _check_tensor_type(ref: OpRef, name: str, type_str: str, value: Any) -> None:
    """Tensor-typed parameters must get tensors: anything else is a clear error."""
    if type_str.replace("Optional[", "").replace("List[", "").rstrip("]") != "Tensor":
        return
    optional_items = "Optional[Tensor]" in type_str
    if type_str.startswith("List["):
        if isinstance(value, (list, tuple)) and all(
            isinstance(v, torch.Tensor) or (optional_items and v is None) for v in value
        ):
            return
        raise ArgumentsMismatchError(
            f"Argument {name!r} of {ref} must be a list of Tensors"
            f"{' (or None)' if optional_items else ''}, got {_type_name(value)}."
        )
    if isinstance(value, torch.Tensor) or (type_str.startswith("Optional[") and value is None):
        return
    raise ArgumentsMismatchError(
        f"Argument {name!r} of {ref} must be a Tensor, got {_type_name(value)}. "
        "Wrap numbers with torch.tensor(...) or pick an overload that takes a Scalar."
    )


def _type_name(value: Any) -> str:
    """A short type for error messages: ``Tensor``, ``list[Tensor, int 2]``, ``float 2.0``."""
    if isinstance(value, torch.Tensor):
        return "Tensor"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_type_name(v) for v in value[:3])
        return f"{type(value).__name__}[{inner}{', ...' if len(value) > 3 else ''}]"
    return f"{type(value).__name__} {value!r}"[:60]


def dispatch_values(arguments: list[BoundArgument]) -> list[DispatchValue]:
    """The tensors the boxed dispatcher reads keys from: Tensor, Tensor?, Tensor[], Tensor?[]."""
    values = []
    for argument in arguments:
        if isinstance(argument.value, torch.Tensor):
            values.append(DispatchValue.of(argument.name, argument.value))
        elif isinstance(argument.value, (list, tuple)) and "Tensor" in argument.type:
            values.extend(
                DispatchValue.of(f"{argument.name}[{i}]", item)
                for i, item in enumerate(argument.value)
                if isinstance(item, torch.Tensor)
            )
    return values
