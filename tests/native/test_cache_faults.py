"""A damaged, hostile, read-only or full build cache: what is wrong is named or rebuilt, never
trusted. Loading a damaged library could end the process, so those builds run in children."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from opmagic.cachedir import artifact_problem, artifact_record
from opmagic.native import compile_library, precompile_headers

from .sources import op_source

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
def test_a_damaged_observer_is_rebuilt_not_loaded(
    observer_cache, other_library, tmp_path, kind, found
):
    home = tmp_path / "home"
    shutil.copytree(observer_cache, home, symlinks=True)
    (library,) = home.glob("opmagic/v1/observer/*/opmagic_op_observer.so")
    _damage(kind, library, other_library)
    report, log = _trace_in_child(home)  # loading a damaged library could end the process
    assert report["ops"] == ["aten::add.Tensor"]
    damage = log.partition("the cached one is damaged (")[2]
    assert found in damage.partition(")")[0], log  # found before anything was loaded
    (mapped,) = report["mapped"]  # one load: a checked copy of the rebuilt library
    assert "/memfd:opmagic-opmagic_op_observer.so" in mapped
    record = json.loads((library.parent / "build.json").read_text())
    assert artifact_problem(library, record["library"], rehash=True) is None
    assert not list(home.glob("opmagic/v1/tmp/*"))


def test_an_observer_that_does_not_load_is_rebuilt(observer_cache, other_library, tmp_path):
    home = tmp_path / "home"
    shutil.copytree(observer_cache, home, symlinks=True)
    (library,) = home.glob("opmagic/v1/observer/*/opmagic_op_observer.so")
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
    # 20 MB: the library fits, a precompiled header (about 300 MB) does not: neither the
    # background precompile the build starts nor the one precompile_headers then runs
    full = _build_in_child(op_source("cf_full"), _full_disk("20m", home), env, then_precompile=True)
    assert full["error"] == "CacheFullError", full
    assert "No space left on device" in full["message"]
    assert "precompiling the core torch headers" in full["message"]
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
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # precompiled headers of its own
    precompile_headers([op_source("cf_pch_first")])
    libraries = [compile_library(op_source("cf_pch_first"), progress=None)]
    assert libraries[0].build.precompiled
    (precompiled,) = tmp_path.glob("opmagic/v1/prefix/*/prefix.h.gch")
    try:
        precompiled.write_bytes(precompiled.read_bytes()[:1000])  # GCC: "cannot read PCH file"
        libraries.append(compile_library(op_source("cf_pch_truncated"), progress=None))
        build = libraries[-1].build  # built without it (removed), rebuilt in the background
        assert "precompiled core headers damaged" in build.repaired, build.repaired
        assert "rebuilding in the background" in build.repaired
        assert not build.precompiled
        marker = precompiled.with_name("precompiling.pid")
        while marker.exists():  # the background rebuild
            time.sleep(0.2)
        record = json.loads(precompiled.with_name("precompiled.json").read_text())
        assert artifact_problem(precompiled, record, rehash=True) is None  # its record is true
        precompile_headers([op_source("cf_pch_first")])  # nothing left to do
        libraries.append(compile_library(op_source("cf_pch_after"), progress=None))
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
        libraries.append(compile_library(op_source("cf_pch_forged"), force=True, progress=None))
        assert "SHA-256 differs" in libraries[-1].build.repaired
        assert not libraries[-1].build.precompiled  # GCC never read the forged one
    finally:
        for library in libraries:
            library.close()
