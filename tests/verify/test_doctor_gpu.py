"""The doctor's GPU rungs on a GPU: a healthy CUDA op passes the side-stream and CUDA-graph
rungs; an op whose launcher reads GPU data on the host cannot be captured (graph-unsafe); an
op that works on its own stream, not the current one, is stream-unsafe. Skipped without a
GPU; on one: ``python -m pytest -q -m gpu tests/verify/test_doctor_gpu.py``."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from opmagic import doctor
from opmagic.native.cuda.toolkit import gpu_unavailable_reason

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(gpu_unavailable_reason() is not None, reason=str(gpu_unavailable_reason())),
]
GPU_RUNGS = ["cuda_stream", "cuda_graph"]


def test_a_healthy_cuda_op_passes_the_stream_and_graph_rungs() -> None:
    @torch.library.custom_op("doc_gpu::twice", mutates_args=())
    def twice(x: Tensor) -> Tensor:
        return x * 2

    found = doctor(twice, torch.randn(1 << 20, device="cuda"), rungs=GPU_RUNGS, progress=False)
    assert found.ok, str(found)
    assert [found.rung(name).status for name in GPU_RUNGS] == ["pass", "pass"]


def test_a_launcher_reading_gpu_data_on_the_host_is_graph_unsafe() -> None:
    @torch.library.custom_op("doc_gpu::scaled", mutates_args=())
    def scaled(x: Tensor) -> Tensor:
        return x * float(x.abs().max())  # a device-to-host copy: illegal while capturing

    found = doctor(scaled, torch.randn(1024, device="cuda"), rungs=GPU_RUNGS, progress=False)
    assert found.causes == {"graph-unsafe"}
    assert found.rung("cuda_stream").status == "pass"


def test_a_kernel_on_a_stream_of_its_own_is_stream_unsafe() -> None:
    own = torch.cuda.Stream()

    @torch.library.custom_op("doc_gpu::own_stream", mutates_args=())
    def own_stream(x: Tensor) -> Tensor:
        with torch.cuda.stream(own):  # ignores the caller's stream: races with its producer
            torch.cuda._sleep(10_000_000)
            return x * 2

    x = torch.randn(1 << 22, device="cuda")
    found = doctor(own_stream, x, rungs=["cuda_stream"], progress=False)
    assert found.causes == {"stream-unsafe"}


def test_gpu_rungs_skip_cpu_samples_with_their_reason() -> None:
    found = doctor("aten::sin", torch.randn(3), rungs=GPU_RUNGS, progress=False)
    assert found.rung("cuda_stream").detail == "no sample is on a CUDA device"
