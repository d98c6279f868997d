"""A damaged, hostile, read-only or full build cache: what is wrong is named or rebuilt, never
trusted. Loading a damaged library could end the process, so those builds run in children."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from opmagic._torch import op_observer
from opmagic.cachedir import artifact_problem, artifact_record, remove_path
from opmagic.native import compile_library, precompile_headers

from .sources import op_source, stable_op_source, stable_scale_source

pytestmark = pytest.mark.slow  # compiles C++

ROOT = Path(__file__).resolve().parents[2]
# builds the source on stdin (keywords as JSON in argv[1]), calls its op, reports as JSON
_CHILD = textwrap.dedent(
    """
    import json, sys, torch
    from opmagic import compile_library
    from opmagic.errors import OpmagicError
    from opmagic.native import precompile_headers
    from opmagic.cachedir import cache_root
    source, keywords = sys.stdin.read(), json.loads(sys.argv[1])
    then_precompile = keywords.pop("then_precompile", False)
    try:
        library = compile_library(source, progress=None, **keywords)
        if then_precompile:  # wait for the background precompile, then precompile here
            precompile_headers([source])
    except OpmagicError as error:
        failed = [str(p) for p in cache_root().rglob("failed.log")]  # precompiling disabled
        print(json.dumps({"error": type(error).__name__, "message": str(error), "failed": failed}))
        raise SystemExit(0)
    namespace = library.namespaces[0]
    value = getattr(torch.ops, namespace).scale(torch.ones(1)).item()
    print(json.dumps({"cached": library.build.cached, "repaired": library.build.repaired,
                      "value": value, "directory": str(library.build.directory),
                      "summary": " ".join(str(library).split())}))  # unwrapped
    """
)


def _build_in_child(
    source: str, prefix: tuple[str, ...] = (), env: dict[str, str] | None = None, **keywords
) -> dict:
    """Build ``source`` in a fresh process (run under ``prefix``, e.g. unshare); its report."""
    result = subprocess.run(
        [*prefix, sys.executable, "-c", _CHILD, json.dumps(keywords)],
        input=source,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


def _flip_bytes(path: Path) -> None:
    """Invert a run of bytes in the middle of a file (its size stays)."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 4096] = bytes(b ^ 0xFF for b in data[middle : middle + 4096])
    path.write_bytes(bytes(data))


def _damage(kind: str, library: Path, other: Path) -> None:
    """Damage a published library the way issue 12 found opmagic trusting."""
    if kind == "truncated to half":
        library.write_bytes(library.read_bytes()[: library.stat().st_size // 2])
    elif kind == "bytes flipped":
        _flip_bytes(library)
    elif kind == "truncated to 0":
        library.write_bytes(b"")
    elif kind == "deleted":
        library.unlink()
    elif kind == "another build's library":
        shutil.copyfile(other, library)
    elif kind == "record damaged":
        (library.parent / "build.json").write_text('{"header_set": ')
    elif kind == "directory open to others":
        library.parent.chmod(0o777)


@pytest.fixture(scope="module")
def stable_headers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stable-ABI headers (what ``stable_scale_source`` includes: the smallest set)
    precompiled once, in a home of their own: the one prefix directory there."""
    home = tmp_path_factory.mktemp("stable-headers")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(home))
        precompile_headers([stable_scale_source("cf_stable")])
    (directory,) = home.glob("opmagic/v1/prefix/*/")
    return directory


def _home_with_headers(home: Path, stable_headers: Path) -> Path:
    """``home`` as a fresh cache home that holds a copy of the stable headers precompiled:
    what a test checks there is not the precompile, which would cost a compile without
    headers and a background precompile for each fresh home (a copy, not a link: tests
    damage and chmod it)."""
    shutil.copytree(stable_headers, home / "opmagic" / "v1" / "prefix" / stable_headers.name)
    return home


@pytest.fixture(scope="module")
def other_library(build_cache) -> Path:
    """A published library of another source (to put in place of a damaged one)."""
    library = compile_library(op_source("cf_other"), progress=None)
    library.close()
    return library.path


@pytest.mark.parametrize(
    "kind",
    [
        "truncated to half",
        "bytes flipped",
        "truncated to 0",
        "deleted",
        "another build's library",
        "record damaged",
        "directory open to others",
    ],
)
def test_a_damaged_build_is_rebuilt_with_a_note(loaded, other_library, kind):
    namespace = "cf_" + kind.replace(" ", "_").replace("'", "")
    source = op_source(namespace)
    first = compile_library(source, progress=None)
    first.close()
    _damage(kind, first.path, other_library)
    report = _build_in_child(source)  # loading a damaged library could end the process
    assert report["value"] == 2.0 and not report["cached"]
    assert report["repaired"], report
    assert "found damaged in the cache" in report["summary"]
    loaded.append(compile_library(source, progress=None))
    assert loaded[-1].build.cached and not loaded[-1].build.repaired


# traces in a fresh process; reports the calls, and every file mapped whose name has the
# observer's library's in it (the loaded copy of it, as "inode path")
_OBSERVER_CHILD = textwrap.dedent(
    """
    import json, torch, opmagic
    from opmagic._torch import op_observer
    t = opmagic.trace(torch.add, torch.ones(2), torch.ones(2))
    mapped = {" ".join(line.split()[4:]) for line in open("/proc/self/maps")
              if op_observer.LIBRARY in line}
    print(json.dumps({"ops": [call.op for call in t.calls], "mapped": sorted(mapped)}))
    """
)


def _trace_in_child(cache_home: Path) -> tuple[dict, str]:
    """Trace in a fresh process with ``cache_home`` as its XDG cache: its report and stderr."""
    result = subprocess.run(
        [sys.executable, "-c", _OBSERVER_CHILD],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(cache_home)},
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1]), result.stderr


@pytest.fixture(scope="module")
def observer_cache(tmp_path_factory) -> Path:
    """A cache home in which a trace built the observer (tests damage copies of it; torch's
    ccache, in the same home, makes their rebuilds quick where ccache is installed)."""
    home = tmp_path_factory.mktemp("observer-cache")
    _trace_in_child(home)
    return home


def _observer_copy(observer_cache: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the cache home the observer was built in: the home, and its library."""
    home = tmp_path / "home"
    shutil.copytree(observer_cache, home, symlinks=True)
    (library,) = home.glob("opmagic/v1/observer/*/opmagic_op_observer.so")
    return home, library


@pytest.mark.parametrize(
    ("kind", "found"),
    [
        ("truncated to half", "bytes, "),
        ("bytes flipped", "its SHA-256 differs"),
        ("deleted", "opmagic_op_observer.so is missing"),
        ("another build's library", "bytes, "),
        ("record damaged", "its record build.json is damaged"),
        ("directory open to others", "is not private: it is writable by other users"),
    ],
)
def test_a_damaged_observer_is_found_before_anything_of_it_is_loaded(
    observer_cache, other_library, tmp_path, kind, found
):
    """The check every trace's load makes, in this process: it refuses before mapping."""
    _, library = _observer_copy(observer_cache, tmp_path)
    _damage(kind, library, other_library)
    module, damage = op_observer._load(library.parent)
    assert module is None and found in damage, damage
    assert str(library.parent) not in Path("/proc/self/maps").read_text()


def test_a_damaged_observer_is_rebuilt_not_loaded(observer_cache, other_library, tmp_path):
    """A trace in a fresh process rebuilds a damaged observer and loads only the rebuilt one
    (the damage kinds above all take this path; a rebuild costs a compile, so once here)."""
    home, library = _observer_copy(observer_cache, tmp_path)
    _damage("bytes flipped", library, other_library)
    report, log = _trace_in_child(home)  # loading a damaged library could end the process
    assert report["ops"] == ["aten::add.Tensor"]
    damage = log.partition("the cached one is damaged (")[2]
    assert "its SHA-256 differs" in damage.partition(")")[0], log  # found before any load
    (mapped,) = report["mapped"]  # one load: a checked copy of the rebuilt library
    assert "/memfd:opmagic-opmagic_op_observer.so" in mapped
    record = json.loads((library.parent / "build.json").read_text())
    assert artifact_problem(library, record["library"], rehash=True) is None
    assert not list(home.glob("opmagic/v1/tmp/*"))


def test_an_observer_that_does_not_load_is_rebuilt(observer_cache, other_library, tmp_path):
    home, library = _observer_copy(observer_cache, tmp_path)
    shutil.copyfile(other_library, library)  # a library, but not the observer: recorded as it
    record_file = library.parent / "build.json"
    record = json.loads(record_file.read_text())
    record_file.write_text(json.dumps({**record, "library": artifact_record(library)}))
    report, log = _trace_in_child(home)
    assert report["ops"] == ["aten::add.Tensor"]
    assert "the cached one is damaged (it does not load: " in log, log


def _unshare_works() -> bool:
    """Whether this machine lets a process mount file systems in a namespace of its own."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", "mount -t tmpfs tmpfs /mnt"], capture_output=True
    )
    return probe.returncode == 0


needs_mounts = pytest.mark.skipif(
    not _unshare_works(), reason="needs unshare -rm (user and mount namespaces) to mount"
)


def _read_only_cache(cache_home: Path) -> tuple[str, ...]:
    """A command prefix that runs the command with ``cache_home`` mounted read-only."""
    script = f'mount --bind "{cache_home}" "{cache_home}" && '
    script += f'mount -o remount,bind,ro "{cache_home}" && exec "$@"'
    return ("unshare", "-rm", "sh", "-c", script, "sh")


@needs_mounts
def test_a_read_only_cache_serves_hits_and_names_itself_on_a_miss(build_cache):
    source = op_source("cf_read_only")
    assert _build_in_child(source)["value"] == 2.0
    read_only = _read_only_cache(build_cache)
    hit = _build_in_child(source, read_only)
    assert hit["cached"] and hit["value"] == 2.0
    miss = _build_in_child(op_source("cf_read_only_miss"), read_only)
    assert miss["error"] == "CacheDirectoryError"
    assert "is read-only" in miss["message"] and "XDG_CACHE_HOME" in miss["message"]


@needs_mounts
def test_a_cache_that_cannot_be_created_says_it_is_read_only(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    report = _build_in_child(
        op_source("cf_cannot_create"), _read_only_cache(empty), {"XDG_CACHE_HOME": str(empty)}
    )
    assert report["error"] == "CacheDirectoryError"
    assert "read-only" in report["message"] and "create its directories" in report["message"]


def _full_disk(size: str, directory: Path) -> tuple[str, ...]:
    """A command prefix that runs the command with a ``size`` tmpfs mounted on ``directory``."""
    script = f'mount -t tmpfs -o size={size} tmpfs "{directory}" && exec "$@"'
    return ("unshare", "-rm", "sh", "-c", script, "sh")


@needs_mounts
def test_a_full_disk_is_named_and_disables_nothing(tmp_path):
    home = tmp_path / "small"
    home.mkdir()
    env = {"XDG_CACHE_HOME": str(home), "TMPDIR": str(home)}
    # 20 MB: the library fits, a precompiled header (the stable set's, about 80 MB) does not:
    # neither the background precompile the build starts nor the one precompile_headers runs
    full = _build_in_child(
        stable_op_source("cf_full"), _full_disk("20m", home), env, then_precompile=True
    )
    assert full["error"] == "CacheFullError", full
    assert "No space left on device" in full["message"]
    assert "precompiling the stable torch headers" in full["message"]
    assert full["failed"] == []  # the next build precompiles them again
    # without precompiled headers the library's own files do not fit in 200 KB
    tiny = _build_in_child(
        op_source("cf_tiny"), _full_disk("300k", home), env, precompiled_headers=False
    )
    assert tiny["error"] == "CacheFullError", tiny
    assert "No space left on device" in tiny["message"]


def test_a_damaged_precompiled_header_is_rebuilt_and_force_rebuilds_a_forged_one(
    tmp_path, monkeypatch
):
    """On the stable-ABI headers: the smallest set, precompiled in ~5 s (the core set: ~20 s,
    and the background rebuild is waited for)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # precompiled headers of its own
    precompile_headers([stable_op_source("cf_pch_first")])
    libraries = [compile_library(stable_op_source("cf_pch_first"), progress=None)]
    assert libraries[0].build.precompiled
    (precompiled,) = tmp_path.glob("opmagic/v1/prefix/*/prefix.h.gch")
    try:
        precompiled.write_bytes(precompiled.read_bytes()[:1000])  # GCC: "cannot read PCH file"
        libraries.append(compile_library(stable_op_source("cf_pch_truncated"), progress=None))
        build = libraries[-1].build  # built without it (removed), rebuilt in the background
        assert "precompiled stable headers damaged" in build.repaired, build.repaired
        assert "rebuilding in the background" in build.repaired
        assert not build.precompiled
        marker = precompiled.with_name("precompiling.pid")
        while marker.exists():  # the background rebuild
            time.sleep(0.2)
        record = json.loads(precompiled.with_name("precompiled.json").read_text())
        assert artifact_problem(precompiled, record, rehash=True) is None  # its record is true
        precompile_headers([stable_op_source("cf_pch_first")])  # nothing left to do
        libraries.append(compile_library(stable_op_source("cf_pch_after"), progress=None))
        assert libraries[-1].build.precompiled and not libraries[-1].build.repaired

        _flip_bytes(precompiled)  # GCC crashes on it; the record is forged to match its stat
        record_file = precompiled.with_name("precompiled.json")
        record = json.loads(record_file.read_text())
        record["stat"] = [
            *record["stat"][:2],
            precompiled.stat().st_mtime_ns,
            precompiled.stat().st_ctime_ns,
        ]
        record_file.write_text(json.dumps(record))
        libraries.append(
            compile_library(stable_op_source("cf_pch_forged"), force=True, progress=None)
        )
        assert "SHA-256 differs" in libraries[-1].build.repaired
        assert not libraries[-1].build.precompiled  # GCC never read the forged one
    finally:
        for library in libraries:
            library.close()


@pytest.mark.slow
@pytest.mark.parametrize(
    "shape",
    ["{}", "null", "[]", '"text"', "missing commands", "inputs of numbers", "library null"],
)
def test_a_record_of_the_wrong_shape_is_rebuilt_with_a_note(loaded, shape):
    source = op_source("cf_shape_" + "".join(c for c in shape if c.isalnum()))
    first = compile_library(source, progress=None)
    first.close()
    record_file = first.path.parent / "build.json"
    record = json.loads(record_file.read_text())
    damaged = {
        "missing commands": {k: v for k, v in record.items() if k != "commands"},
        "inputs of numbers": {**record, "inputs": [1, 2]},
        "library null": {**record, "library": None},
    }
    record_file.write_text(json.dumps(damaged[shape]) if shape in damaged else shape)
    for _ in range(2):  # not wedged: rebuilt, then a cache hit
        replace = loaded[-1] if loaded else None
        loaded.append(compile_library(source, progress=None, replace=replace))
    assert not loaded[0].build.cached and "build.json" in loaded[0].build.repaired
    assert loaded[1].build.cached and torch_scale(loaded[1]) == 2.0


def torch_scale(library) -> float:
    """What the library's scale op makes of a one."""
    return getattr(torch.ops, library.namespaces[0]).scale(torch.ones(1)).item()


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("used.json", '[1, {"a": 2}, ["core", 5], ["nope", ["classic"]], ["core"]]'),
        ("used.json", '{"core": ["classic"]}'),
        ("used.json", "null"),
        ("seconds.json", "[1, 2]"),
    ],
)
def test_a_damaged_record_of_the_cache_never_stops_load_ext(tmp_path, monkeypatch, name, text):
    from opmagic.native import headers

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    started = []
    monkeypatch.setattr(headers, "start_in_background", lambda jobs, cache: started.extend(jobs))
    cache = headers.BuildCache()
    directory = cache.home / "prefix" if name == "used.json" else cache.home
    (directory / name).write_text(text)
    headers.precompile_headers_in_background()  # what %load_ext opmagic runs
    assert len(started) == len(headers.FIRST_WARM_UP)  # nothing usable was recorded
    assert cache.last_seconds("headers") is None


def test_other_records_of_the_wrong_shape_read_as_missing(tmp_path):
    from opmagic.native.headers import _recorded_macros

    for text in ("5", '{"A": 1}', "[1, null]", "not json"):
        (tmp_path / "macros.json").write_text(text)
        assert _recorded_macros(tmp_path / "macros.json") == set()


def _without_root_overrides() -> tuple[str, ...]:
    """A command prefix that runs a child without root's power to read and write anything
    (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH dropped), so file modes hold for it."""
    if os.geteuid() != 0:
        return ()
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv (util-linux) to drop root's file-access overrides")
    return ("setpriv", "--bounding-set", "-dac_override,-dac_read_search")


@pytest.mark.slow
@pytest.mark.parametrize("target", ["tmp", "libs"])
def test_a_cache_directory_it_may_not_write_is_named(tmp_path, target, stable_headers):
    home = _home_with_headers(tmp_path / "home", stable_headers)
    env = {"XDG_CACHE_HOME": str(home)}
    assert _build_in_child(stable_scale_source("cf_perm_first"), (), env)["value"] == 2.0
    directory = home / "opmagic" / "v1" / target
    directory.chmod(0o500)
    try:
        report = _build_in_child(
            stable_scale_source("cf_perm_" + target), _without_root_overrides(), env
        )
    finally:
        directory.chmod(0o700)
    assert report["error"] == "CacheDirectoryError", report
    assert f"is read-only for you at {directory}" in report["message"]
    assert "chmod -R u+rwX" in report["message"]


@pytest.mark.slow
@pytest.mark.parametrize("target", ["library", "its directory", "the precompiled header"])
def test_an_unreadable_artefact_is_rebuilt_with_a_note(tmp_path, target, stable_headers):
    home = _home_with_headers(tmp_path / "home", stable_headers)
    env = {"XDG_CACHE_HOME": str(home)}
    source = stable_scale_source("cf_unreadable")
    first = _build_in_child(source, (), env)
    library = next(Path(first["directory"]).glob("lib*.so"))
    path = {
        "library": library,
        "its directory": library.parent,
        "the precompiled header": next(home.glob("opmagic/v1/prefix/*/prefix.h.gch"), None),
    }[target]
    path.chmod(0)
    try:
        report = _build_in_child(
            stable_scale_source("cf_unreadable_2")
            if target == "the precompiled header"
            else source,
            _without_root_overrides(),
            env,
        )
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.chmod(0o700)
    assert report.get("value") == 2.0, report
    assert "cannot be read (Permission denied)" in report["summary"], report


@pytest.mark.slow
def test_symlinks_planted_in_the_cache_never_make_it_write_outside(tmp_path, stable_headers):
    home, outside = _home_with_headers(tmp_path / "home", stable_headers), tmp_path / "outside"
    outside.mkdir()
    env = {"XDG_CACHE_HOME": str(home)}
    source = stable_scale_source("cf_planted")
    first = _build_in_child(source, (), env)
    directory = Path(first["directory"])
    (directory / "probe.json").unlink()  # the next load probes again, and records it
    for name in ("probe.json", "loads"):
        remove_path(directory / name)
        (directory / name).symlink_to(outside / name)
    (outside / "loads").mkdir()
    again = _build_in_child(source, (), env)  # a failing precompile, in the background too
    assert again["cached"] and again["value"] == 2.0
    broken = "-include /nonexistent/opmagic.h"  # the compile and its precompile fail at once
    known = set(home.glob("opmagic/v1/prefix/*/"))
    assert _build_in_child(stable_scale_source("cf_planted_1"), (), env, extra_cflags=broken)[
        "error"
    ]
    _wait_for_background_precompiles(home)
    (prefix,) = set(home.glob("opmagic/v1/prefix/*/")) - known  # that of the broken flags
    (prefix / "failed.log").unlink()  # it failed: the next build of those flags tries again
    for name in ("precompiling.log", "failed.log.partial", "precompiled.json.partial"):
        (prefix / name).symlink_to(outside / name)
    assert _build_in_child(stable_scale_source("cf_planted_2"), (), env, extra_cflags=broken)[
        "error"
    ]
    _wait_for_background_precompiles(home)
    assert (prefix / "failed.log").is_file()  # it wrote what it writes, where it belongs
    assert sorted(p.name for p in outside.rglob("*")) == ["loads"]  # nothing written outside


def _wait_for_background_precompiles(home: Path) -> None:
    """Until no background precompile of the cache in ``home`` runs."""
    deadline = time.monotonic() + 120
    while list(home.glob("opmagic/v1/prefix/*/precompiling.pid")):
        assert time.monotonic() < deadline, "the background precompile did not end"
        time.sleep(0.2)


# kills the compiler of a precompile (as the OOM killer does), then builds: argv[1] "kill"
# does both, "build" only builds; reports the build's note and the failure log's head
_KILLED_CHILD = textwrap.dedent(
    """
    import json, os, signal, sys, threading, time
    from pathlib import Path
    from opmagic import compile_library
    from opmagic.cachedir import cache_root
    from opmagic.native import precompile_headers
    source = sys.stdin.read()

    def kill_cc1plus():
        while True:
            for entry in Path("/proc").iterdir():
                try:
                    command = (entry / "cmdline").read_bytes()
                except OSError:
                    continue
                if b"cc1plus" in command and str(cache_root()).encode() in command:
                    os.kill(int(entry.name), signal.SIGKILL)
                    return
            time.sleep(0.05)

    def stop_background():
        for marker in cache_root().rglob("precompiling.pid"):
            os.killpg(int(marker.read_text()), signal.SIGKILL)
            marker.unlink()

    if sys.argv[1] == "kill":
        threading.Thread(target=kill_cc1plus, daemon=True).start()
        precompile_headers([source])
    (failed,) = cache_root().rglob("failed.log")
    log = failed.read_text()
    notes = []
    for namespace in ("cf_killed_a", "cf_killed_b"):
        library = compile_library(source.replace("cf_killed", namespace), progress=None)
        notes.append(library.build.note)
        library.close()
        stop_background()
        if not failed.exists():
            failed.write_text(log)  # killed again
    print(json.dumps({"log": log[-300:], "notes": notes}))
    """
)


@pytest.mark.slow
def test_a_precompile_killed_by_the_oom_killer_is_tried_again_once_per_process(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path)}
    reports = []
    for action in ("kill", "build"):  # the second: a new process
        result = subprocess.run(
            [sys.executable, "-c", _KILLED_CHILD, action],
            input=stable_op_source("cf_killed"),  # the smallest set: its builds are quick
            capture_output=True,
            text=True,
            env=env,
            check=False,
            timeout=900,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        reports.append(json.loads(result.stdout.splitlines()[-1]))
    killed, later = reports
    assert "Killed signal terminated program cc1plus" in killed["log"]
    for report in (killed, later):  # once per process: the next build of that process says so
        first, second = report["notes"]
        assert "the last precompile was killed: 'Killed signal terminated program" in first
        assert "tried again, once per process" in first
        assert second.startswith("precompiling failed: "), second
