"""Backend kernels, which end a call, and BackendSelect, which picks the backend of factory ops."""

from __future__ import annotations

from typing import Any

import torch

from ...._torch import dispatcher
from ...keys import KeyCatalogue
from ...table import TableEntry
from ..call import KernelOutcome, OperatorCall
from ..messages import no_device_kernel_message, no_fake_message
from .registry import handles, runs_then_redispatches_below


@handles(category="backend")
def backend(call: OperatorCall, key: str, entry: TableEntry, keyset: int) -> KernelOutcome:
    """A backend kernel ends the call; Meta without a fake impl raises."""
    if key == "Meta" and entry.kind in ("fallback", "stub"):  # stub: custom_op's, no fake impl
        return KernelOutcome("error", no_fake_message(str(call.ref)))
    if entry.kind == "fallback":
        return KernelOutcome("ends", f"runs the {key} backend fallback {entry.source}")
    return KernelOutcome("ends", f"runs {entry.source}")


@handles("BackendSelect")
def backend_select(call: OperatorCall, key: str, entry: TableEntry, keyset: int) -> KernelOutcome:
    """Factory ops: torch's generated kernels and custom_op's router pick the backend."""
    catalogue = call.catalogue
    generated = "RegisterBackendSelect.cpp" in (entry.site or "")
    parts = call.custom_op_kernel(entry)
    if entry.kind != "kernel" or not (generated or parts is not None):
        return runs_then_redispatches_below(call, key, entry, keyset)
    options = {argument.name: argument.value for argument in call.arguments}
    device = options.get("device")
    device = torch.device(device) if device is not None else torch.get_default_device()
    if parts is not None and not generated:
        if device.type not in parts["device_kernels"]:
            return KernelOutcome("error", no_device_kernel_message(call.ref, device.type))
        target = dispatcher.dispatch_key_for_device(device.type)
        return KernelOutcome(
            "redispatch",
            f"custom_op's device router picks {target} from device={device}",
            keyset=catalogue.raw(target),
        )
    target = _factory_backend_key(catalogue, device, options.get("layout"), options.get("dtype"))
    state = call.state
    chosen = catalogue.minus(catalogue.raw(target) | state.included, state.excluded)
    return KernelOutcome(
        "redispatch",
        f"picks {target} from the device, layout and dtype arguments and redispatches there",
        keyset=chosen & catalogue.full_after(key),
    )


def _factory_backend_key(
    catalogue: KeyCatalogue, device: torch.device, layout: Any, dtype: Any
) -> str:
    """``computeDispatchKey(dtype, layout, device)``: the backend a factory op runs on."""
    dense = dispatcher.dispatch_key_for_device(device.type)
    prefix = ""
    if layout == torch.sparse_coo:
        prefix = "Sparse"
    elif layout in (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc):
        prefix = "SparseCsr"
    elif isinstance(dtype, torch.dtype) and dtype in (
        torch.qint8,
        torch.quint8,
        torch.qint32,
        torch.quint4x2,
        torch.quint2x4,
    ):
        prefix = "Quantized"
    return prefix + dense if prefix + dense in catalogue.by_name else dense
