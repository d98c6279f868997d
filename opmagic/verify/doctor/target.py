"""The operator under diagnosis: what to call, its schema, its dispatch table as the doctor
found it, and where each of its parts was registered (cell lines in a session)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..._torch import custom_op_state, dispatcher
from ...cells.session import active_session
from ...dispatch import DispatchTable, dispatch_table
from ...dispatch.ops import op_ref
from ...dispatch.sites import label_callable, label_location, label_site
from ...dispatch.table import definition_site

# backend keys whose kernel is "the kernel" of an op, most specific first
_KERNEL_KEYS = ("CPU", "CUDA", "CompositeExplicitAutograd", "CompositeImplicitAutograd")


@dataclass
class Target:
    """One operator overload to diagnose, and what the doctor knows about its registrations."""

    overload: Any  # the OpOverload: what every rung calls
    name: str  # "ns::name" or "ns::name.overload"
    opdef: Any | None  # the CustomOpDef when torch.library.custom_op made it
    table: DispatchTable = field(init=False)
    schema: Any = field(init=False)  # torch's FunctionSchema

    def __post_init__(self) -> None:
        table = dispatch_table(self.overload)
        assert isinstance(table, DispatchTable)
        self.table = table
        namespace_name, _, overload = self.name.partition(".")
        self.schema = dispatcher.find_schema(namespace_name, overload)

    @classmethod
    def of(cls, op: Any, name: str, opdef: Any | None) -> Target:
        """The target for what :func:`~opmagic.verify.checks.checked_operator` returned."""
        overload = op_ref(name).op_overload()
        return cls(overload, name, opdef)

    @property
    def qualname(self) -> str:
        """``ns::name``."""
        return self.name.partition(".")[0]

    @property
    def argument_names(self) -> list[str]:
        """The schema's argument names, in order."""
        return [argument.name for argument in self.schema.arguments]

    @property
    def mutable_arguments(self) -> set[str]:
        """Arguments the schema marks as written (``Tensor(a!) x``)."""
        return {
            a.name
            for a in self.schema.arguments
            if a.alias_info is not None and a.alias_info.is_write
        }

    @property
    def parts(self) -> dict[str, Any]:
        """The custom op's Python parts (impl, fake, backward, ...); empty for other ops."""
        return custom_op_state.custom_op_parts(self.opdef) if self.opdef is not None else {}

    # ------------------------------------------------------------ where things were written

    def definition_site(self) -> str:
        """Where the op was defined: the cell line in a session, else the function's or the
        ``define`` call's file and line."""
        session = active_session()
        where = session.definition_site(self.qualname) if session is not None else None
        if where:
            return where
        if self.opdef is not None:
            return function_site(custom_op_state.custom_op_function(self.opdef))
        return label_site(definition_site(self.name))

    def kernel_site(self) -> str:
        """Where the kernel that computes the op was written."""
        if self.opdef is not None:
            parts = self.parts
            kernel = next(iter(parts["device_kernels"].values()), None) or parts["impl"]
            return function_site(custom_op_state.unwrap_registered_function(kernel))
        active = {r.key: r for r in self.table.registrations if r.active}
        for key in _KERNEL_KEYS:
            if key in active:
                return active[key].source
        return self.definition_site()

    def fake_function(self) -> Any | None:
        """The Python fake impl (``register_fake``), if there is one."""
        if self.opdef is not None:  # custom_op's own stub raises when there is none
            return self.parts["fake"]
        return custom_op_state.registered_fake_impl(self.qualname)

    def fake_site(self) -> str:
        """Where the fake impl was written, else where to add one (the definition)."""
        fake = self.fake_function()
        if fake is not None:
            return function_site(fake)
        active = {r.key: r for r in self.table.registrations if r.active}
        if "Meta" in active and self.opdef is None:
            return active["Meta"].source
        return self.definition_site()

    def backward_site(self) -> str:
        """Where the backward was written, else where to add one (the definition)."""
        backward = self.parts.get("backward") if self.opdef is not None else None
        if backward is not None:
            return function_site(backward)
        active = {r.key: r for r in self.table.registrations if r.active}
        for key in ("Autograd", "AutogradCPU", "AutogradCUDA"):
            if key in active and self.opdef is None:
                return active[key].source
        return self.definition_site()

    def vmap_function(self) -> Any | None:
        """The custom op's vmap rule (``register_vmap``), if any."""
        return self.parts.get("vmap") if self.opdef is not None else None

    def has_own_vmap(self) -> bool:
        """Whether the op registers a batching rule (its own FuncTorchBatched kernel)."""
        if self.vmap_function() is not None:
            return True
        entry = self.table["FuncTorchBatched"]
        return entry.kind == "kernel" and not entry.is_fallback

    def describe_entry(self, key: str) -> str:
        """One dispatch-table row as evidence: ``Meta: stub: raises (no fake impl) · source``."""
        entry = self.table[key]
        return " · ".join(part for part in (f"{key}: {entry.kind_label}", entry.source) if part)


def function_site(fn: Any) -> str:
    """``cell [3], line 5`` (or ``file.py:12``) where a Python function was written."""
    fn = custom_op_state.unwrap_registered_function(fn) if callable(fn) else fn
    code = getattr(fn, "__code__", None)
    if code is None:
        return label_callable(fn)
    return label_location(code.co_filename, code.co_firstlineno)


def is_float_tensor(value: Any) -> bool:
    """A floating-point (or complex) tensor: what can require grad."""
    return isinstance(value, torch.Tensor) and (value.is_floating_point() or value.is_complex())
