"""Turning whatever the user passes as an operator into a dispatcher name.

Accepted: ``"ns::name"``, ``"ns::name.overload"``, ``"ns.name.overload"``,
``"torch.ops.ns.name"``, an ``OpOverload``, an ``OpOverloadPacket``, a ``CustomOpDef``, or a
torch function or Tensor method standing for an aten operator (``torch.add``, ``x.add``:
see torch_functions.py).
Unknown names raise :class:`~opmagic.errors.UnknownOperatorError` with close matches.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from .._torch import dispatcher
from ..errors import NotAnOperatorError, UnknownOperatorError
from .torch_functions import aten_name

if TYPE_CHECKING:
    from .._torch.dispatcher import OpOverload, OpOverloadPacket

# the one grammar of the names in "namespace::name.overload" (and of C++ library names)
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def is_identifier(text: str) -> bool:
    """Whether ``text`` can be a namespace, operator, overload or library name."""
    return isinstance(text, str) and IDENTIFIER.match(text) is not None


def is_operator_name(text: str) -> bool:
    """Whether ``text`` is spelled ``namespace::name`` or ``namespace::name.overload``."""
    namespace, separator, rest = text.partition("::")
    name, dot, overload = rest.partition(".")
    return (
        bool(separator)
        and is_identifier(namespace)
        and is_identifier(name)
        and (not dot or is_identifier(overload))
    )


@dataclass(frozen=True)
class OpRef:
    """An operator the dispatcher knows: one overload, or a packet when ``overload`` is None."""

    namespace: str
    name: str
    overload: str | None  # "" is the default overload; None means "not chosen yet"

    @property
    def qualname(self) -> str:
        """``ns::name``."""
        return f"{self.namespace}::{self.name}"

    @property
    def dispatcher_name(self) -> str:
        """The name the dispatcher's debug APIs take: ``ns::name`` or ``ns::name.overload``."""
        return self.qualname if not self.overload else f"{self.qualname}.{self.overload}"

    def with_overload(self, overload: str) -> OpRef:
        """The same operator with one overload chosen."""
        return OpRef(self.namespace, self.name, overload)

    def packet(self) -> OpOverloadPacket:
        """The ``torch.ops`` packet of this operator (called, it picks the overload)."""
        return getattr(getattr(torch.ops, self.namespace), self.name)

    def op_overload(self) -> OpOverload:
        """The ``torch.ops`` object of this overload."""
        return getattr(self.packet(), self.overload or "default")

    def __str__(self) -> str:
        return self.dispatcher_name


@dataclass(frozen=True)
class OpParameter:
    """One argument of an overload's schema, as a caller sees it."""

    name: str
    type: str  # as torch prints it: "Tensor", "Optional[Tensor]", "List[int]", "number", ...
    kwarg_only: bool
    has_default: bool
    default: Any  # the schema's default value (None when there is none)


def op_parameters(ref: OpRef) -> tuple[OpParameter, ...]:
    """The arguments of one overload (``ref.overload`` chosen), in schema order."""
    schema = dispatcher.find_schema(ref.qualname, ref.overload or "")
    if schema is None:
        raise UnknownOperatorError(_unknown_op_message(ref.qualname))
    return tuple(
        OpParameter(
            arg.name,
            str(arg.type),
            arg.kwarg_only,
            arg.has_default_value(),
            arg.default_value if arg.has_default_value() else None,
        )
        for arg in schema.arguments
    )


def all_qualnames() -> list[str]:
    """Every ``ns::name`` the dispatcher knows right now (read afresh: ops come and go)."""
    return list(_full_index())


def overloads_of(ref: OpRef) -> list[str]:
    """Overload names of an operator (``""`` for the default one), default first.

    Asks the dispatcher about this one operator: listing all ~3,600 of them is for what
    needs every name (close-match suggestions, the explorer's search).
    """
    return _default_first(list(dispatcher.overload_names(ref.qualname)))


def op_ref(op: Any) -> OpRef:
    """Normalise any accepted operator spelling into an :class:`OpRef` that exists."""
    ref = _parse(op)
    if ref.overload is None and next(dispatcher.overload_names(ref.qualname), None) is not None:
        return ref
    if ref.overload is not None and dispatcher.has_operator(ref.dispatcher_name):
        return ref
    known = overloads_of(ref)
    if not known:
        raise UnknownOperatorError(_unknown_op_message(ref.qualname))
    shown = ", ".join(_overload_label(o) for o in known)
    close = difflib.get_close_matches(str(ref.overload), known, n=1)
    guess = f" Did you mean {close[0]!r}?" if close else ""
    raise UnknownOperatorError(
        f"{ref.qualname} has no overload {ref.overload!r}.{guess} Its overloads: {shown}. "
        f"Use '{ref.qualname}.<overload>' with one of them, or '{ref.qualname}' to let "
        "opmagic pick the overload from the arguments."
    )


def _full_index() -> dict[str, list[str]]:
    """Overload names per ``ns::name`` of every operator, built from the dispatcher's list."""
    overloads: dict[str, list[str]] = {}
    for full in dispatcher.all_op_names():
        qualname, _, overload = full.partition(".")
        overloads.setdefault(qualname, []).append(overload)
    return overloads


def _default_first(overloads: list[str]) -> list[str]:
    return sorted(overloads, key=lambda o: (o != "", o))


def _overload_label(overload: str) -> str:
    return overload or "default"


def _parse(op: Any) -> OpRef:
    parts = dispatcher.operator_parts(op)
    if parts is not None:
        return OpRef(*parts)
    if isinstance(op, str):
        return _parse_string(op)
    name = aten_name(op)
    if name is None:
        raise NotAnOperatorError(_not_an_operator_message(op))
    return OpRef("aten", name, None)


def _parse_string(text: str) -> OpRef:
    spec = text.strip().removeprefix("torch.ops.")
    if "::" in spec:
        namespace, rest = spec.split("::", 1)
        name, dot, overload = rest.partition(".")
        overload_part: str | None = overload if dot else None
    else:
        parts = spec.split(".")
        if len(parts) not in (2, 3):
            raise UnknownOperatorError(
                f"{text!r} is not an operator name. Write 'namespace::name' or "
                "'namespace::name.overload' (e.g. 'aten::add.Tensor', 'mylib::numpy_sin')."
            )
        namespace, name = parts[0], parts[1]
        overload_part = parts[2] if len(parts) == 3 else None
    if overload_part == "default":
        overload_part = ""
    for part, what in ((namespace, "namespace"), (name, "operator name")):
        if not is_identifier(part):
            raise UnknownOperatorError(
                f"{text!r} is not an operator name: the {what} {part!r} is not a Python "
                "identifier. Write 'namespace::name' or 'namespace::name.overload' "
                "(e.g. 'aten::add.Tensor')."
            )
    if overload_part and not is_identifier(overload_part):
        raise UnknownOperatorError(
            f"{text!r} is not an operator name: the overload {overload_part!r} is not an "
            "identifier."
        )
    return OpRef(namespace, name, overload_part)


def _unknown_op_message(qualname: str) -> str:
    index = _full_index()
    namespace, _, name = qualname.partition("::")
    if qualname in index:  # kernels registered under named overloads, never defined
        names = ", ".join(
            repr(OpRef(namespace, name, o).dispatcher_name) for o in _default_first(index[qualname])
        )
        return (
            f"{qualname!r} has no definition, only kernels registered for {names}: pass one "
            "of those, or define the operator (torch.library.Library.define)."
        )
    candidates = list(index)
    close = difflib.get_close_matches(qualname, candidates, n=5, cutoff=0.6)
    if not close:  # same name in another namespace, e.g. "mylib::add" -> "aten::add"
        close = [c for c in candidates if c.endswith(f"::{name}")][:5]
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    namespaces = {c.split("::", 1)[0] for c in candidates}
    if namespace not in namespaces:
        hint += (
            f" No operator is registered in namespace {namespace!r}: define one first "
            "(torch.library.custom_op, %%custom_op or %%torch_library) or check the spelling."
        )
    return f"Unknown operator {qualname!r}.{hint}"


def _not_an_operator_message(op: Any) -> str:
    name = getattr(op, "__name__", None)
    what = f"the {type(op).__name__} {name!r}" if callable(op) and name else repr(op)
    return (
        f"Expected an operator, got {what}. Pass an operator ('ns::name[.overload]', "
        "torch.ops.ns.name[.overload] or a custom op), or a torch function or Tensor method "
        "that stands for one (torch.add, torch.Tensor.add, torch.nn.functional.silu)."
    )
