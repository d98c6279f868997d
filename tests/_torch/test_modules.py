"""The nn.Module shim: the code of a module's ``__call__``, whose frames hold the module."""

from __future__ import annotations

import sys

import torch

from opmagic._torch.modules import module_call_codes


def test_a_module_calls_frames_run_one_of_the_codes_with_the_module_as_self() -> None:
    seen = []

    class Probe(torch.nn.Module):
        def forward(self) -> None:
            caller = sys._getframe(1)
            while caller is not None and caller.f_code not in module_call_codes():
                caller = caller.f_back
            seen.append(caller.f_locals["self"] if caller is not None else None)

    probe = Probe()
    probe()
    probe.register_forward_hook(lambda *args: None)  # the hooks' path runs the same code
    probe()
    assert seen == [probe, probe]
