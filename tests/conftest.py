"""Fixtures shared by the test packages."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell

from .shell import Cells, warm_up_torch


@pytest.fixture(scope="session", autouse=True)
def no_background_precompile_left(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """After the run, end the background precompiles its builds, ``%load_ext opmagic`` and
    notebook kernels started in the run's temporary caches: they outlive the process that
    starts them by design (opmagic.native.headers) and would go on compiling after it."""
    yield
    stop_background_precompiles(tmp_path_factory.getbasetemp())


def stop_background_precompiles(root: Path, wait_s: float = 10.0) -> list[int]:
    """End every background precompile working in a build cache under ``root`` (each runs
    in a process group of its own, whose leader's pid its ``precompiling.pid`` holds, in
    the cache's directory); returns their pids once they are gone."""
    stopped = []
    for marker in root.rglob("precompiling.pid"):
        try:
            pid = int(marker.read_text())
            working_in = Path(os.readlink(f"/proc/{pid}/cwd"))
        except (OSError, ValueError):  # done meanwhile, or not a pid
            continue
        if working_in.is_relative_to(root) and os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGTERM)
            stopped.append(pid)
    deadline = time.monotonic() + wait_s
    while stopped and any(_alive(pid) for pid in stopped) and time.monotonic() < deadline:
        time.sleep(0.05)
    return stopped


def _alive(pid: int) -> bool:
    """Whether the process is there and not a zombie waiting for its parent."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="session")
def build_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private opmagic build cache for the whole run (``XDG_CACHE_HOME`` points at it).

    Shared by every test that compiles, and inherited by the processes and notebook kernels
    they start, so each precompiled header set is built once per run, never in the user's
    own cache.
    """
    root = tmp_path_factory.mktemp("xdg-cache")
    previous = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(root)
    yield root
    if previous is None:
        del os.environ["XDG_CACHE_HOME"]
    else:
        os.environ["XDG_CACHE_HOME"] = previous


@pytest.fixture(scope="session")
def ipython(build_cache: Path) -> InteractiveShell:
    """The process's IPython shell, with torch warmed up (``%load_ext opmagic`` precompiles
    headers in the background: in the run's cache, never in the user's own)."""
    warm_up_torch()
    return InteractiveShell.instance()


@pytest.fixture
def cells(ipython: InteractiveShell) -> Iterator[Cells]:
    """A shell with ``%load_ext opmagic`` for one test; unloaded afterwards."""
    ipython.run_line_magic("load_ext", "opmagic")
    runner = Cells(ipython)
    runner.run("import torch\nimport numpy as np\nfrom torch import Tensor")
    try:
        yield runner
    finally:
        ipython.run_line_magic("unload_ext", "opmagic")
        ipython.reset()


@pytest.fixture
def dump() -> Callable[[str], str]:
    """The dispatcher's registrations of an operator, as it prints them."""
    return torch._C._dispatch_dump
