"""Compile, link, load and toolchain errors: one clear message each, and the previous good
version stays registered (bad options: test_options.py; registration errors:
test_registration.py)."""

from __future__ import annotations

import dataclasses
import re
import sys

import pytest
import torch

from opmagic import compile_library
from opmagic.errors import (
    CompileError,
    CompilerNotFoundError,
    LoadError,
    MissingHeadersError,
    ToolchainError,
)
from opmagic.native import pipeline
from opmagic.native.toolchain import find_toolchain

from .sources import op_source

pytestmark = pytest.mark.slow  # compiles C++ (or asks compile_library to)


def test_a_compile_error_points_at_the_line_and_keeps_the_previous_version(loaded):
    good = compile_library(op_source("err_compile"), label="cell [7]", first_line=2, progress=None)
    loaded.append(good)
    broken = op_source(
        "err_compile", kernel="at::Tensor scale(const at::Tensor& x) { return x.mul(2) }"
    )
    with pytest.raises(CompileError) as caught:
        compile_library(broken, replace=good, label="cell [7]", first_line=2, progress=None)
    error = caught.value
    message = str(error)
    assert message.startswith("liberr_compile.so: compile error at cell [7], line 9:")
    assert "expected ';' before '}' token" in message
    assert re.search(
        r">\s+9 \| at::Tensor scale\(const at::Tensor& x\) \{ return x.mul\(2\) \}", message
    )
    assert error.diagnostics[0].user_line == 8 and error.diagnostics[0].in_source
    assert "-c err_compile.cpp" in error.command and "error:" in error.log
    # the log numbers the source's lines as the message does: the cell's
    assert "err_compile.cpp:9:" in error.log and "err_compile.cpp:8:" not in error.log
    assert re.search(r"^\s+9 \| at::Tensor scale", error.log, re.M)
    html = error._repr_html_()
    assert "<details>" in html and "#ffebee" in html  # highlighted line, collapsed log
    assert error._render_traceback_() == [f"CompileError: {message}"]
    assert not good.closed and torch.ops.err_compile.scale(torch.ones(1)).item() == 2.0


def test_every_error_is_shown_at_its_line_with_the_caret_under_its_column(loaded):
    source = op_source(
        "err_many",
        kernel="at::Tensor scale(const at::Tensor& x) {\n"  # line 8
        "\tauto y = x.mul(missing_one);\n"  # line 9, indented by a tab
        "  return y.add(missing_two);\n"  # line 10
        "}",
    )
    with pytest.raises(CompileError) as caught:
        compile_library(source, label="cell [3]", first_line=2, progress=None)
    message = str(caught.value)
    assert message.startswith("liberr_many.so: compile error at cell [3], line 10:")
    assert "'missing_one' was not declared in this scope" in message
    assert "and at cell [3], line 11:\n  'missing_two' was not declared" in message
    lines = message.splitlines()
    code = next(i for i, line in enumerate(lines) if "auto y = x.mul(missing_one)" in line)
    # the tab is expanded, so the caret sits under the column GCC names
    assert lines[code + 1].index("^") == lines[code].index("missing_one")
    assert "2 errors; the full compiler output is in CompileError.log." in message
    shown = caught.value._repr_html_().split("<details>")[0]  # above the folded log
    assert "liberr_many.so: 2 errors" in shown and shown.count("was not declared") == 2
    assert "cell [3], line 10:" in shown and "cell [3], line 11:" in shown
    assert "<table" not in shown  # pre-formatted excerpts: left-aligned in every front end


def test_an_error_inside_torch_headers_points_at_the_user_line_that_caused_it(loaded):
    source = op_source("err_template", kernel="int scale = 3;")  # m.impl("scale", 3)
    with pytest.raises(CompileError) as caught:
        compile_library(source, progress=None)
    first = next(d for d in caught.value.diagnostics if d.is_error)
    assert not first.in_source and first.user_line == 11  # the m.impl line
    assert "[reported in " in str(caught.value) and re.search(r">\s+11 \|", str(caught.value))


def test_an_unknown_dispatch_key_is_named_with_close_matches(loaded):
    source = op_source("err_key").replace("(err_key, CPU, m)", "(err_key, CPUU, m)")
    with pytest.raises(CompileError) as caught:
        compile_library(source, progress=None)
    message = str(caught.value)
    assert "compile error at err_key.cpp, line 10" in message
    assert "hint: CPUU is not a dispatch key (did you mean CPU" in message
    assert "hint: CPUU is not a dispatch key" in caught.value._repr_html_()


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        pytest.param(
            {"extra_cflags": ["-fno-such-flag"]},
            r"compile error at err_flags.cpp:\n  unrecognized command-line option '-fno-such-flag'",
            id="compiler-flag",
        ),
        pytest.param(
            {"extra_ldflags": ["-lno_such_library"]},
            # bfd, gold, lld or mold
            r"link error at err_flags.cpp:\n  \S*(ld|mold)\S*: (error: |fatal: )?"
            r"(cannot find -l|unable to find library -l|library not found: )no_such_library",
            id="linker-flag",
        ),
    ],
)
def test_a_bad_flag_is_named(loaded, options, expected):
    with pytest.raises(CompileError) as caught:
        compile_library(op_source("err_flags"), progress=None, **options)
    assert re.search(expected, str(caught.value))


def test_a_link_error_points_at_the_line_that_uses_the_symbol(loaded):
    kernel = (
        "int missing_factor();\n"
        "at::Tensor scale(const at::Tensor& x) {\n"
        "  return x.mul(missing_factor());\n"  # line 10 of the source, 11 of the cell
        "}"
    )
    with pytest.raises(CompileError) as caught:
        compile_library(
            op_source("err_link_line", kernel=kernel),
            extra_ldflags="-Wl,-z,defs",  # undefined symbols are errors when linking
            label="cell [3]",
            first_line=2,
            progress=None,
        )
    message = str(caught.value)
    assert message.startswith("liberr_link_line.so: link error at cell [3], line 11:"), message
    assert "missing_factor()" in message and "> 11 |   return x.mul(missing_factor());" in message


def test_an_undefined_symbol_is_a_load_error_with_the_cpp_name(loaded):
    source = op_source(
        "err_symbol",
        kernel="at::Tensor helper(const at::Tensor& x);\n"
        "at::Tensor scale(const at::Tensor& x) { return helper(x); }",
    )
    with pytest.raises(LoadError, match=r"undefined symbol helper\(at::Tensor const&\)"):
        compile_library(source, progress=None)


def test_a_missing_compiler_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    with pytest.raises(CompilerNotFoundError, match="apt-get install g\\+\\+"):
        compile_library(op_source("err_cxx"), progress=None)
    monkeypatch.delenv("CXX")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(CompilerNotFoundError, match="No C\\+\\+ compiler found"):
        compile_library(op_source("err_cxx"), progress=None)


def test_other_platforms_are_refused_with_a_reason(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    with pytest.raises(ToolchainError, match=r"needs Linux .* this is darwin"):
        compile_library(op_source("err_platform"), progress=None)


def test_missing_python_headers_say_what_to_install(loaded, monkeypatch, tmp_path):
    without_python_h = dataclasses.replace(find_toolchain(), python_include=str(tmp_path))
    monkeypatch.setattr(pipeline, "find_toolchain", lambda: without_python_h)
    source = "#include <Python.h>\n" + op_source("err_python_h")
    with pytest.raises(MissingHeadersError, match="apt-get install python3-dev"):
        compile_library(source, precompiled_headers=False, progress=None)
