"""Re-running a cell many times holds on to nothing: open descriptors stay flat."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from IPython.utils.capture import capture_output

from ..native.sources import op_source

RERUNS = 100


@pytest.fixture
def shell(ipython, build_cache) -> Iterator[Any]:
    """The test shell with ``%load_ext opmagic`` done (undone after the test)."""
    ipython.run_line_magic("load_ext", "opmagic")
    yield ipython
    ipython.run_line_magic("unload_ext", "opmagic")


def _open_descriptors() -> int:
    """How many file descriptors this process has open."""
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.slow
def test_a_hundred_reruns_of_a_torch_library_cell_keep_descriptors_flat(shell):
    cell = f"%%torch_library\n{op_source('rr_fds')}"
    with capture_output():
        assert shell.run_cell(cell, cell_id="rr-fds").success  # built once
        assert shell.run_cell(cell, cell_id="rr-fds").success  # what a re-run opens, opened
        before = _open_descriptors()
        for _ in range(RERUNS):
            result = shell.run_cell(cell, cell_id="rr-fds")
            assert result.success, result.error_in_exec
    assert _open_descriptors() - before <= 2  # was one more per re-run
    assert torch.ops.rr_fds.scale(torch.ones(1)).item() == 2.0
