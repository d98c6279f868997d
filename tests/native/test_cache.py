"""Builds through the cache: killed builds block nothing, concurrent builds build once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from opmagic.native import BuildProgress, compile_library

from .sources import op_source
from .waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
# builds `source` (stdin) in a child process once the file argv[2] exists (so that several
# children start at the same moment); reports its progress steps in the file argv[1]
_CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    from opmagic.native import compile_library
    source = sys.stdin.read()
    steps = open(sys.argv[1], "a", buffering=1)
    def progress(event):
        steps.write(event.step + "\\n")
    steps.write("ready\\n")
    while not os.path.exists(sys.argv[2]):
        time.sleep(0.01)
    library = compile_library(source, progress=progress)
    print(json.dumps({"cached": library.build.cached, "ops": [o.name for o in library.operators]}))
    """
)


def _child(source: str, steps: Path, go: Path) -> subprocess.Popen:
    """A process that builds ``source`` once ``go`` exists, logging its steps to ``steps``."""
    process = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(steps), str(go)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    process.stdin.write(source)
    process.stdin.close()
    return process


@pytest.mark.slow
def test_a_build_killed_mid_compile_leaves_nothing_that_blocks_the_next(build_cache, tmp_path):
    source = op_source("cache_killed")
    steps, go = tmp_path / "steps", tmp_path / "go"
    go.touch()
    child = _child(source, steps, go)
    wait_for(lambda: steps.exists() and "compiling" in steps.read_text())
    child.send_signal(signal.SIGKILL)  # the compiler it started is orphaned, still running
    child.wait()

    events: list[BuildProgress] = []
    library = compile_library(source, progress=events.append)
    try:
        assert not library.build.cached  # the killed build published nothing
        # its lock died with it: the orphaned compiler holds none, so nothing waits
        assert not [e.step for e in events if e.step.startswith("waiting for pid")]
        assert torch.ops.cache_killed.scale(torch.ones(1)).item() == 2.0
        scratch = build_cache / "opmagic" / "v1" / "tmp"
        assert not list(scratch.glob(f"{library.key}-*"))  # the killed build's dir is gone
    finally:
        library.close()


@pytest.mark.slow
def test_two_processes_building_the_same_source_build_it_once(build_cache, tmp_path):
    source = op_source("cache_twice")
    go = tmp_path / "go"
    steps = [tmp_path / f"steps{i}" for i in range(2)]
    children = [_child(source, path, go) for path in steps]
    wait_for(lambda: all(path.exists() and "ready" in path.read_text() for path in steps))
    go.touch()  # both call compile_library now; the build takes seconds, so they overlap
    reports = [json.loads(child.stdout.read()) for child in children]
    assert all(child.wait() == 0 for child in children)
    assert all(report["ops"] == ["cache_twice::scale"] for report in reports)
    assert sorted(report["cached"] for report in reports) == [False, True]
    waited = [path for path in steps if "waiting for pid" in path.read_text()]
    assert len(waited) == 1  # the one that found the build in the cache had waited for it


# traces once the file argv[1] exists (torch imported first), after creating the file argv[2]
_TRACE = textwrap.dedent(
    """
    import os, sys, time, torch, opmagic
    open(sys.argv[2], "w").close()
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.01)
    t = opmagic.trace(torch.add, torch.ones(2), torch.ones(2))
    print([call.op for call in t.calls])
    """
)


def _tracer(home: Path, go: Path, ready: Path) -> subprocess.Popen:
    """A process that traces with ``home`` as its XDG cache once ``go`` exists."""
    return subprocess.Popen(
        [sys.executable, "-c", _TRACE, str(go), str(ready)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(home)},
    )


@pytest.mark.slow
def test_two_processes_tracing_first_build_the_observer_once(tmp_path):
    home, go = tmp_path / "home", tmp_path / "go"
    ready = [tmp_path / f"ready{i}" for i in range(2)]
    children = [_tracer(home, go, path) for path in ready]
    wait_for(lambda: all(path.exists() for path in ready))
    go.touch()  # both trace now; the observer's build takes seconds, so they overlap
    outputs = [child.communicate(timeout=600) for child in children]
    assert all(child.returncode == 0 for child in children), outputs
    assert [out.strip() for out, _ in outputs] == ["['aten::add.Tensor']"] * 2
    logs = [log for _, log in outputs]
    assert sum("opmagic: compiling the operator observer" in log for log in logs) == 1, logs
    assert sum("which builds the operator observer" in log for log in logs) == 1, logs
    assert len(list(home.glob("opmagic/v1/observer/*"))) == 1


@pytest.mark.slow
def test_an_observer_build_killed_mid_compile_blocks_nothing(tmp_path):
    home, go = tmp_path / "home", tmp_path / "go"
    go.touch()
    child = _tracer(home, go, tmp_path / "ready")
    assert "compiling the operator observer" in child.stderr.readline()
    child.send_signal(signal.SIGKILL)  # ninja and the compiler it started run on, orphaned
    child.wait()
    child.stderr.close()

    second = _tracer(home, go, tmp_path / "ready")
    out, log = second.communicate(timeout=600)
    assert second.returncode == 0 and out.strip() == "['aten::add.Tensor']", log
    assert "opmagic: compiling the operator observer" in log  # the lock died with the killed
    assert "waiting for pid" not in log
    assert not list(home.glob("opmagic/v1/tmp/*"))  # the killed build's scratch is gone
