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
    """A freshly defined operator whose kernels are probes."""

    op: torch._ops.OpOverload
    keys: tuple[str, ...]
    library: Library
    log: list[str] = field(default_factory=list)

    def close(self) -> None:
        """Remove the operator and its kernels from the dispatcher."""
        self.library._destroy()


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


def _result_like(args: Sequence[Any]) -> Any:
    for value in args:
        if isinstance(value, torch.Tensor):
            return torch.empty(()) if value.is_nested else torch.empty_like(value)
        if isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, torch.Tensor):
                    return torch.empty_like(item)
    return torch.empty(())


def make_probe_op(
    keys: Sequence[str],
    schema: str = "(Tensor x, Tensor y) -> Tensor",
    result: Callable[[Sequence[Any]], Any] = _result_like,
) -> ProbeOp:
    """Define ``opmagic_probe::opN<schema>`` with a logging probe at each of ``keys``."""
    name = f"op{next(_counter)}"
    library = Library(NAMESPACE, "FRAGMENT")
    library.define(name + schema)
    op = getattr(getattr(torch.ops, NAMESPACE), name).default
    probe = ProbeOp(op, tuple(keys), library)
    after_autograd = torch._C._after_autograd_keyset
    after_view = torch._C._after_ADInplaceOrView_keyset

    for key in keys:
        terminal = _is_terminal(key)
        is_autograd = key.startswith("Autograd")
        is_view = key == "ADInplaceOrView"

        def kernel(keyset, *args, _terminal=terminal, _ag=is_autograd, _view=is_view, **kwargs):
            runtime = keyset.highestPriorityTypeId()
            probe.log.append(torch._C._dispatch_key_name(runtime))
            if _terminal:
                return result(args)
            if _ag:
                with torch._C._AutoDispatchBelowAutograd():
                    return op.redispatch(keyset & after_autograd, *args, **kwargs)
            if _view:
                with torch._C._AutoDispatchBelowADInplaceOrView():
                    return op.redispatch(keyset & after_view, *args, **kwargs)
            below = torch._C._dispatch_keyset_full_after(runtime)
            return op.redispatch(keyset & below, *args, **kwargs)

        library.impl(name, kernel, key, with_keyset=True)
    return probe


def probe_keys_on(resolution_path: Sequence[str], probe: ProbeOp, table: Any) -> list[str]:
    """``resolution_path`` restricted to keys served by one of the probe's kernels."""
    return [k for k in resolution_path if _served_by_probe(table, k)]


def _served_by_probe(table: Any, key: str) -> bool:
    return __file__ in (table[key].site or "")
