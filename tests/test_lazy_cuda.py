"""``import opmagic`` loads no CUDA library: NVRTC and the driver are loaded on first use."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # starts a Python process

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import json, sys

def cuda_state():
    maps = open("/proc/self/maps").read()
    names = ("libnvrtc", "libcuda.so", "libcudart")
    return {"nvrtc_module": "cuda.bindings.nvrtc" in sys.modules,
            "libraries": sorted(n for n in names if n in maps)}

import torch  # a CUDA build of torch loads its own CUDA runtime
before = cuda_state()
import opmagic
print(json.dumps([before, cuda_state()]))
"""


def test_importing_opmagic_loads_no_cuda_library():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    output = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, env=env
    ).stdout
    before, after = json.loads(output.splitlines()[-1])
    assert after == before and not after["nvrtc_module"]
