"""A call's arguments as the boxed dispatcher sees them: the overload a packet picks, each
argument bound to its schema slot (type-checked by torch's own conversion rules), and the
tensors keys are read from."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

from ..._torch import dispatcher
from ...errors import ArgumentsMismatchError
from ..ops import OpRef, overloads_of
from .messages import (
    argument_type_message,
    both_ways_message,
    missing_argument_message,
    no_overload_message,
    too_many_positional_message,
    unknown_keyword_message,
)

TENSOR_SLOTS = {
    "Tensor": "one",
    "Optional[Tensor]": "one",
    "List[Tensor]": "list",
    "List[Optional[Tensor]]": "list",
}
"""Schema types whose values carry dispatch keys, as one tensor or a list of them."""

_REFUSAL = re.compile(r"Expected a value of type '(?P<type>.+?)' for argument '(?P<name>\w+)'")
_NUMBER = (bool, int, float, complex, torch.SymInt, torch.SymFloat)


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
    """The overload of a packet that ``args``/``kwargs`` call, chosen as torch chooses it.

    torch tries the overloads in its order with the same conversion rules
    :func:`bind_arguments` checks one overload with, so the chosen one always binds.
    """
    try:
        chosen = dispatcher.select_overload(ref.qualname, args, kwargs)
    except (RuntimeError, OverflowError):  # no overload takes them (an int beyond int64)
        chosen = None
    chosen = "" if chosen == "default" else chosen
    if chosen is not None and dispatcher.has_operator(ref.with_overload(chosen).dispatcher_name):
        return chosen
    # no overload takes these arguments, or a TorchScript-only one (aten::add.str) does
    overloads = overloads_of(ref)
    if len(overloads) == 1:  # bind_arguments says what does not fit
        return overloads[0]
    schemas = [str(dispatcher.find_schema(ref.qualname, o)) for o in overloads]
    raise ArgumentsMismatchError(no_overload_message(ref, args, kwargs, schemas))


def bind_arguments(ref: OpRef, schema: Any, args: tuple, kwargs: dict) -> list[BoundArgument]:
    """Match call arguments to the schema's arguments, as the boxed Python call does (a call
    of the wrong shape raises: too many, unknown, repeated or missing arguments)."""
    params = list(schema.arguments)
    positional = [p for p in params if not p.kwarg_only]
    if len(args) > len(positional):
        raise ArgumentsMismatchError(too_many_positional_message(ref, schema, len(args)))
    unknown = [k for k in kwargs if k not in {p.name for p in params}]
    if unknown:
        raise ArgumentsMismatchError(unknown_keyword_message(ref, schema, unknown))
    bound = []
    for i, param in enumerate(params):
        if i < len(args) and not param.kwarg_only:
            if param.name in kwargs:
                raise ArgumentsMismatchError(both_ways_message(ref, param.name))
            value = args[i]
        elif param.name in kwargs:
            value = kwargs[param.name]
        elif param.has_default_value():
            value = param.default_value
        else:
            raise ArgumentsMismatchError(missing_argument_message(ref, schema, param.name))
        bound.append(BoundArgument(param.name, str(param.type), value))
    return bound


def argument_type_refusal(
    ref: OpRef, schema: Any, bound: list[BoundArgument], args: tuple, kwargs: dict
) -> str | None:
    """Why torch's Python call refuses a value of the wrong type, before any kernel runs, or
    ``None`` when it converts every argument (checked by torch's own conversion).

    Ops that take numbers for Tensor arguments (``aten::add``, ``aten::mul``, ...) are
    checked with those numbers standing as tensors, as torch wraps them.
    """
    try:
        dispatcher.check_call_arguments(schema, args, kwargs)
        return None
    except RuntimeError as exc:
        refusal = str(exc)
    if numbers_become_tensors(ref):
        kinds = {argument.name: TENSOR_SLOTS.get(argument.type) for argument in bound}
        names = [p.name for p in schema.arguments]
        try:
            dispatcher.check_call_arguments(
                schema,
                tuple(_as_tensors(v, kinds[names[i]]) for i, v in enumerate(args)),
                {k: _as_tensors(v, kinds[k]) for k, v in kwargs.items()},
            )
            return None
        except RuntimeError as exc:
            refusal = str(exc)
    words = refusal.strip().splitlines()[0]
    match = _REFUSAL.search(words)
    given = {argument.name: argument.value for argument in bound}
    if match is None or match["name"] not in given:
        return argument_type_message(ref, schema, None, None, None, words)
    return argument_type_message(
        ref, schema, match["name"], match["type"], given[match["name"]], words
    )


def numbers_become_tensors(ref: OpRef) -> bool:
    """Whether numbers passed for this op's Tensor arguments become (CPU) tensors."""
    return dispatcher.allows_numbers_as_tensors(ref.qualname)


def _as_tensors(value: Any, kind: str | None) -> Any:
    """``value`` with the numbers in a Tensor slot replaced by tensors, as torch wraps them."""
    if kind == "one" and isinstance(value, _NUMBER):
        return dispatcher.new_scalar_tensor()
    if kind == "list" and isinstance(value, (list, tuple)):
        return [dispatcher.new_scalar_tensor() if isinstance(v, _NUMBER) else v for v in value]
    return value


def dispatch_values(
    arguments: list[BoundArgument], numbers_as_tensors: bool
) -> list[DispatchValue]:
    """The tensors the boxed dispatcher reads keys from: the values of Tensor, Tensor?,
    Tensor[] and Tensor?[] arguments (numbers there, where the op takes them, as the CPU
    tensors torch wraps them in); a tensor passed for another type carries no keys."""
    values = []
    for argument in arguments:
        kind = TENSOR_SLOTS.get(argument.type)
        if kind is None:
            continue
        value = argument.value
        if kind == "one" or isinstance(value, torch.Tensor):
            items = [(argument.name, value)]
        elif isinstance(value, (list, tuple)):
            items = [(f"{argument.name}[{i}]", item) for i, item in enumerate(value)]
        else:
            items = []
        for name, item in items:
            if isinstance(item, torch.Tensor):
                values.append(DispatchValue.of(name, item))
            elif numbers_as_tensors and isinstance(item, _NUMBER):
                values.append(DispatchValue.of(name, dispatcher.new_scalar_tensor()))
    return values
