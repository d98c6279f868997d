"""The cache service: a private root, locks that cannot go stale, verified artefacts, atomic
publishing, measured build times, progress, and builds made once per process in the
background."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from opmagic.cachedir import (
    BackgroundBuild,
    BuildCache,
    BuildProgress,
    StderrProgress,
    Stopwatch,
    _fresh_name,
    artifact_problem,
    artifact_record,
    opened_names,
    private_copy,
    read_record,
)
from opmagic.errors import CacheDirectoryError, LoadError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cache_root(tmp_path, monkeypatch) -> Path:
    """An empty XDG cache home of this test alone: its opmagic root, not created yet."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "opmagic"


@pytest.fixture
def cache(cache_root) -> BuildCache:
    """An empty build cache of this test alone."""
    return BuildCache()


def flip_bytes(path: Path) -> None:
    """Invert a run of bytes in the middle of a file (its size stays)."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 4096] = bytes(b ^ 0xFF for b in data[middle : middle + 4096])
    path.write_bytes(bytes(data))


def test_the_cache_is_created_private(cache_root):
    BuildCache()
    assert cache_root.stat().st_mode & 0o777 == 0o700
    for sub in ("v1", "v1/libs", "v1/observer"):
        assert (cache_root / sub).stat().st_mode & 0o777 == 0o700


def test_a_cache_others_can_write_to_is_refused(cache_root):
    cache_root.mkdir(mode=0o700)
    cache_root.chmod(0o777)
    with pytest.raises(CacheDirectoryError, match=r"writable by other users.*chmod 700"):
        BuildCache()


def test_a_cache_others_can_only_read_is_made_private(cache_root):
    cache_root.mkdir(mode=0o755)
    cache_root.chmod(0o755)
    BuildCache()
    assert cache_root.stat().st_mode & 0o777 == 0o700


def test_a_symlinked_cache_is_refused(cache_root, tmp_path):
    (tmp_path / "elsewhere").mkdir()
    cache_root.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(CacheDirectoryError, match="not a plain directory"):
        BuildCache()


@pytest.mark.skipif(os.getuid() != 0, reason="giving a directory to another user needs root")
@pytest.mark.parametrize("sub", ["", "v1/observer"])
def test_a_cache_directory_of_another_user_is_refused(cache, sub):
    os.chown(cache.root / sub, 4242, -1)
    with pytest.raises(CacheDirectoryError, match="belongs to uid 4242"):
        BuildCache()


@pytest.mark.parametrize("sub", ["v1", "v1/libs", "v1/prefix", "v1/observer", "v1/locks", "v1/tmp"])
def test_every_directory_of_the_cache_is_checked(cache, sub):
    (cache.root / sub).chmod(0o777)
    with pytest.raises(CacheDirectoryError, match=f"{cache.root / sub} is unsafe: it is writable"):
        BuildCache()


def test_a_symlinked_subdirectory_is_refused(cache, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    shutil.rmtree(cache.home / "libs")
    (cache.home / "libs").symlink_to(elsewhere)
    with pytest.raises(CacheDirectoryError, match="libs is unsafe: it is not a plain directory"):
        BuildCache()


@pytest.mark.slow
def test_a_lock_waits_for_its_holder_and_dies_with_it(cache):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from opmagic.cachedir import BuildCache\n"
            "with BuildCache().locked('key'):\n"
            "    print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert holder.stdout.readline().strip() == "held"
    waits: list[str] = []

    def kill_on_first_wait(pid: str) -> None:
        """Kill the holder the first time the lock is found held."""
        waits.append(pid)
        if len(waits) == 1:
            holder.send_signal(signal.SIGKILL)

    with cache.locked("key", kill_on_first_wait) as waited:
        assert waited
    holder.wait()
    assert waits[0] == str(holder.pid)
    with cache.locked("key") as waited:
        assert not waited


@pytest.mark.slow
def test_a_lock_is_not_inherited_by_child_processes(cache):
    with cache.locked("key"):  # a child that keeps every descriptor it may inherit
        child = subprocess.Popen(["sleep", "60"], close_fds=False)  # outlives the holder
    try:
        with cache.locked("key") as waited:  # the child does not hold the lock open
            assert not waited
    finally:
        child.kill()
        child.wait()


def test_a_lock_path_that_is_a_directory_is_replaced_by_a_lock(cache):
    (cache.home / "locks" / "key.lock").mkdir()
    (cache.home / "locks" / "key.lock" / "inside").write_text("x")
    with cache.locked("key"):
        assert (cache.home / "locks" / "key.lock").is_file()


def test_a_lock_never_follows_a_symlink(cache, tmp_path):
    target = tmp_path / "precious"
    target.write_text("keep me")
    (cache.home / "locks" / "key.lock").symlink_to(target)
    with cache.locked("key"):
        assert not (cache.home / "locks" / "key.lock").is_symlink()
    assert target.read_text() == "keep me"


def test_a_lock_path_that_is_a_fifo_is_replaced_by_a_lock(cache):
    os.mkfifo(cache.home / "locks" / "key.lock")
    with cache.locked("key"):
        assert (cache.home / "locks" / "key.lock").is_file()


def test_an_artefact_is_checked_by_size_and_hash(tmp_path):
    path = tmp_path / "artefact"
    path.write_bytes(b"x" * 10000)
    record = artifact_record(path)
    assert artifact_problem(path, record, rehash=False) is None
    flip_bytes(path)  # same size, a new ctime: hashed again, and it differs
    assert "SHA-256 differs" in artifact_problem(path, record, rehash=False)
    path.write_bytes(b"x" * 10)
    assert "10 bytes, 10000 when it was built" in artifact_problem(path, record, rehash=False)
    path.unlink()
    assert "missing" in artifact_problem(path, record, rehash=False)


@pytest.mark.parametrize("record", [None, [], {}, {"size": "10", "sha256": "ab"}, {"size": 10}])
def test_a_record_of_the_wrong_shape_describes_nothing(tmp_path, record):
    path = tmp_path / "artefact"
    path.write_bytes(b"x" * 10)
    assert "record of artefact's size and SHA-256 is damaged" in artifact_problem(
        path, record, rehash=False
    )


def test_a_reused_descriptor_gets_a_new_name_for_the_same_file(tmp_path):
    path = tmp_path / "file"
    path.write_text("x")
    fd = os.open(path, os.O_RDONLY)
    try:
        names = [_fresh_name(fd) for _ in range(200)]
        assert len(set(names)) == 200
        assert max(len(name) for name in names) < 40  # grows with the cube root of the uses
        assert {os.stat(name).st_ino for name in names} == {os.fstat(fd).st_ino}
    finally:
        os.close(fd)


def test_a_private_copy_is_what_was_checked_under_a_name_never_opened_before(tmp_path):
    path = tmp_path / "artefact"
    path.write_bytes(b"built")
    record = artifact_record(path)
    with private_copy(path, record["sha256"]) as first:
        path.write_bytes(b"damaged")  # the copy is taken: the file may change now
        assert Path(first).read_bytes() == b"built"
    with pytest.raises(LoadError, match="changed after it was checked"), private_copy(
        path, record["sha256"]
    ):
        pass
    with private_copy(path) as second:
        assert second != first and second in opened_names()


def test_a_record_is_read_only_from_a_private_directory_and_as_a_json_object(cache):
    directory = cache.lib_dir("key")
    directory.mkdir(mode=0o700)
    assert read_record(directory, "build.json") == (None, "")
    (directory / "build.json").write_text('{"a": 1}')
    assert read_record(directory, "build.json") == ({"a": 1}, "")
    for damaged in ('{"a": ', "[1]", "null"):
        (directory / "build.json").write_text(damaged)
        assert read_record(directory, "build.json") == (None, "its record build.json is damaged")
    (directory / "build.json").write_text('{"a": 1}')
    directory.chmod(0o777)
    record, problem = read_record(directory, "build.json")
    assert record is None and "is not private: it is writable by other users" in problem


def test_publishing_replaces_a_build_whole_or_not_at_all(cache):
    directory = cache.lib_dir("key")
    with cache.locked("key"), cache.publishing("key", directory) as scratch:
        (scratch / "lib.so").write_text("first")
    assert (directory / "lib.so").read_text() == "first"
    with (
        pytest.raises(RuntimeError),
        cache.locked("key"),
        cache.publishing("key", directory) as scratch,
    ):
        (scratch / "lib.so").write_text("half")
        raise RuntimeError("the compiler failed")
    assert (directory / "lib.so").read_text() == "first"  # the failed build left nothing
    assert not list((cache.home / "tmp").iterdir())
    with cache.locked("key"), cache.publishing("key", directory) as scratch:
        (scratch / "lib.so").write_text("second")
    assert sorted(p.name for p in directory.iterdir()) == ["lib.so"]
    assert (directory / "lib.so").read_text() == "second"


def test_build_times_are_remembered_per_kind(cache):
    assert cache.last_seconds("operator observer") is None
    cache.record_seconds("operator observer", 63.24)
    cache.record_seconds("other", 2)
    assert cache.last_seconds("operator observer") == 63.2
    assert BuildCache().last_seconds("other") == 2
    for damaged in ("[1]", '{"operator observer": "63"}', "{"):
        (cache.home / "seconds.json").write_text(damaged)
        assert cache.last_seconds("operator observer") is None
    cache.record_seconds("operator observer", 5)  # a damaged file is replaced
    assert json.loads((cache.home / "seconds.json").read_text()) == {"operator observer": 5}


def test_progress_says_what_waits_how_long_so_far_and_what_the_last_build_took():
    waiting = BuildProgress("the operator observer", "waiting for the operator observer", 12.3)
    assert str(waiting) == "opmagic: waiting for the operator observer (12 s so far)"
    measured = BuildProgress("the operator observer", waiting.step, 12.3, expected=63.2)
    assert str(measured) == (
        "opmagic: waiting for the operator observer (12 s so far; the last build on this "
        "machine took 63 s)"
    )
    started = BuildProgress("the operator observer", waiting.step, 0.2, expected=63.2)
    assert str(started) == (
        "opmagic: waiting for the operator observer (the last build on this machine took 63 s)"
    )
    assert str(BuildProgress("libx.so", "linking", 1.25)) == "opmagic: libx.so: linking … 1.2 s"
    done = BuildProgress("libx.so", "linking", 2.0, finished=True)
    assert str(done) == "opmagic: built libx.so in 2 s"


class _Terminal:
    """A stderr that says it is a terminal and keeps what is written to it."""

    def __init__(self) -> None:
        self.text = ""

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> None:
        self.text += text

    def flush(self) -> None:
        pass


def test_progress_on_a_terminal_rewrites_one_line(monkeypatch):
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    show = StderrProgress()
    for elapsed in (1.0, 2.0):
        show(BuildProgress("the operator observer", "waiting for the operator observer", elapsed))
    show(BuildProgress("the operator observer", "", 3.0, finished=True))
    assert terminal.text == (
        "\r\x1b[2Kopmagic: waiting for the operator observer (1 s so far)"
        "\r\x1b[2Kopmagic: waiting for the operator observer (2 s so far)"
        "\r\x1b[2Kopmagic: built the operator observer in 3 s\n"
    )


def test_progress_in_a_log_names_each_step_with_its_own_duration(monkeypatch):
    """Not a terminal (a log, a pipe, a notebook's stderr): a line when a step starts, and
    one when it ends saying how long it took (not the time since the build started)."""
    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    show = StderrProgress()
    for step, elapsed in (("compiling", 0.0), ("compiling", 30.0), ("linking", 63.2)):
        show(BuildProgress("libx.so", step, elapsed, expected=60.0))
    show(BuildProgress("libx.so", "linking", 64.0, finished=True))
    assert log.getvalue().splitlines() == [
        "opmagic: libx.so: compiling … (the last build on this machine took 60 s)",
        "opmagic: libx.so: compiling took 63.2 s",
        "opmagic: libx.so: linking …",
        "opmagic: libx.so: linking took 800 ms",
        "opmagic: built libx.so in 64 s",
    ]
    show(BuildProgress("liby.so", "compiling", 0.0))  # the next build starts afresh
    assert log.getvalue().splitlines()[-1] == "opmagic: liby.so: compiling …"


def test_a_stopwatch_ticks_while_a_block_runs():
    events: list[BuildProgress] = []
    stopwatch = Stopwatch("libx.so", events.append, expected=4.0)
    stopwatch.report("compiling")
    finished = threading.Event()
    with stopwatch.ticking():
        while len(events) < 3:  # the ticks come from another thread
            finished.wait(0.05)
    count = len(events)
    finished.wait(0.6)
    assert len(events) == count  # no tick after the block
    assert all(e.step == "compiling" and e.expected == 4.0 for e in events)
    assert [e.elapsed for e in events] == sorted(e.elapsed for e in events)


class _Build(BackgroundBuild[str]):
    """A background build whose ``make`` runs when the test says so (real threads)."""

    library = "the test artefact"

    def __init__(self, outcomes: list[str | Exception], in_cache: bool = False) -> None:
        super().__init__()
        self.outcomes = outcomes  # what each make returns (or raises), in turn
        self.in_cache = in_cache
        self.go = threading.Event()
        self.makes = 0

    def make(self, stopwatch: Stopwatch) -> str:
        self.makes += 1
        stopwatch.report("making the test artefact")
        self.go.wait(30)
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def published(self) -> bool:
        return self.in_cache

    def expected_seconds(self) -> float | None:
        return 7.0


def test_a_background_build_is_waited_for_with_progress_and_made_once():
    build = _Build(["made"])
    thread = build.start()
    assert thread is not None and build.start() is None  # one build at a time
    events: list[BuildProgress] = []
    threading.Timer(0.8, build.go.set).start()
    assert build.get(events.append) == "made"
    thread.join()
    assert build.makes == 1 and build.get(events.append) == "made"
    waits = [e for e in events if not e.finished]
    assert len(waits) >= 3 and {e.step for e in waits} == {"waiting for the test artefact"}
    assert {e.expected for e in waits} == {7.0}  # what the last build took, as measured
    assert events[-1].finished and not events[-1].failed
    assert build.start() is None  # made: nothing to do


def test_a_published_build_is_not_started_but_made_by_the_first_get():
    build = _Build(["loaded"], in_cache=True)
    assert build.start() is None
    build.go.set()
    events: list[BuildProgress] = []
    assert build.get(events.append) == "loaded"
    assert [e.step for e in events] == ["making the test artefact"]  # reported, not waited


def test_a_failed_background_build_is_raised_to_its_waiters_then_tried_again():
    build = _Build([ValueError("the compiler failed"), "second try"])
    thread = build.start()
    threading.Timer(0.3, build.go.set).start()
    events: list[BuildProgress] = []
    with pytest.raises(ValueError, match="the compiler failed"):
        build.get(events.append)
    assert events[-1].failed
    thread.join()
    assert build.start() is None  # the failure is reported, not retried in the background
    assert build.get(None) == "second try" and build.makes == 2


def test_a_failed_background_build_nobody_waited_for_is_raised_once():
    build = _Build([ValueError("the compiler failed"), "second try"])
    build.go.set()
    build.start().join()
    with pytest.raises(ValueError, match="the compiler failed"):
        build.get(None)
    assert build.get(None) == "second try"
