"""Backward on a GPU: the autograd engine runs CUDA nodes on its device thread, which the trace
records on that thread, each node under the forward call that made it; a CPU and a GPU run
compared call by call agree. Skipped without a GPU; on one: ``python -m pytest -q -m gpu``.
"""

from __future__ import annotations

import pytest
import torch

from opmagic import compare_traces, trace
from opmagic.native.cuda.toolkit import gpu_unavailable_reason

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(gpu_unavailable_reason() is not None, reason=str(gpu_unavailable_reason())),
]


def _step(device: str):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    model = model.to(device)
    x = torch.randn(32, 8, device=device)

    def step() -> torch.Tensor:
        model.zero_grad(set_to_none=True)
        loss = model(x).square().mean()
        loss.backward()
        return loss

    step()
    return step


def test_a_cuda_backward_is_recorded_on_the_engines_device_thread() -> None:
    traced = trace(_step("cuda"))
    assert traced.exception is None
    nodes = traced.nodes()
    addmm = [n for n in nodes if n.name == "AddmmBackward0"]
    assert addmm and all(n.forward is not None and n.forward.op == "aten::addmm" for n in addmm)
    assert all(n.thread is not None for n in nodes)  # not the thread that traced
    calls = [c for n in addmm for c in n.walk()]
    assert calls and all(c.thread == addmm[0].thread for c in calls)
    assert any(c.op == "aten::mm" and c.path[-1] == "CUDA" for c in calls)
    assert all(c.backward_of is not None for c in calls)


def test_cpu_and_gpu_runs_agree_call_by_call() -> None:
    cpu = trace(_step("cpu"), values=True)
    gpu = trace(_step("cuda"), values=True)
    result = compare_traces(cpu, gpu, rtol=1e-3, atol=1e-4, labels=("cpu", "cuda"))
    assert result.compared > 10
    assert result.same, str(result)
