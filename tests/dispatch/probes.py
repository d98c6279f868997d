"""Ground truth for ``resolve``: probe kernels that log the runtime key they run for.

Each probe is registered with ``Library.impl(..., with_keyset=True)``. A probe at a backend
key (or a composite alias) returns a result; every other probe logs and redispatches below
its key the way torch's own kernels do (autograd probes under ``_AutoDispatchBelowAutograd``
to ``after_autograd_keyset``, ADInplaceOrView probes to ``after_ADInplaceOrView_keyset``).
Running the real call and reading the log gives the keys that really ran.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.library import Library

NAMESPACE = "opmagic_probe"
TERMINAL_ALIASES = (
    "CompositeExplicitAutograd",
    "CompositeImplicitAutograd",
    "CompositeImplicitAutogradNestedTensor",
)
_counter = itertools.count()


@dataclass
class ProbeOp:
    """An operator whose kernels (some or all) are probes."""

    op: torch._ops.OpOverload
    keys: tuple[str, ...]
    library: Library
    log: list[str] = field(default_factory=list)
    owners: tuple[Any, ...] = ()  # further libraries to destroy (a custom op's own)

    def close(self) -> None:
        """Remove the operator and its kernels from the dispatcher."""
        self.library._destroy()
        for owner in self.owners:
            owner._destroy()


FALLTHROUGH = "fallthrough:"
"""A key written ``fallthrough:Key`` registers a fallthrough kernel there, not a probe."""


def _is_terminal(key: str) -> bool:
    info_backend = key in TERMINAL_ALIASES or key in (
        "CPU",
        "Meta",
        "SparseCPU",
        "SparseMeta",
        "NestedTensorCPU",
        "QuantizedCPU",
        "SparseCsrCPU",
        "MkldnnCPU",
        "CUDA",
    )
    return info_backend


def _first_tensor(args: Sequence[Any]) -> torch.Tensor:
    for value in args:
        if isinstance(value, torch.Tensor):
            return value
        if isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, torch.Tensor):
                    return item
    return torch.empty(())


def _fresh_like(tensor: torch.Tensor) -> torch.Tensor:
    return torch.empty(()) if tensor.is_nested else torch.empty_like(tensor)


def result_for(schema: Any) -> Callable[[Sequence[Any]], Any]:
    """What a terminal probe returns for ``schema``: a fresh tensor per Tensor return, the
    argument itself for an aliased return (``Tensor(a!)``), ``None`` for ``-> ()``."""
    arguments = list(schema.arguments)

    def one(returned: Any, args: Sequence[Any]) -> Any:
        alias = returned.alias_info
        if alias is not None:
            for i, argument in enumerate(arguments):
                if argument.alias_info and argument.alias_info.before_set == alias.before_set:
                    return args[i] if i < len(args) else None
        kind = str(returned.type)
        if kind == "int":
            return 1
        if kind.startswith("List["):
            return [_fresh_like(_first_tensor(args))]
        return _fresh_like(_first_tensor(args))

    def result(args: Sequence[Any]) -> Any:
        values = [one(returned, args) for returned in schema.returns]
        if not values:
            return None
        return values[0] if len(values) == 1 else tuple(values)

    return result


def make_probe_op(
    keys: Sequence[str],
    schema: str = "(Tensor x, Tensor y) -> Tensor",
    result: Callable[[Sequence[Any]], Any] | None = None,
) -> ProbeOp:
    """Define ``opmagic_probe::opN<schema>`` with a logging probe at each of ``keys``."""
    name = f"op{next(_counter)}"
    library = Library(NAMESPACE, "FRAGMENT")
    library.define(name + schema)
    op = getattr(getattr(torch.ops, NAMESPACE), name).default
    probe = ProbeOp(op, tuple(keys), library)
    add_probes(probe, keys, result)
    return probe


def probe_custom_op(opdef: Any, keys: Sequence[str]) -> ProbeOp:
    """Probes at ``keys`` on top of a ``torch.library.custom_op`` operator's own kernels."""
    namespace = opdef._qualname.split("::")[0]
    library = Library(namespace, "IMPL")
    probe = ProbeOp(opdef._opoverload, tuple(keys), library, owners=(opdef._lib,))
    add_probes(probe, keys)
    return probe


def add_probes(
    probe: ProbeOp, keys: Sequence[str], result: Callable[[Sequence[Any]], Any] | None = None
) -> None:
    """Register a logging probe (or a ``fallthrough:``) at each key of ``keys``."""
    op, name = probe.op, probe.op._schema.name.split("::")[1]
    result = result or result_for(op._schema)
    after_autograd = torch._C._after_autograd_keyset
    after_view = torch._C._after_ADInplaceOrView_keyset

    for key in keys:
        if key.startswith(FALLTHROUGH):
            probe.library.impl(name, torch.library.fallthrough_kernel, key[len(FALLTHROUGH) :])
            continue
        terminal = _is_terminal(key)
        is_autograd = key.startswith("Autograd")
        is_view = key == "ADInplaceOrView"

        def kernel(keyset, *args, _terminal=terminal, _ag=is_autograd, _view=is_view, **kwargs):
            runtime = keyset.highestPriorityTypeId()
            probe.log.append(torch._C._dispatch_key_name(runtime))
            if _terminal:
                return result([*args, *kwargs.values()])
            if _ag:
                with torch._C._AutoDispatchBelowAutograd():
                    return op.redispatch(keyset & after_autograd, *args, **kwargs)
            if _view:
                with torch._C._AutoDispatchBelowADInplaceOrView():
                    return op.redispatch(keyset & after_view, *args, **kwargs)
            below = torch._C._dispatch_keyset_full_after(runtime)
            return op.redispatch(keyset & below, *args, **kwargs)

        probe.library.impl(name, kernel, key, with_keyset=True)


def served_by_probe(table: Any, key: str) -> bool:
    """Whether one of this module's probes serves ``key`` in an operator's table."""
    return __file__ in (table[key].site or "")
