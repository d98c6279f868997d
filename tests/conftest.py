"""Fixtures shared by the test packages, and the sample of each matrix the fast loop runs."""

from __future__ import annotations

import atexit
import gc
import logging
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import settings
from IPython.core.interactiveshell import InteractiveShell

import opmagic.magics

from .matrix import in_sample
from .shell import Cells, warm_up_torch

# set in the worker processes of pytest-xdist (``-n 2``) before this file is imported
_XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")

# Generated inputs (Hypothesis) explore new examples on every run of a developer's machine; in
# CI they are the same examples each run (derandomize), so that a red CI names a change, not a
# draw. What exploring finds becomes a fixed test (see tests/test_hostile_api.py).
settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


def pytest_configure(config: pytest.Config) -> None:
    """Let Ctrl-C reach the run and the children it starts: a run started in the background
    by a script (``nohup pytest &``) ignores SIGINT, every child inherits that, and the
    tests that press Ctrl-C in a child would see nothing happen."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Move everything alive after collection (torch, IPython, the test items) out of the
    garbage collector's reach: IPython collects at every ``reset()``, which the ``cells``
    fixture runs after each test, and a full collection of torch's heap costs ~0.3 s. All of
    it goes back to the collector when the interpreter exits, which finalises only what the
    collector can reach (Triton's bindings report the rest as leaks)."""
    gc.freeze()
    atexit.register(gc.unfreeze)


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``exhaustive`` every case of a ``matrix`` test outside its fast-loop sample
    (:func:`tests.matrix.in_sample`), each test function's cases in collection order; under
    pytest-xdist, put the groups with the most slow tests first."""
    cases: dict[tuple[Path, str], list[pytest.Item]] = {}
    for item in items:
        spec = getattr(item, "callspec", None)
        if spec is not None and item.get_closest_marker("matrix") is not None:
            cases.setdefault((item.path, item.originalname), []).append(item)
    for function_cases in cases.values():
        chosen = in_sample([case.callspec.params for case in function_cases])
        for case, keep in zip(function_cases, chosen, strict=True):
            if not keep:
                case.add_marker(pytest.mark.exhaustive)
    if _XDIST_WORKER:
        _slowest_groups_first(items)


# Under pytest-xdist (``-n 2``: CI), modules are handed out whole, and the browser's and the
# notebooks' tests together as one group: a module's fixtures (a shell that compiled, a child
# that ran every crash case) and a session's JupyterLab are made once, and the notebook tests
# read the outputs of the notebooks the browser's tests ran (tests/notebooks/lab_runs.py).
# Groups with more slow tests go first, so that the longest ones do not start last.
_NOTEBOOK_GROUP = ("tests/browser/", "tests/notebooks/")


def _group(nodeid: str) -> str:
    """The unit of work a test belongs to: its module, or the notebooks' group."""
    path = nodeid.split("::", 1)[0]
    return _NOTEBOOK_GROUP[0] if path.startswith(_NOTEBOOK_GROUP) else path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Hand whole groups (:func:`_group`) to the workers, in the order collected."""
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

    config.option.loadscopereorder = False  # keep the order of _slowest_groups_first
    return ByGroup(config, log)


def _slowest_groups_first(items: list[pytest.Item]) -> None:
    """Order the groups by their number of slow tests, most first (in place, stable)."""
    slow: dict[str, int] = {}
    for item in items:
        group = _group(item.nodeid)
        slow[group] = slow.get(group, 0) + (item.get_closest_marker("slow") is not None)
    items.sort(key=lambda item: -slow[_group(item.nodeid)])


def _run_directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run's temporary directory: shared by the workers under pytest-xdist."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if _XDIST_WORKER else base


def pytest_sessionfinish(session: pytest.Session) -> None:
    """After the run (every worker's, under pytest-xdist), end the background precompiles
    its builds, ``%load_ext opmagic`` and notebook kernels started in the run's temporary
    caches: they outlive the process that starts them by design (opmagic.native.headers)
    and would go on compiling after it."""
    factory = getattr(session.config, "_tmp_path_factory", None)  # pytest's, made at configure
    if _XDIST_WORKER is None and factory is not None:
        stop_background_precompiles(factory.getbasetemp())


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


def _stat_fields(stat: Path) -> list[str] | None:
    """A process's ``/proc/PID/stat`` after its name (state, parent, group, ...); None when
    the process is gone."""
    try:
        return stat.read_text().rsplit(") ", 1)[1].split()
    except (OSError, IndexError):
        return None


def _alive(pid: int) -> bool:
    """Whether the process is there and not a zombie waiting for its parent."""
    fields = _stat_fields(Path(f"/proc/{pid}/stat"))
    return fields is not None and fields[0] != "Z"


def running_in_group(pgid: int) -> list[int]:
    """Pids of the processes of group ``pgid`` that still run (zombies, dead but not yet
    reaped by a parent, do not)."""
    return [
        int(stat.parent.name)
        for stat in Path("/proc").glob("[0-9]*/stat")
        if (fields := _stat_fields(stat)) is not None
        and fields[0] != "Z"
        and int(fields[2]) == pgid
    ]


@pytest.fixture(scope="session")
def build_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private opmagic build cache for the whole run (``XDG_CACHE_HOME`` points at it).

    Shared by every test that compiles (by every worker, under pytest-xdist), and inherited
    by the processes and notebook kernels they start, so each precompiled header set is built
    once per run, never in the user's own cache.
    """
    root = _run_directory(tmp_path_factory) / "xdg-cache"
    root.mkdir(exist_ok=True)
    previous = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(root)
    yield root
    if previous is None:
        del os.environ["XDG_CACHE_HOME"]
    else:
        os.environ["XDG_CACHE_HOME"] = previous


@pytest.fixture(autouse=True)
def _slow_tests_build_in_the_run_cache(request: pytest.FixtureRequest) -> None:
    """A slow test may compile: its builds (and those of the processes it starts) go to the
    run's private cache (:func:`build_cache`), never to the user's own."""
    if request.node.get_closest_marker("slow") is not None:
        request.getfixturevalue("build_cache")


@pytest.fixture(scope="session")
def ipython() -> Iterator[InteractiveShell]:
    """The process's IPython shell, with torch warmed up.

    ``%load_ext opmagic`` starts no warm-ups in it: they would precompile torch's headers and
    build trace's observer in the background for every run, which the tests that do not
    compile never use (the warm-ups have tests of their own, and a build starts the
    precompile it needs itself).
    """
    warm_up_torch()
    shell = InteractiveShell.instance()
    gc.freeze()  # what the warm-up and the shell made lives as long as the run
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(opmagic.magics, "warm_up", lambda: None)
        yield shell


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
        gc.freeze()  # what outlived the test (IPython's caches, op objects) lives on: see
        # pytest_collection_finish


@pytest.fixture
def dump() -> Callable[[str], str]:
    """The dispatcher's registrations of an operator, as it prints them."""
    return torch._C._dispatch_dump


@pytest.fixture
def fake_tensor_log() -> Iterator[list[logging.LogRecord]]:
    """What torch's FakeTensorMode logs during the test (its logger's records, as a handler of
    that logger sees them: after the logger's filters)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
