"""The build pipeline with the real compiler: the cache, progress, options on the command
line, precompiled headers, ccache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from opmagic.native import BuildProgress, compile_library, precompile_headers
from opmagic.native.toolchain import find_toolchain

from .sources import op_source, stable_op_source

pytestmark = pytest.mark.slow  # compiles C++

ROOT = Path(__file__).resolve().parents[2]


def test_an_unchanged_source_is_served_from_the_cache(loaded):
    source = op_source("cl_cached")
    first = compile_library(source, progress=None)
    loaded.append(first)
    events: list[BuildProgress] = []
    again = compile_library(source, replace=first, progress=events.append)
    loaded.append(again)
    assert again.build.cached and again.build.directory == first.build.directory
    assert events == []  # nothing to report when nothing is built
    assert first.closed and torch.ops.cl_cached.scale(torch.ones(1)).item() == 2.0


def test_a_fresh_process_reuses_the_build(loaded):
    source = op_source("cl_fresh")
    loaded.append(compile_library(source, progress=None))
    script = textwrap.dedent(
        """
        import json, sys, torch
        from opmagic import compile_library
        library = compile_library(sys.stdin.read(), progress=None)
        value = torch.ops.cl_fresh.scale(torch.ones(1)).item()
        print(json.dumps({"cached": library.build.cached, "value": value}))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        input=source,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    report = json.loads(result.stdout)
    assert report["cached"] and report["value"] == 2.0  # loaded, not built again


def test_progress_reports_steps_with_elapsed_time_then_finishes(loaded):
    events: list[BuildProgress] = []
    loaded.append(compile_library(op_source("cl_progress"), progress=events.append))
    steps = [e.step for e in events]
    assert "compiling" in steps and "linking" in steps
    assert events[-1].finished and not events[-1].failed
    assert [e.elapsed for e in events] == sorted(e.elapsed for e in events)
    assert str(events[-1]).startswith("opmagic: built libcl_progress.so in ")


def test_verbose_prints_the_commands_and_force_rebuilds(loaded, capsys):
    source = op_source("cl_verbose")
    first = compile_library(source, progress=None)
    loaded.append(first)
    capsys.readouterr()
    again = compile_library(source, replace=first, force=True, verbose=True, progress=None)
    loaded.append(again)
    err = capsys.readouterr().err
    assert not again.build.cached
    assert "opmagic: built " in err and "$ " in err and "-c cl_verbose.cpp" in err
    assert "-shared" in err  # the link command


def test_options_reach_the_compiler(loaded, core_precompiled, tmp_path):
    include = tmp_path / "include"
    include.mkdir()
    (include / "factor.h").write_text("constexpr int kFactor = 7;\n")
    source = op_source(
        "cl_options",
        kernel='#include "factor.h"\nat::Tensor scale(const at::Tensor& x) '
        "{ return x.mul(kFactor + EXTRA); }",
    )
    library = compile_library(
        source, name="options_lib", include_dirs=[include], extra_cflags=["-DEXTRA=100"]
    )
    loaded.append(library)
    assert library.path.name == "liboptions_lib.so"
    assert torch.ops.cl_options.scale(torch.ones(1)).item() == 107.0
    assert "-DEXTRA=100" in library.build.commands[0]
    assert library.build.precompiled  # a macro torch's headers never test reuses the header

    # editing a header from include_dirs invalidates the cached build
    (include / "factor.h").write_text("constexpr int kFactor = 8;\n")
    rebuilt = compile_library(
        source,
        name="options_lib",
        include_dirs=[include],
        extra_cflags="-D EXTRA=100",  # one string works too
        replace=library,
        progress=None,
    )
    loaded.append(rebuilt)
    assert not rebuilt.build.cached
    assert torch.ops.cl_options.scale(torch.ones(1)).item() == 108.0


def test_a_gcc_without_a_shared_libstdcxx_links_the_process_one(loaded, tmp_path, monkeypatch):
    # the GPU machine's $CXX: a GCC whose libstdc++.so is a dangling symlink beside a real
    # libstdc++.a; ld.gold could not link, ld.bfd linked libstdc++ statically (a crash on load)
    static = subprocess.run(
        ["g++", "-print-file-name=libstdc++.a"], capture_output=True, text=True, check=False
    ).stdout.strip()
    if not os.path.isfile(static):
        pytest.skip("needs GCC's libstdc++.a")
    gcc = tmp_path / "gcc"
    gcc.mkdir()
    (gcc / "libstdc++.so").symlink_to("../missing/libstdc++.so.6")
    (gcc / "libstdc++.a").symlink_to(static)
    cxx = tmp_path / "g++"
    cxx.write_text(
        "#!/bin/sh\n"
        'case "$*" in *-print-file-name=libstdc++.so*) echo libstdc++.so; exit 0;; esac\n'
        f'exec g++ -L{gcc} "$@"\n'
    )
    cxx.chmod(0o755)
    monkeypatch.setenv("CXX", str(cxx))
    toolchain = find_toolchain()
    assert os.path.basename(toolchain.libstdcxx).startswith("libstdc++.so") and not toolchain.linker
    library = compile_library(op_source("cl_nostdcxx"), precompiled_headers=False, progress=None)
    loaded.append(library)
    assert torch.ops.cl_nostdcxx.scale(torch.ones(1)).item() == 2.0
    dynamic = subprocess.run(
        ["readelf", "-d", str(library.path)], capture_output=True, text=True, check=True
    ).stdout
    assert "[libstdc++.so.6]" in dynamic  # the shared one, not a static copy


def test_a_macro_that_changes_torch_headers_gets_its_own_precompiled_header(loaded):
    """GCC refuses a precompiled header built without a -D that the headers test (NDEBUG);
    the build still works, and the next one precompiles the headers with the flag (in the
    background: here, waited for). On the stable-ABI set: the smallest, ~5 s to precompile."""
    source = stable_op_source("cl_ndebug")
    precompile_headers([source])  # without the flag
    first = compile_library(source, extra_cflags=["-DNDEBUG"], progress=None)
    loaded.append(first)
    assert not first.build.precompiled
    assert "`NDEBUG' is defined" in first.build.note and "next build" in first.build.note
    precompile_headers([source], extra_cflags=["-DNDEBUG"])
    second = compile_library(
        source, extra_cflags=["-DNDEBUG"], force=True, replace=first, progress=None
    )
    loaded.append(second)
    assert second.build.precompiled
    assert torch.ops.cl_ndebug.fill(torch.ones(1)).item() == 2.0


def test_a_missing_precompiled_header_is_built_in_the_background_not_waited_for(loaded):
    """The first build of a header set parses the headers itself while a background process
    precompiles them; a build after that process is done uses them."""
    source = stable_op_source("cl_background")  # the smallest set: ~5 s to precompile
    first = compile_library(source, extra_cflags=["-fno-plt"], progress=None)  # a prefix of its own
    loaded.append(first)
    assert not first.build.precompiled
    assert "being precompiled in the background" in first.build.note
    precompile_headers([source], extra_cflags=["-fno-plt"])  # waits for that process
    second = compile_library(
        source, extra_cflags=["-fno-plt"], force=True, replace=first, progress=None
    )
    loaded.append(second)
    assert second.build.precompiled and second.build.headers_seconds == 0


def test_without_precompiled_headers(loaded):
    library = compile_library(
        op_source("cl_nopch"), precompiled_headers=False, opt_level=0, progress=None
    )
    loaded.append(library)
    assert not library.build.precompiled and library.build.header_set is None
    assert "precompiled headers disabled" in str(library)
    assert torch.ops.cl_nopch.scale(torch.ones(1)).item() == 2.0


def test_ccache_is_used_when_cxx_names_it(loaded, tmp_path, monkeypatch):
    """With CXX="ccache g++", compiles run through it with CCACHE_BASEDIR at the cache
    (installed but not named, it is not used: a miss costs more than it saves)."""
    log = tmp_path / "ccache.log"
    fake = tmp_path / "bin" / "ccache"
    fake.parent.mkdir()
    fake.write_text(
        f'#!/bin/sh\necho "$CCACHE_BASEDIR|$CCACHE_SLOPPINESS|$*" >> {log}\nexec "$@"\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    assert find_toolchain().ccache is None
    monkeypatch.setenv("CXX", f"{fake} g++")
    library = compile_library(op_source("cl_ccache"), force=True, progress=None)
    loaded.append(library)
    basedir, sloppiness, command = log.read_text().strip().split("|")
    assert Path(basedir) == Path(os.environ["XDG_CACHE_HOME"]) / "opmagic" / "v1"
    assert "pch_defines" in sloppiness and "time_macros" in sloppiness
    assert "-c cl_ccache.cpp" in command
    assert library.build.commands[0].startswith(str(fake))


def test_a_first_build_starts_the_background_precompile_after_its_compile(
    loaded, tmp_path, monkeypatch
):
    """Beside the compile, the precompile slowed it (in wall time) on a 2-core machine: the
    compiler sees no precompiling process; once the build is done, one is at work (or done)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    seen = tmp_path / "seen.log"
    launcher = tmp_path / "bin" / "launcher"  # $CXX's launcher, as ccache is
    launcher.parent.mkdir()
    launcher.write_text(  # at the source's compile: which precompiles are at work
        f'#!/bin/sh\ncase "$*" in *"-c cl_after.cpp"*)\n'
        f"  ls {cache}/opmagic/*/prefix/*/precompiling.pid >> {seen} 2>/dev/null\n"
        f"  echo compiling >> {seen};;\nesac\n"
        'exec "$@"\n'
    )
    launcher.chmod(0o755)
    monkeypatch.setenv("CXX", f"{launcher} g++")
    source = stable_op_source("cl_after")
    library = compile_library(source, progress=None)
    loaded.append(library)
    assert seen.read_text().splitlines() == ["compiling"]  # no precompile beside it
    assert list(cache.glob("**/prefix/*/precompiling.pid")) or list(cache.glob("**/*.gch"))
    precompile_headers([source])  # waits for it
    assert len(list(cache.glob("**/prefix/*/prefix.h.gch"))) == 1
