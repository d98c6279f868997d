"""An operator's computed dispatch table, worked out from its registrations and the fallbacks.

The dispatcher fills each runtime key of an operator's table from the kernels registered to
it (``OperatorEntry::computeDispatchTableEntryWithDebug``): a kernel registered for the key
itself, else one from an alias key in a fixed precedence, else the key's backend fallback. A
snapshot keeps only the registrations, so the table an operator had before a change is
computed here by the same rules; tests compare the result with ``_dispatch_dump_table`` for
every operator of the process.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from ..._torch import dispatcher
from ..keys import catalogue
from ..table import Registration
from .state import Fallback

Computed = dict[str, tuple[str, str, bool]]  # key -> (site, torch's kind label, fallthrough)

_NON_FUNCTIONAL = "CompositeExplicitAutogradNonFunctional"
_EXPLICIT = "CompositeExplicitAutograd"
_IMPLICIT = "CompositeImplicitAutograd"
_NESTED = "CompositeImplicitAutogradNestedTensor"
_AMBIGUOUS = ("ambiguous_autogradother", "ambiguous autogradother", False)


def computed_table(
    active: Mapping[str, Registration], fallbacks: Mapping[str, Fallback]
) -> Computed:
    """``key -> (site, kind label, fallthrough)`` for every runtime key (and ``Undefined``)
    that has a kernel, as ``parse_computed_table(_dispatch_dump_table(op))`` reads it;
    ``active`` is the kernel that serves each registered key (``OpState.active()``)."""
    table: Computed = {}
    for key in table_keys():
        entry = _entry(key, active, fallbacks)
        if entry is not None:
            table[key] = entry
    return table


@functools.cache
def table_keys() -> tuple[str, ...]:
    """The keys of a computed table: ``Undefined``, then every runtime key in priority order."""
    return ("Undefined", *(info.name for info in catalogue().runtime))


def _entry(
    key: str, active: Mapping[str, Registration], fallbacks: Mapping[str, Fallback]
) -> tuple[str, str, bool] | None:
    """The computed entry of one key, following torch's precedence."""

    def served(registration: Registration, label: str) -> tuple[str, str, bool]:
        return registration.site, label, registration.fallthrough

    def alias(name: str) -> Registration | None:
        """The alias's kernel when the alias fills ``key`` (``Undefined`` counts for none)."""
        return active.get(name) if dispatcher.alias_includes(name, key) else None

    undefined = key == "Undefined"
    if not undefined and key in active:
        return served(active[key], "kernel")
    for name in (_NON_FUNCTIONAL, _EXPLICIT):
        kernel = active.get(name) if undefined else alias(name)
        if kernel is not None:
            return served(kernel, "default backend kernel")
    has_backend_kernel = _EXPLICIT in active or any(
        k in active for k in dispatcher.backend_keys_of_autograd(key)
    )
    nested = None if undefined else alias(_NESTED)
    if nested is not None:
        return served(nested, "nested kernel")
    implicit = active.get(_IMPLICIT) if undefined else alias(_IMPLICIT)
    if implicit is not None:
        if key == "AutogradOther" and any(k in active for k in dispatcher.autogradother_backends()):
            return _AMBIGUOUS
        if not has_backend_kernel:
            return served(implicit, "math kernel")
    for name, label in (
        ("Autograd", "autograd kernel"),
        ("FuncTorchBatchedDecomposition", "batched kernel"),
    ):
        kernel = alias(name)
        if kernel is not None:
            return served(kernel, label)
    fallback = fallbacks.get(key)
    if fallback is not None:
        return fallback.site, "backend fallback", fallback.fallthrough
    return None
