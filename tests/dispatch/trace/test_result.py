"""The result: what a traced call says about itself."""

from __future__ import annotations

import torch

from opmagic import TracedCall, trace


def test_traced_call_fields() -> None:
    call = trace(torch.add, torch.randn(2, 3), torch.randn(3), alpha=2).calls[0]
    assert isinstance(call, TracedCall)
    assert call.inputs == "f32[2,3], f32[3], alpha=2"
    assert call.key == "AutogradCPU" and call.path == ("AutogradCPU", "CPU")
    assert call.kernel_kind == "kernel" and "RegisterCPU" in call.source
    assert call.steps[0].origin.startswith("argument")
