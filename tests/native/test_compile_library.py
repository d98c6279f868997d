"""compile_library with the real compiler and the real dispatcher: build, load, replace, close."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import opmagic
from opmagic._torch import dispatcher
from opmagic.native import BuildProgress, compile_library

from .sources import MINIMAL_INCLUDES, op_source

ROOT = Path(__file__).resolve().parents[2]


def _schema(name: str) -> str | None:
    """The schema the dispatcher has for an operator's default overload, if any."""
    schema = dispatcher.find_schema(name, "")
    return None if schema is None else str(schema)


def test_a_library_registers_its_ops_and_reports_what_it_added(loaded):
    library = compile_library(op_source("cl_basic"), progress=None)
    loaded.append(library)

    assert torch.equal(torch.ops.cl_basic.scale(torch.ones(2)), torch.full((2,), 2.0))
    assert [(op.name, op.schema, op.line) for op in library.operators] == [
        ("cl_basic::scale", "cl_basic::scale(Tensor x) -> Tensor", 4)
    ]
    assert [(k.op, k.key, k.is_alias, k.line) for k in library.kernels] == [
        ("cl_basic::scale", "CPU", False, 10)
    ]
    assert [str(b) for b in library.blocks] == [
        "TORCH_LIBRARY(cl_basic)",
        "TORCH_LIBRARY_IMPL(cl_basic, CPU)",
    ]
    assert library.build.header_set == "core" and library.build.precompiled
    text = str(library)
    assert "cl_basic::scale(Tensor x) -> Tensor  cl_basic.cpp, line 4" in text
    assert "CPU" in text and "cl_basic.cpp, line 10" in text  # kernels, and the dispatch table
    html = library._repr_html_()
    assert "cl_basic::scale(Tensor x) -&gt; Tensor" in html and "<table>" in html
    assert opmagic.dispatch_table("cl_basic::scale")["CPU"].source == "cl_basic.cpp, line 10"


def test_close_unregisters_everything(build_cache):
    library = compile_library(op_source("cl_close"), progress=None)
    packet = torch.ops.cl_close.scale  # cached by torch.ops until opmagic drops it
    assert packet(torch.ones(1)).item() == 2.0
    library.close()
    library.close()  # idempotent
    assert _schema("cl_close::scale") is None
    assert not any(n.startswith("cl_close::") for n in dispatcher.all_op_names())
    assert not hasattr(torch.ops.cl_close, "scale")
    assert library.tables() == [] and "unregistered" in str(library)


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


def test_a_fresh_process_reuses_the_build_in_a_fraction_of_a_second(loaded):
    source = op_source("cl_fresh")
    loaded.append(compile_library(source, progress=None))
    script = textwrap.dedent(
        """
        import json, sys, time, torch
        from opmagic import compile_library
        started = time.perf_counter()
        library = compile_library(sys.stdin.read(), progress=None)
        seconds = time.perf_counter() - started
        value = torch.ops.cl_fresh.scale(torch.ones(1)).item()
        print(json.dumps({"cached": library.build.cached, "seconds": seconds, "value": value}))
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
    assert report["cached"] and report["value"] == 2.0
    assert report["seconds"] < 1.0  # a rebuild takes > 1.5 s even with precompiled headers


def test_replacing_swaps_schema_and_kernel(loaded):
    old = compile_library(op_source("cl_swap"), progress=None)
    new = compile_library(
        op_source(
            "cl_swap",
            schema="scale(Tensor x, int k) -> Tensor",
            kernel="at::Tensor scale(const at::Tensor& x, int64_t k) { return x.mul(k); }",
        ),
        replace=old,
        progress=None,
    )
    loaded.append(new)
    assert old.closed and not new.closed
    assert _schema("cl_swap::scale") == "cl_swap::scale(Tensor x, int k) -> Tensor"
    assert torch.ops.cl_swap.scale(torch.ones(1), 5).item() == 5.0
    old.close()  # closing a replaced library does not touch its successor
    assert torch.ops.cl_swap.scale(torch.ones(1), 3).item() == 3.0


def test_handles_held_by_other_libraries_survive_a_replacement(loaded):
    """A ``static auto op = findSchemaOrThrow(...)`` in one library points into the
    dispatcher's entry of an operator another library defines: replacing that library must
    keep the entry alive, so the handle calls the new kernel instead of freed memory."""
    base = compile_library(
        op_source("cl_base", kernel="at::Tensor scale(const at::Tensor& x) { return x.add(1); }"),
        progress=None,
    )
    caller = compile_library(
        MINIMAL_INCLUDES
        + textwrap.dedent(
            """
            #include <ATen/core/dispatch/Dispatcher.h>
            at::Tensor twice_base(const at::Tensor& x) {
              static auto op = c10::Dispatcher::singleton()
                  .findSchemaOrThrow("cl_base::scale", "")
                  .typed<at::Tensor(const at::Tensor&)>();
              return op.call(op.call(x));
            }
            TORCH_LIBRARY(cl_caller, m) {
              m.def("twice_base(Tensor x) -> Tensor");
            }
            TORCH_LIBRARY_IMPL(cl_caller, CPU, m) {
              m.impl("twice_base", twice_base);
            }
            """
        ),
        progress=None,
    )
    loaded.append(caller)
    assert torch.ops.cl_caller.twice_base(torch.zeros(1)).item() == 2.0
    base = compile_library(
        op_source("cl_base", kernel="at::Tensor scale(const at::Tensor& x) { return x.add(10); }"),
        replace=base,
        progress=None,
    )
    loaded.append(base)
    assert torch.ops.cl_caller.twice_base(torch.zeros(1)).item() == 20.0


def test_a_pybind11_extension_source_compiles_and_registers(loaded):
    """A setup.py CppExtension source: torch/extension.h, TORCH_EXTENSION_NAME, a module."""
    source = textwrap.dedent(
        """\
        #include <torch/extension.h>

        torch::Tensor halve(const torch::Tensor& x) {
          return x / 2;
        }

        PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
          m.def("halve", &halve, "x / 2");
        }

        TORCH_LIBRARY(cl_pybind, m) {
          m.def("halve(Tensor x) -> Tensor");
        }

        TORCH_LIBRARY_IMPL(cl_pybind, CPU, m) {
          m.impl("halve", halve);
        }
        """
    )
    library = compile_library(source, progress=None)
    loaded.append(library)
    assert library.build.header_set == "extension"
    assert "-DTORCH_EXTENSION_NAME=cl_pybind" in library.build.commands[0]
    assert torch.ops.cl_pybind.halve(torch.full((2,), 3.0)).tolist() == [1.5, 1.5]


def test_a_c_extension_module_source_compiles_and_registers(loaded):
    source = textwrap.dedent(
        """\
        #include <Python.h>
        #include <torch/library.h>
        #include <ATen/core/Tensor.h>
        #include <ATen/ops/mul.h>

        // A C extension module as setup.py builds it; opmagic loads it without importing it.
        static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "cl_setup", nullptr, -1};

        PyMODINIT_FUNC PyInit_cl_setup(void) {
          return PyModule_Create(&module_def);
        }

        at::Tensor triple(const at::Tensor& x) {
          return at::mul(x, 3);
        }

        TORCH_LIBRARY(cl_setup, m) {
          m.def("triple(Tensor x) -> Tensor");
        }

        TORCH_LIBRARY_IMPL(cl_setup, CPU, m) {
          m.impl("triple", triple);
        }
        """
    )
    library = compile_library(source, progress=None)
    loaded.append(library)
    assert library.build.header_set == "core"  # Python.h and mul.h parsed on top of it
    assert torch.ops.cl_setup.triple(torch.ones(2)).tolist() == [3.0, 3.0]


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


def test_options_reach_the_compiler(loaded, tmp_path):
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


@pytest.mark.slow
def test_a_macro_that_changes_torch_headers_gets_its_own_precompiled_header(loaded):
    """GCC refuses a precompiled header built without a -D that the headers test (NDEBUG);
    the build still works, and the next one precompiles the headers with the flag."""
    source = op_source("cl_ndebug")
    first = compile_library(source, extra_cflags=["-DNDEBUG"], progress=None)
    loaded.append(first)
    assert not first.build.precompiled
    assert "`NDEBUG' is defined" in first.build.note and "next build" in first.build.note
    second = compile_library(
        source, extra_cflags=["-DNDEBUG"], force=True, replace=first, progress=None
    )
    loaded.append(second)
    assert second.build.precompiled and second.build.headers_seconds > 0
    assert torch.ops.cl_ndebug.scale(torch.ones(1)).item() == 2.0


def test_without_precompiled_headers(loaded):
    library = compile_library(
        op_source("cl_nopch"), precompiled_headers=False, opt_level=0, progress=None
    )
    loaded.append(library)
    assert not library.build.precompiled and library.build.header_set is None
    assert "precompiled headers disabled" in str(library)
    assert torch.ops.cl_nopch.scale(torch.ones(1)).item() == 2.0


def test_ccache_is_used_when_installed(loaded, tmp_path, monkeypatch):
    """With ccache on PATH, compiles run through it with CCACHE_BASEDIR at the cache."""
    log = tmp_path / "ccache.log"
    fake = tmp_path / "bin" / "ccache"
    fake.parent.mkdir()
    fake.write_text(
        f'#!/bin/sh\necho "$CCACHE_BASEDIR|$CCACHE_SLOPPINESS|$*" >> {log}\nexec "$@"\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    library = compile_library(op_source("cl_ccache"), force=True, progress=None)
    loaded.append(library)
    basedir, sloppiness, command = log.read_text().strip().split("|")
    assert Path(basedir) == Path(os.environ["XDG_CACHE_HOME"]) / "opmagic" / "v1"
    assert "pch_defines" in sloppiness and "time_macros" in sloppiness
    assert "-c cl_ccache.cpp" in command
    assert library.build.commands[0].startswith(str(fake))


def test_a_kernel_for_an_existing_operator_is_an_override_that_close_undoes(loaded):
    source = MINIMAL_INCLUDES + textwrap.dedent(
        """
        at::Tensor fake_sinc(const at::Tensor& x) { return x.mul(-2); }
        TORCH_LIBRARY_IMPL(aten, CPU, m) {
          m.impl("sinc", fake_sinc);
        }
        """
    )
    packet = torch.ops.aten.sinc  # torch keys its tables by packets: it must stay the same
    library = compile_library(source, name="cl_override", progress=None)
    try:
        assert library.operators == ()
        [kernel] = library.kernels
        assert (kernel.op, kernel.key, kernel.line) == ("aten::sinc", "CPU", 5)
        assert kernel.overrides is not None and "RegisterCPU" in kernel.overrides
        assert "(overrides aten/src/ATen/RegisterCPU" in " ".join(str(library).split())
        assert torch.sinc(torch.ones(1)).item() == -2.0
    finally:
        library.close()
    assert torch.sinc(torch.zeros(1)).item() == 1.0
    assert torch.ops.aten.sinc is packet
