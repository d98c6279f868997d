"""The CUDA runtime shim in opmagic/_torch/cuda.py (needs a GPU; skipped without one)."""

from __future__ import annotations

import pytest
import torch

from opmagic._torch import cuda
from opmagic.native.cuda.toolkit import gpu_unavailable_reason

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(gpu_unavailable_reason() is not None, reason=str(gpu_unavailable_reason())),
]


def test_current_raw_stream_follows_torchs_current_stream():
    assert cuda.current_raw_stream(0) == torch.cuda.current_stream(0).cuda_stream
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        assert cuda.current_raw_stream(0) == stream.cuda_stream
