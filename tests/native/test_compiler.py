"""Compiler runs: interrupting a build stops every process the compiler started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from .sources import op_source
from .waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]


def _processes_with(marker: str) -> list[str]:
    """The command lines of running processes (but this one) that mention ``marker``; the
    compiler's name the build cache, which lies under pytest's temporary directory."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in command and entry.name != str(os.getpid()):
            found.append(command)
    return found


def _start_long_compile(marker: str, script: str) -> subprocess.Popen:
    """A child that compiles torch/extension.h without precompiled headers (cc1plus runs for
    many seconds; its command line holds ``marker``), once its cc1plus runs."""
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    child.stdin.write("#include <torch/extension.h>\n" + op_source("cc_interrupted"))
    child.stdin.close()
    wait_for(lambda: any("cc1plus" in c for c in _processes_with(marker)))
    return child


def _compile_script(marker: str) -> str:
    """A child's script: compile stdin with ``-D<marker>``; say so when interrupted."""
    return textwrap.dedent(
        f"""
        import sys
        from opmagic import compile_library
        try:
            compile_library(sys.stdin.read(), extra_cflags=["-D{marker}"],
                            precompiled_headers=False, progress=None)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        """
    )


@pytest.mark.slow
def test_ctrl_c_during_a_compile_stops_cc1plus_too(build_cache):
    marker = f"OPMAGIC_MARKER_{uuid.uuid4().hex}"
    child = _start_long_compile(marker, _compile_script(marker))
    child.send_signal(signal.SIGINT)  # what Ctrl-C (or a notebook's stop button) sends
    assert child.stdout.read().strip() == "interrupted"
    assert child.wait(timeout=60) == 0
    wait_for(lambda: not _processes_with(marker), timeout=10)


@pytest.mark.slow
def test_a_kernel_killed_during_a_compile_leaves_no_compiler_running(build_cache):
    marker = f"OPMAGIC_MARKER_{uuid.uuid4().hex}"
    child = _start_long_compile(marker, _compile_script(marker))
    child.kill()  # SIGKILL: what a kernel restart sends to a kernel that does not answer
    assert child.wait(timeout=60) == -signal.SIGKILL
    wait_for(lambda: not _processes_with(marker), timeout=10)
