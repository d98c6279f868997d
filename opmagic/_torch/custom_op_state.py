"""Private torch APIs of ``torch.library.custom_op`` internals: its CustomOpDef registry and
the Python state its ``register_*`` companions set, read and diffed for the session.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

_C = torch._C


def custom_op_def(qualname: str) -> Any | None:
    """The ``CustomOpDef`` behind a ``torch.library.custom_op`` operator, if any."""
    from torch._library import custom_ops

    return custom_ops.OPDEFS.get(qualname)


def custom_op_parts(opdef: Any) -> dict[str, Any]:
    """The Python pieces of a ``CustomOpDef``: default impl, device kernels, fake, autograd."""
    return {
        "impl": opdef._init_fn,
        "device_kernels": dict(opdef._backend_fns),
        "fake": opdef._abstract_fn,
        "backward": opdef._backward_fn,
        "setup_context": opdef._setup_context_fn,
        "vmap": getattr(opdef, "_vmap_fn", None),
        "autocast": dict(getattr(opdef, "_autocast_dtype", {}) or {}),
        "torch_dispatch": dict(getattr(opdef, "_torch_dispatch_fns", {}) or {}),
    }


def custom_op_function(opdef: Any) -> Any:
    """The function a ``CustomOpDef`` was made from: the decorated one for ``custom_op``, the
    launcher for ``triton_op`` (which wraps it in a function of its own)."""
    from . import triton

    return triton.triton_op_launcher(opdef._init_fn) or opdef._init_fn


def registered_fake_impl(qualname: str) -> Any | None:
    """The fake (abstract) impl registered for an operator with ``register_fake``, if any."""
    from torch._library import simple_registry

    kernel = simple_registry.singleton.find(qualname).fake_impl.kernel
    return None if kernel is None else unwrap_registered_function(getattr(kernel, "func", kernel))


def registered_torch_dispatch_rule(qualname: str, mode_type: type) -> Any | None:
    """The ``register_torch_dispatch`` rule of an operator for a mode or subclass type, if any."""
    from torch._library import simple_registry

    return simple_registry.singleton.find(qualname).torch_dispatch_rules.find(mode_type)


def unwrap_registered_function(fn: Any) -> Any:
    """The user's function inside the wrappers torch.library puts around registered ones.

    ``CustomOpDef.register_kernel`` keeps it in a closure cell named ``fn``,
    ``register_fake`` in one named ``func``; ``functools.wraps`` chains are followed too.
    """
    fn = inspect.unwrap(fn)
    code = getattr(fn, "__code__", None)
    if code is None or not fn.__closure__:
        return fn
    for name in ("fn", "func"):
        if name in code.co_freevars:
            inner = fn.__closure__[code.co_freevars.index(name)].cell_contents
            return unwrap_registered_function(inner) if callable(inner) else fn
    return fn


def custom_op_can_fake_trivially(op_overload: Any) -> bool:
    """Whether custom_op generates a fake impl by itself (ops that return nothing)."""
    from torch._library import utils

    return utils.can_generate_trivial_fake_impl(op_overload)


def is_custom_op_def(value: Any) -> bool:
    """Whether a value is what ``torch.library.custom_op`` returns."""
    from torch._library.custom_ops import CustomOpDef

    return isinstance(value, CustomOpDef)


def custom_op_library(qualname: str) -> Any | None:
    """The Library ``custom_op`` made for an operator, if any."""
    from torch._library import custom_ops

    return custom_ops.OPDEF_TO_LIB.get(qualname)


def set_custom_op_entry(qualname: str, opdef: Any | None, library: Any | None) -> None:
    """Set (``None``: remove) the CustomOpDef and Library torch keeps for ``qualname``, and
    the Triton kernels it keeps for a ``triton_op`` (those of the CustomOpDef's launcher)."""
    from torch._library import custom_ops

    from . import triton

    for table, value in ((custom_ops.OPDEFS, opdef), (custom_ops.OPDEF_TO_LIB, library)):
        if value is None:
            table.pop(qualname, None)
        else:
            table[qualname] = value
    launcher = triton.triton_op_launcher(opdef._init_fn) if opdef is not None else None
    triton.sync_op_kernels(qualname, launcher)


# ---------------------------------------------------------------- custom_op's dispatch shortcut
#
# From torch 2.14, custom_op turns on a Python-side dispatch of its OpOverload ("PyObject
# dispatch", ``OpOverload._enable_pyobj_dispatch``): ``_op`` becomes a function that computes
# the dispatch key itself and calls a Python kernel directly, so no RecordFunction hook sees
# the call; the C++ dispatcher's handle is kept beside it in ``_cpp_dispatch_handle``.


def has_dispatch_shortcut(op_overload: Any) -> bool:
    """Whether calls of an OpOverload take torch's Python-side dispatch shortcut."""
    return getattr(op_overload, "_pyobj_dispatcher", None) is not None


def rebind_dispatch_shortcut(op_overload: Any, shortcut: bool) -> None:
    """Make the C++ handle kept beside ``op_overload._op`` (just pointed at a re-created
    dispatcher entry) and, when ``shortcut``, the Python-side dispatch shortcut for that
    entry too: the old ones point at the entry that went away."""
    if "_cpp_dispatch_handle" in vars(op_overload):
        op_overload._cpp_dispatch_handle = op_overload._op
    if shortcut:
        op_overload._pyobj_dispatcher = None
        op_overload._enable_pyobj_dispatch(True)


def dispatch_shortcuts_off() -> Callable[[], None]:
    """Send the calls of every custom_op operator through the C++ dispatcher (and so past
    its RecordFunction hook, which trace observes) until the returned function turns the
    shortcuts it turned off back on."""
    from torch._library import custom_ops

    overloads = [
        opdef._opoverload
        for opdef in custom_ops.OPDEFS.values()
        if has_dispatch_shortcut(opdef._opoverload)
    ]
    for op_overload in overloads:
        op_overload._enable_pyobj_dispatch(False)

    def restore() -> None:
        for op_overload in overloads:
            op_overload._enable_pyobj_dispatch(True)

    return restore


# ---------------------------------------------------------------- custom_op Python state

# the CustomOpDef attributes that its companions (register_kernel, register_fake, ...) set
_CUSTOM_OP_DICTS = ("_backend_fns", "_torch_dispatch_fns", "_autocast_dtype")
_CUSTOM_OP_VALUES = ("_abstract_fn", "_setup_context_fn", "_backward_fn", "_vmap_fn")
_ABSENT = object()
_CUSTOM_OP_PARTS = {
    "_backend_fns": "register_kernel",
    "_torch_dispatch_fns": "register_torch_dispatch",
    "_autocast_dtype": "register_autocast",
    "_abstract_fn": "register_fake",
    "_setup_context_fn": "setup_context",
    "_backward_fn": "register_autograd",
    "_vmap_fn": "register_vmap",
    "_disabled_kernel": "set_kernel_enabled",
}


@dataclass(frozen=True)
class CustomOpChange:
    """One piece of a CustomOpDef's Python state that changed: ``(attribute[, key])``."""

    opdef: weakref.ref
    part: tuple
    before: Any
    after: Any

    def revert(self) -> None:
        """Put the value back as it was before, unless something changed it since."""
        self._swap(self.after, self.before)

    def reapply(self) -> None:
        """Make the change again, unless something changed the value since it was reverted."""
        self._swap(self.before, self.after)

    def _swap(self, expected: Any, value: Any) -> None:
        """Set the part to ``value`` if it still holds ``expected``."""
        opdef = self.opdef()
        if opdef is None or not _same(_custom_op_value(opdef, self.part), expected):
            return
        attribute = self.part[0]
        if attribute == "_disabled_kernel":
            opdef._disabled_kernel = set(value)
        elif len(self.part) == 1:
            setattr(opdef, attribute, value)
        elif value is _ABSENT:
            getattr(opdef, attribute).pop(self.part[1], None)
        else:
            getattr(opdef, attribute)[self.part[1]] = value

    @property
    def current(self) -> bool:
        """Whether the CustomOpDef is alive and still the one torch uses for its operator."""
        opdef = self.opdef()
        return opdef is not None and custom_op_def(opdef._qualname) is opdef

    @property
    def qualname(self) -> str | None:
        """The operator of the CustomOpDef, while it is alive."""
        opdef = self.opdef()
        return None if opdef is None else opdef._qualname

    def describe(self) -> str:
        """What the change was, in the words of the custom_op API."""
        name = self.qualname or "a removed custom op"
        attribute, *key = self.part
        what = _CUSTOM_OP_PARTS[attribute]
        if key:
            label = getattr(key[0], "__name__", key[0])
            what = f"{what} {label if label is not None else 'for all devices'}"
        return f"{what} of {name}"


def custom_op_states() -> dict[int, tuple[Any, dict[tuple, Any]]]:
    """The companion state of every live CustomOpDef, by ``id``: ``(opdef, {part: value})``."""
    from torch._library import custom_ops

    return {id(opdef): (opdef, _custom_op_state(opdef)) for opdef in custom_ops.OPDEFS.values()}


def custom_op_changes(states: dict[int, tuple[Any, dict[tuple, Any]]]) -> list[CustomOpChange]:
    """What changed in the CustomOpDefs of ``states`` (from ``custom_op_states``) since then."""
    changes = []
    for opdef, before in states.values():
        after = _custom_op_state(opdef)
        for part in before.keys() | after.keys():
            old, new = before.get(part, _ABSENT), after.get(part, _ABSENT)
            if not _same(old, new):
                changes.append(CustomOpChange(weakref.ref(opdef), part, old, new))
    return changes


def _custom_op_state(opdef: Any) -> dict[tuple, Any]:
    """A CustomOpDef's companion state flattened to ``{(attribute[, key]): value}``."""
    state: dict[tuple, Any] = {(name,): getattr(opdef, name, None) for name in _CUSTOM_OP_VALUES}
    for name in _CUSTOM_OP_DICTS:
        for key, value in (getattr(opdef, name, None) or {}).items():
            state[(name, key)] = value
    state[("_disabled_kernel",)] = frozenset(getattr(opdef, "_disabled_kernel", ()))
    return state


def _custom_op_value(opdef: Any, part: tuple) -> Any:
    """The current value of one part of a CustomOpDef's companion state."""
    if part[0] == "_disabled_kernel":
        return frozenset(opdef._disabled_kernel)
    if len(part) == 1:
        return getattr(opdef, part[0], None)
    return getattr(opdef, part[0]).get(part[1], _ABSENT)


def _same(a: Any, b: Any) -> bool:
    """Whether two state values are the same (identity; frozensets by value)."""
    return a is b or (isinstance(a, frozenset) and a == b)
