"""``CallContext``: resolve a call under the thread-local state a user would call it in.

``resolve`` reads the current thread-local state; this module sets that state up the way a
user's code would (``torch.no_grad()``, ``torch.inference_mode()``, ``torch.autocast``,
``FakeTensorMode``, a logging ``TorchDispatchMode``, ``torch.func.vmap``) and resolves
inside it. The command line, the ``%dispatch`` magic and the explorer share it (their
options are declared once, in ``opmagic.magics.arguments.CONTEXT_OPTIONS``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from .._torch import compilers, dispatcher
from ..errors import ArgumentTypeError, OpmagicError
from .ops import op_ref
from .resolve import Resolution, resolve
from .torch_functions import unbind
from .trace import Trace, trace


@dataclass(frozen=True)
class CallContext:
    """The thread-local state to resolve a call in; every field off means "as things are"."""

    no_grad: bool = False
    inference_mode: bool = False
    autocast: str | None = None  # a device type ("cpu", "cuda"), or None for autocast off
    vmap: bool = False  # vmap over dim 0 of every tensor argument
    fake: bool = False  # FakeTensorMode, the tensor arguments converted with mode.from_tensor
    logging: bool = False  # a TorchDispatchMode that logs each operator and runs it

    def __post_init__(self) -> None:
        for name in ("no_grad", "inference_mode", "vmap", "fake", "logging"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ArgumentTypeError(f"CallContext: {name} is True or False, got {value!r:.60}.")
        if self.autocast is not None and (
            not isinstance(self.autocast, str) or not self.autocast.isidentifier()
        ):
            raise ArgumentTypeError(
                "CallContext: autocast is a device type such as 'cpu' or 'cuda', or None for "
                f"autocast off; got {self.autocast!r:.60}."
            )

    def words(self) -> list[str]:
        """The options that are on, in words (``["no_grad", "autocast cpu"]``)."""
        words = [
            name for name in ("no_grad", "inference_mode", "vmap", "fake") if getattr(self, name)
        ]
        if self.autocast:
            words.append(f"autocast {self.autocast}")
        if self.logging:
            words.append("logging mode")
        return words

    def resolve(self, op: Any, *args: Any, **kwargs: Any) -> Resolution:
        """``opmagic.resolve(op, *args, **kwargs)`` inside this context; nothing runs."""
        op, args = unbind(op, args)  # x.add: x is converted (faked, batched) with the rest
        with self._entered() as convert:
            args, kwargs = _map_tensors(convert, args, kwargs)
            if self.vmap:
                return _resolve_vmapped(op, args, kwargs)
            return resolve(op, *args, **kwargs)

    def trace(self, op: Any, *args: Any, **kwargs: Any) -> Trace:
        """``opmagic.trace`` of one call of ``op`` inside this context: the call runs (on fake
        tensors under ``fake``; mapped over dim 0 of its tensor arguments under ``vmap``),
        then, when a tensor argument requires grad and an output does, its backward: the
        gradients of the outputs' sum with respect to those arguments."""
        op, args = unbind(op, args)
        ref = op_ref(op)
        overload = ref.packet() if ref.overload is None else ref.op_overload()
        with self._entered() as convert:
            args, kwargs = _map_tensors(convert, args, kwargs)
            if not self.vmap:
                return trace(_with_backward, overload, args, kwargs)

            def body(*batched: torch.Tensor) -> Any:
                """Inside vmap: the call with the BatchedTensors put back in place."""
                remaining = iter(batched)
                inner_args, inner_kwargs = _map_tensors(lambda _: next(remaining), args, kwargs)
                return overload(*inner_args, **inner_kwargs)

            return trace(torch.func.vmap(body), *_batched_tensors(args, kwargs))

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """This context around a block of code (``%%trace``): under ``fake``, the tensors the
        code creates are fake. ``vmap`` maps a function over its arguments, so it is refused."""
        if self.vmap:
            raise OpmagicError(
                "--vmap maps a function over its tensor arguments, and a block of code has "
                "none: call torch.func.vmap(f)(x) inside the code instead."
            )
        with self._entered():
            yield

    @contextlib.contextmanager
    def _entered(self) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
        """Enter the context; yields how to convert a tensor argument for it."""
        with contextlib.ExitStack() as stack:
            convert: Callable[[torch.Tensor], torch.Tensor] = _same
            if self.fake:
                mode = compilers.fake_mode()
                convert = functools.partial(_faked, mode)
            if self.no_grad:
                stack.enter_context(torch.no_grad())
            if self.inference_mode:
                stack.enter_context(torch.inference_mode())
            if self.autocast:
                try:
                    stack.enter_context(torch.autocast(self.autocast))
                except RuntimeError as exc:
                    raise OpmagicError(
                        f"autocast cannot be turned on for device {self.autocast!r}: {exc}. "
                        "Use a device type this torch supports, e.g. 'cpu'."
                    ) from exc
            if self.fake:
                stack.enter_context(compilers.fake_errors_unlogged())
                stack.enter_context(mode)
            if self.logging:
                stack.enter_context(dispatcher.new_logging_dispatch_mode([]))
            yield convert


def _faked(mode: Any, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as a fake tensor of ``mode``; a kind FakeTensorMode cannot fake (quantized,
    nested) is refused, naming it."""
    try:
        return mode.from_tensor(tensor)
    except Exception as exc:  # torch raises several types here, none of them the user's
        kind = "quantized" if tensor.is_quantized else "nested" if tensor.is_nested else "this"
        raise ArgumentTypeError(
            f"fake (FakeTensorMode) cannot make a fake of a {kind} tensor argument "
            f"({type(exc).__name__}: {exc}). Turn fake off for this call, or pass a plain "
            "strided tensor."
        ) from None


def _with_backward(op: Any, args: tuple, kwargs: dict) -> Any:
    """``op(*args, **kwargs)``, then the gradients of its outputs' sums with respect to the
    arguments that require grad, when there are both (what the call's backward runs)."""
    result = op(*args, **kwargs)
    inputs: list[torch.Tensor] = []
    _map_tensors(lambda t: inputs.append(t) if t.requires_grad else None, args, kwargs)
    outputs: list[torch.Tensor] = []
    _map_tensors(lambda t: outputs.append(t) if t.requires_grad else None, (result,), {})
    if inputs and outputs:
        torch.autograd.grad([t.sum() for t in outputs], inputs, allow_unused=True)
    return result


def _same(tensor: torch.Tensor) -> torch.Tensor:
    """The identity conversion: the tensor as it is."""
    return tensor


def _map_tensors(
    fn: Callable[[torch.Tensor], Any], args: tuple, kwargs: dict
) -> tuple[tuple, dict[str, Any]]:
    """Apply ``fn`` to every tensor argument, including those inside lists and tuples."""

    def one(value: Any) -> Any:
        """``value`` with ``fn`` applied to it or to the tensors it holds."""
        if isinstance(value, torch.Tensor):
            return fn(value)
        if isinstance(value, (list, tuple)):
            return type(value)(one(v) for v in value)
        return value

    return tuple(one(a) for a in args), {k: one(v) for k, v in kwargs.items()}


def _batched_tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensor arguments vmap maps over (dim 0 of each); none, or a 0-dim one, is refused."""
    tensors: list[torch.Tensor] = []
    _map_tensors(tensors.append, args, kwargs)
    if not tensors:
        raise OpmagicError(
            "vmap needs at least one tensor argument to map over; pass a tensor whose dim 0 "
            "is the batch."
        )
    if any(t.dim() == 0 for t in tensors):
        raise OpmagicError(
            "vmap maps over dim 0 of every tensor argument, and a 0-dim tensor has none: give "
            "each tensor argument a leading batch dimension."
        )
    return tensors


def _resolve_vmapped(op: Any, args: tuple, kwargs: dict) -> Resolution:
    """Resolve inside ``torch.func.vmap``: the arguments arrive as BatchedTensors, as in a vmap."""
    tensors = _batched_tensors(args, kwargs)
    found: list[Resolution] = []

    def body(*batched: torch.Tensor) -> torch.Tensor:
        """Inside vmap: put the BatchedTensors back in place and resolve the call."""
        remaining = iter(batched)
        inner_args, inner_kwargs = _map_tensors(lambda _: next(remaining), args, kwargs)
        found.append(resolve(op, *inner_args, **inner_kwargs))
        return batched[0]

    try:
        torch.func.vmap(body)(*tensors)
    except OpmagicError:
        raise
    except Exception as exc:
        if found:  # vmap failed after resolve, on wrapping the output: the answer stands
            return found[0]
        raise OpmagicError(
            f"vmap could not map over these arguments: {exc}. Every tensor argument needs the "
            "same size in dim 0 (the batch)."
        ) from exc
    return found[0]
