"""The words of a dispatch: where each key came from, why keys were passed over, and the
thread-local state that shaped it."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..keys import KeyCatalogue
from .call import DispatchState

KeyOrigin = Callable[[str, "str | None"], str]
"""``origin(key, previous_key) -> words``: what put a key into the keyset of a dispatch."""

INCLUDED_BECAUSE = {
    "Python": "a TorchDispatchMode is active",
    "PythonTLSSnapshot": "a TorchDispatchMode is active",
    "FuncTorchDynamicLayerFrontMode": "a torch.func transform is active",
    "FuncTorchDynamicLayerBackMode": "a torch.func transform is active",
    "FuncTorchVmapMode": "inside torch.func.vmap",
    "PythonDispatcher": "enable_python_dispatcher() is active",
    "PreDispatch": "pre-dispatch tracing is active",
    "BackendSelect": "always on, for factory functions",
    "ADInplaceOrView": "always on",
    "Functionalize": "functionalization is on",
    "Meta": "FakeTensorMode runs Meta kernels",
}
"""Why a key sits in the TLS include set, per key."""


def key_origins(
    catalogue: KeyCatalogue, state: DispatchState, via: str, caller: str | None
) -> KeyOrigin:
    """A function naming what put a key into the keyset of this dispatch."""
    holders_of = [(v.name, set(catalogue.names(v.keyset)), v.keyset) for v in state.values]
    included = state.included
    suffix = f" (after {caller} called the op again)" if via == "call" and caller else ""

    def origin(key: str, previous: str | None) -> str:
        if key == "Undefined":
            return "no key at all: no tensor inputs and nothing in the TLS include set" + suffix
        info = catalogue.by_name[key]
        holders = [name for name, names, _ in holders_of if key in names]
        if not holders and info.backend is not None:  # functionality and backend from two args
            bit = info.raw & ~catalogue.backend_mask
            holders = [name for name, _, keyset in holders_of if keyset & bit]
        if holders:
            return f"argument{'s' if len(holders) > 1 else ''} {', '.join(holders)}" + suffix
        if info.raw & ~catalogue.backend_mask & included:
            return f"the TLS include set ({INCLUDED_BECAUSE.get(key, 'a guard')})" + suffix
        return f"the keyset {previous or 'the caller'} passed on"

    return origin


def exclusion_reason(catalogue: KeyCatalogue, key: str, state: DispatchState) -> str:
    """Why ``key`` is in the TLS exclude set: a kernel's guard on the path, or the caller's."""
    bit = catalogue.functionality_raw(key)
    for bits, kernel_key in reversed(state.excluded_by):
        if bits & bit:
            return f"turned off by {kernel_key}'s kernel for the rest of the call"
    info = catalogue.by_name[key]
    if info.category == "autocast":
        return f"excluded by TLS: autocast for {key.removeprefix('Autocast')} is off"
    if info.category == "autograd" or key == "ADInplaceOrView":
        if torch.is_inference_mode_enabled():
            return "excluded by TLS: inference_mode is on"
        return "excluded by TLS: a below-autograd guard is active"
    return "excluded by the TLS exclude set"


def context_words(catalogue: KeyCatalogue, state: DispatchState) -> list[str]:
    """The thread-local state that shapes dispatch, in words."""
    words = []
    for info in catalogue.runtime:
        if info.category == "autocast" and info.raw & ~catalogue.backend_mask & ~state.excluded:
            device = info.name.removeprefix("Autocast").lower()
            words.append(f"autocast on for {device} ({_autocast_dtype(device)})")
    if torch.is_inference_mode_enabled():
        words.append("inference_mode on")
    elif not torch.is_grad_enabled():
        words.append("no_grad: autograd kernels still run but record nothing")
    words.extend(f"TorchDispatchMode {type(mode).__name__} active" for mode in state.modes)
    words.extend(f"torch.func {t.lower()} (level {level})" for t, level in state.layers)
    if state.included & catalogue.functionality_raw("PythonDispatcher"):
        words.append("Python dispatcher enabled")
    return words


def _autocast_dtype(device: str) -> str:
    """The dtype autocast casts to on ``device``, as a word (``bfloat16``)."""
    try:
        return str(torch.get_autocast_dtype(device)).removeprefix("torch.")
    except (RuntimeError, TypeError):  # a device type this torch cannot autocast
        return "unknown dtype"
