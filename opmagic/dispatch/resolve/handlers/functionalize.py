"""C++ functionalization and the Fake fallback: kernels that swap the tensors and call again."""

from __future__ import annotations

import torch

from ...._torch import dispatcher
from ...table import TableEntry
from ..call import KernelOutcome, OperatorCall
from ..messages import functionalize_alias_message
from ..schema import has_alias_info
from .registry import handles


@handles("Functionalize")
def functionalize(call: OperatorCall, key: str, entry: TableEntry, keyset: int) -> KernelOutcome:
    """Functionalization unwraps its wrappers and calls the op again with its key off; its
    fallback (ops without a Functionalize kernel) refuses ops with alias annotations."""
    if entry.kind == "fallback" and has_alias_info(call.schema):
        return KernelOutcome("error", functionalize_alias_message(str(call.ref)))
    values = [
        value.unwrapped(dispatcher.unwrap_functional(value.tensor))
        if dispatcher.is_functional_tensor(value.tensor)
        else value
        for value in call.state.values
    ]
    return KernelOutcome(
        "call",
        "functionalization unwraps FunctionalTensorWrappers and calls the op again "
        "with Functionalize off",
        exclude=call.catalogue.raw("Functionalize"),
        values=values,
    )


@handles("Fake")
def fake(call: OperatorCall, key: str, entry: TableEntry, keyset: int) -> KernelOutcome:
    """The Fake fallback calls the op again on meta tensors in place of fake ones."""
    fake_bit = call.catalogue.functionality_raw("Fake")
    meta = dispatcher.tensor_keyset_raw(torch.empty(0, device="meta"))
    return KernelOutcome(
        "call",
        "the Fake fallback swaps fake inputs for meta tensors and calls the op again",
        exclude=fake_bit,
        values=[
            value.with_keyset(meta) if value.keyset & fake_bit else value
            for value in call.state.values
        ],
    )
