"""Every file the compiler read is part of what a cached build stands for: a header found by
any path (``-I .``, an absolute ``#include``, ``-include``, ``CPATH``, ``CPLUS_INCLUDE_PATH``)
that changes makes the next build, in this process or a fresh one, build again."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from opmagic.errors import CompileError
from opmagic.native import compile_library
from opmagic.native.pipeline import dependency_names

from .sources import op_source


def test_dependency_files_are_read_as_make_reads_them(tmp_path):
    gcc = tmp_path / "gcc.d"
    gcc.write_text("a.o: a.cpp /usr/include/stdc-predef.h \\\n /x/d\\ i\\ r/h.h /y/$$z.h\n")
    assert dependency_names(gcc) == [
        "a.cpp",
        "/usr/include/stdc-predef.h",
        "/x/d i r/h.h",
        "/y/$z.h",
    ]
    nvcc = tmp_path / "nvcc.d"
    nvcc.write_text("k.o : k.cu \\\n    /usr/local/cuda/include/cuda_runtime.h \\\n    k.h\n")
    assert dependency_names(nvcc) == ["k.cu", "/usr/local/cuda/include/cuda_runtime.h", "k.h"]
    assert dependency_names(tmp_path / "missing.d") == []


def _scaling_source(namespace: str, include: str = "") -> str:
    """A library whose op multiplies by ``SCALE``, a macro some header defines."""
    kernel = f"{include}at::Tensor scale(const at::Tensor& x) {{ return x.mul(SCALE); }}"
    return op_source(namespace, kernel=kernel)


def _scale(namespace: str) -> float:
    """What the library's op makes of a one."""
    return getattr(torch.ops, namespace).scale(torch.ones(1)).item()


def _edit(header: Path, scale: int) -> None:
    """Rewrite the header with another SCALE (a new size, so a new mtime is not needed)."""
    header.write_text(f"#define SCALE {scale}{' ' * scale}\n")


def _build_edit_build(loaded, namespace: str, header: Path, **keywords) -> None:
    """Build, edit the header, build again: the second build must be new and see the edit."""
    source = keywords.pop("source")
    _edit(header, 3)
    loaded.append(compile_library(source, progress=None, **keywords))
    assert _scale(namespace) == 3.0
    loaded.append(compile_library(source, progress=None, replace=loaded[-1], **keywords))
    assert loaded[-1].build.cached  # unchanged: a cache hit
    _edit(header, 5)
    loaded.append(compile_library(source, progress=None, replace=loaded[-1], **keywords))
    assert not loaded[-1].build.cached
    assert _scale(namespace) == 5.0


@pytest.mark.slow
def test_an_include_directory_that_is_the_working_directory(loaded, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    source = _scaling_source("bi_dot", '#include "scale.h"\n')
    _build_edit_build(loaded, "bi_dot", tmp_path / "scale.h", source=source, include_dirs=["."])


@pytest.mark.slow
def test_a_header_included_by_absolute_path(loaded, tmp_path):
    header = tmp_path / "absolute.h"
    source = _scaling_source("bi_absolute", f'#include "{header}"\n')
    _build_edit_build(loaded, "bi_absolute", header, source=source)


@pytest.mark.slow
def test_a_file_given_with_include(loaded, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    source = _scaling_source("bi_forced")
    _build_edit_build(
        loaded, "bi_forced", tmp_path / "forced.h", source=source, extra_cflags="-include forced.h"
    )


@pytest.mark.slow
@pytest.mark.parametrize("variable", ["CPATH", "CPLUS_INCLUDE_PATH"])
def test_a_header_found_through_the_environment(loaded, tmp_path, monkeypatch, variable):
    monkeypatch.setenv(variable, str(tmp_path))
    namespace = f"bi_{variable.lower()}"
    source = _scaling_source(namespace, '#include "from_env.h"\n')
    _build_edit_build(loaded, namespace, tmp_path / "from_env.h", source=source)
    monkeypatch.setenv(variable, os.devnull)  # another search path: another build
    with pytest.raises(CompileError, match=r"from_env\.h: No such file"):
        compile_library(source, progress=None)
