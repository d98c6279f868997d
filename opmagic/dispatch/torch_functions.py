"""The aten operator behind a torch function or Tensor method a user types.

``torch.add``, ``torch.Tensor.add``, ``x.add`` and ``torch.nn.functional.silu`` stand for the
``aten::add`` and ``aten::silu`` packets. torch says which, in its own objects: a function
made in C (``torch.add``, ``torch.Tensor.add``, ``torch.linalg.norm``) is the Python binding of
the aten operator its ``__name__`` names (``linalg_norm``); a function written in Python
(``F.silu``, ``torch.norm``) stands for an operator when its code calls one family of them
(``silu`` or ``silu_``), found by following the torch functions its code loads, and for none
when it calls several (``torch.norm``) or none (``torch.Tensor.backward``). Only functions
torch makes overridable (``torch.overrides``) count: a user's own function names no operator.
"""

from __future__ import annotations

import dis
import functools
import inspect
import types
from collections.abc import Iterator
from typing import Any

import torch

from .._torch import dispatcher
from ..errors import NotAnOperatorError

MAX_DEPTH = 4
"""How many torch functions deep the calls of a Python function are followed."""

_SHOWN = 6  # operators named in the message for a function that calls several


def aten_name(fn: Any) -> str | None:
    """The ``aten`` operator (``"add"``) a torch function or Tensor method stands for.

    ``None`` for an object torch did not make; raises :class:`NotAnOperatorError`, saying
    what to pass, for a torch function that stands for no operator or for several.
    """
    target = inspect.unwrap(_unbound(fn))
    binding = _binding_name(target)
    if binding is not None:
        if _is_operator(binding):
            return binding
        raise NotAnOperatorError(_not_a_binding_message(_label(fn, target), binding))
    if not isinstance(target, types.FunctionType) or target not in _torch_python_functions():
        return None
    called = _python_function_operators(target)
    families = {_out_of_place(name) for name in called}
    if len(families) == 1:
        return min(called, key=lambda name: (name != target.__name__, name.endswith("_")))
    raise NotAnOperatorError(_python_function_message(_label(fn, target), target, called))


def unbind(op: Any, args: tuple) -> tuple[Any, tuple]:
    """A tensor's bound method (``x.add``) as its unbound method, with the tensor put first
    among the arguments, as the method call passes it; anything else unchanged."""
    owner = getattr(op, "__self__", None)
    if isinstance(owner, torch.Tensor) and callable(op):
        return _unbound(op), (owner, *args)
    return op, args


def _unbound(fn: Any) -> Any:
    """``torch.Tensor.add`` for ``x.add``; ``fn`` itself when it is not a tensor's method."""
    owner = getattr(fn, "__self__", None)
    if not isinstance(owner, torch.Tensor):
        return fn
    return getattr(fn, "__func__", None) or getattr(type(owner), fn.__name__, fn)


def _binding_name(obj: Any) -> str | None:
    """The ``__name__`` of a function torch made in C (a binding), else ``None``."""
    if isinstance(obj, (types.MethodDescriptorType, types.WrapperDescriptorType)):
        owner = obj.__objclass__
        return obj.__name__ if owner is not object and issubclass(torch.Tensor, owner) else None
    made_by_torch = isinstance(obj, types.BuiltinFunctionType) and (
        isinstance(obj.__self__, torch.Tensor) or (obj.__module__ or "").startswith("torch")
    )
    return obj.__name__ if made_by_torch else None


def _is_operator(name: str) -> bool:
    return next(dispatcher.overload_names(f"aten::{name}"), None) is not None


def _returns_tensor(name: str) -> bool:
    """Whether an overload of ``aten::name`` returns a tensor: the others (``dim``, ``size``,
    ``is_complex``) answer questions about their input and compute nothing."""
    return any(
        "Tensor" in str(returned.type)
        for overload in dispatcher.overload_names(f"aten::{name}")
        if (schema := dispatcher.find_schema(f"aten::{name}", overload)) is not None
        for returned in schema.returns
    )


def _out_of_place(name: str) -> str:
    """``relu`` for ``relu_``: an in-place variant belongs to its operator's family."""
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


@functools.cache
def _torch_python_functions() -> frozenset[Any]:
    """torch's overridable functions written in Python (``F.silu``, ``torch.Tensor.norm``)."""
    return frozenset(
        unwrapped
        for functions in torch.overrides.get_overridable_functions().values()
        for fn in functions
        if isinstance(unwrapped := inspect.unwrap(fn), types.FunctionType)
    )


@functools.cache
def _torch_modules() -> frozenset[str]:
    """The modules those functions live in: their helpers are followed too."""
    return frozenset(fn.__module__ for fn in _torch_python_functions())


@functools.cache
def _python_function_operators(fn: types.FunctionType) -> frozenset[str]:
    """The aten operators one of torch's Python functions calls, worked out once: torch's
    code does not change while the process runs."""
    return frozenset(_operators_called(fn, MAX_DEPTH, set()))


def _operators_called(fn: types.FunctionType, depth: int, seen: set[int]) -> set[str]:
    """The aten operators (that return tensors) a torch Python function's code calls, itself
    or through the torch functions it calls, up to ``depth`` functions deep."""
    seen.add(id(fn))
    called: set[str] = set()
    for loaded in _loaded_objects(fn):
        binding = _binding_name(loaded)
        if binding is not None:
            if _is_operator(binding) and _returns_tensor(binding):
                called.add(binding)
            continue
        helper = inspect.unwrap(loaded) if callable(loaded) else None
        if (
            isinstance(helper, types.FunctionType)
            and helper.__module__ in _torch_modules()
            and id(helper) not in seen
            and depth > 0
        ):
            called |= _operators_called(helper, depth - 1, seen)
    return called


_MISSING = object()


def _loaded_objects(fn: types.FunctionType) -> Iterator[Any]:
    """What a function's code loads by name: globals, closure cells and their attributes
    (``torch._C._nn.silu``); an attribute of a local is taken as a tensor's (``x.softmax``)."""
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=True))
    current: Any = _MISSING
    for instruction in dis.get_instructions(fn):
        name, value = instruction.opname, instruction.argval
        if name == "LOAD_GLOBAL":
            current = fn.__globals__.get(value, _MISSING)
        elif name == "LOAD_DEREF":
            current = _cell_contents(cells.get(value))
        elif name.startswith("LOAD_FAST"):
            current = torch.Tensor
        elif name in ("LOAD_ATTR", "LOAD_METHOD") and current is not _MISSING:
            current = getattr(current, value, _MISSING)
        else:
            current = _MISSING
        if current is not _MISSING and current is not torch.Tensor:
            yield current


def _cell_contents(cell: Any) -> Any:
    try:
        return cell.cell_contents if cell is not None else _MISSING
    except ValueError:  # an empty cell
        return _MISSING


def _label(fn: Any, target: Any) -> str:
    """How the user would write the function: ``torch.norm``, ``torch.nn.functional.silu``."""
    target_name = getattr(target, "__name__", "")
    if target_name and getattr(torch, target_name, None) is target:
        return f"torch.{target_name}"
    name = torch.overrides.resolve_name(fn) or torch.overrides.resolve_name(target)
    if name:
        return name
    module = getattr(target, "__module__", None) or "torch"
    return f"{module}.{getattr(target, '__qualname__', target.__name__)}"


def _not_a_binding_message(label: str, name: str) -> str:
    bare = name.strip("_")
    guess = f" (torch.ops.aten.{bare}?)" if bare != name and _is_operator(bare) else ""
    return (
        f"{label} is not the Python binding of an aten operator: torch has no aten::{name}. "
        f"Pass the operator it calls{guess} as torch.ops.aten.<name> or 'aten::<name>'; "
        "opmagic.trace shows which operators a call of it runs."
    )


def _python_function_message(label: str, fn: types.FunctionType, called: frozenset[str]) -> str:
    if not called:
        return (
            f"{label} is Python code that calls no aten operator itself: pass an operator "
            "(torch.ops.aten.<name>, 'ns::name' or a custom op)."
        )
    ranked = sorted(called, key=lambda name: (name != fn.__name__, name))
    shown = ", ".join(f"torch.ops.aten.{name}" for name in ranked[:_SHOWN])
    more = f" and {len(ranked) - _SHOWN} more" if len(ranked) > _SHOWN else ""
    return (
        f"{label} is Python code that calls several operators ({shown}{more}), not one: pass "
        f"the one you mean, e.g. torch.ops.aten.{ranked[0]}. opmagic.trace({label}, ...) "
        "shows which ones a call runs."
    )
