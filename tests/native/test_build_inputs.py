"""Every file the compiler read is part of what a cached build stands for: a header found by
any path (``-I .``, an absolute ``#include``, ``-include``, ``CPATH``, ``CPLUS_INCLUDE_PATH``)
that changes makes the next build, in this process or a fresh one, build again; so do a
same-size edit with its mtime put back, a header saved while the compiler ran, a header added
where the include search looks first, a file created for ``__has_include``, a response file
and a static library on the link line."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

import opmagic.native.pipeline
from opmagic.errors import CompileError
from opmagic.native import compile_library
from opmagic.native.inputs import dependency_names

from .sources import stable_scale_source


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


def _scaling_source(namespace: str, include: str = "", *, value: str = "SCALE") -> str:
    """A library whose op returns ``SCALE``, a macro some header defines (stable-ABI: most
    builds here have flags or an environment of their own, so no precompiled headers)."""
    return stable_scale_source(namespace, value, include)


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


def _write_same_size(path: Path, text: str) -> None:
    """Replace ``path``'s text with ``text`` of the same size, its mtime put back (``cp -p``)."""
    before = path.stat()
    assert len(text.encode()) == before.st_size
    path.write_text(text)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


@pytest.mark.slow
def test_a_same_size_edit_with_its_mtime_put_back(loaded, tmp_path):
    header = tmp_path / "same.h"
    header.write_text("#define SCALE 3\n")
    source = _scaling_source("bi_same", f'#include "{header}"\n')
    loaded.append(compile_library(source, progress=None))
    _write_same_size(header, "#define SCALE 5\n")
    loaded.append(compile_library(source, progress=None, replace=loaded[-1]))
    assert not loaded[-1].build.cached and _scale("bi_same") == 5.0


@pytest.mark.slow
def test_a_header_saved_while_the_compiler_runs(loaded, tmp_path, monkeypatch):
    header = tmp_path / "racing.h"
    header.write_text("#define SCALE 3\n")
    source = _scaling_source("bi_race", f'#include "{header}"\n')
    compiled = opmagic.native.pipeline.run_step

    def save_while_compiling(command, **keywords):
        """The compile reads SCALE 3; the editor saves SCALE 5 before the build is recorded."""
        result = compiled(command, **keywords)
        if "-c" in command:
            header.write_text("#define SCALE 5\n")
        return result

    monkeypatch.setattr(opmagic.native.pipeline, "run_step", save_while_compiling)
    loaded.append(compile_library(source, progress=None))
    assert _scale("bi_race") == 3.0  # what the compiler read
    monkeypatch.undo()
    loaded.append(compile_library(source, progress=None, replace=loaded[-1]))
    assert not loaded[-1].build.cached and _scale("bi_race") == 5.0
    loaded.append(compile_library(source, progress=None, replace=loaded[-1]))
    assert loaded[-1].build.cached  # recorded as read this time


@pytest.mark.slow
def test_a_header_added_to_an_earlier_include_directory(loaded, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    (second / "scale.h").write_text("#define SCALE 3\n")
    source = _scaling_source("bi_shadow", '#include "scale.h"\n')
    dirs = [first, second]
    loaded.append(compile_library(source, include_dirs=dirs, progress=None))
    assert _scale("bi_shadow") == 3.0
    (first / "scale.h").write_text("#define SCALE 5\n")  # found first from now on
    loaded.append(compile_library(source, include_dirs=dirs, progress=None, replace=loaded[-1]))
    assert not loaded[-1].build.cached and _scale("bi_shadow") == 5.0


@pytest.mark.slow
def test_a_file_created_for_has_include(loaded, tmp_path):
    has_include = (
        "#if __has_include(<bi_optional.h>)\n#include <bi_optional.h>\n#else\n"
        "#define SCALE 3\n#endif\n"
    )
    source = _scaling_source("bi_has", has_include)
    loaded.append(compile_library(source, include_dirs=[tmp_path], progress=None))
    assert _scale("bi_has") == 3.0
    (tmp_path / "bi_optional.h").write_text("#define SCALE 5\n")
    loaded.append(
        compile_library(source, include_dirs=[tmp_path], progress=None, replace=loaded[-1])
    )
    assert not loaded[-1].build.cached and _scale("bi_has") == 5.0


@pytest.mark.slow
def test_a_response_file_edited_to_the_same_size(loaded, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "flags.rsp").write_text("-DSCALE=3\n")
    source = _scaling_source("bi_response")
    loaded.append(compile_library(source, extra_cflags="@flags.rsp", progress=None))
    assert _scale("bi_response") == 3.0
    _write_same_size(tmp_path / "flags.rsp", "-DSCALE=5\n")
    loaded.append(
        compile_library(source, extra_cflags="@flags.rsp", progress=None, replace=loaded[-1])
    )
    assert not loaded[-1].build.cached and _scale("bi_response") == 5.0


def _static_library(directory: Path, factor: int) -> Path:
    """``libfactor.a``, whose ``factor()`` returns ``factor``."""
    (directory / "factor.c").write_text(f"int factor(void) {{ return {factor}; }}\n")
    subprocess.run(["cc", "-fPIC", "-c", "factor.c"], cwd=directory, check=True)
    (directory / "libfactor.a").unlink(missing_ok=True)
    subprocess.run(["ar", "rcs", "libfactor.a", "factor.o"], cwd=directory, check=True)
    return directory / "libfactor.a"


@pytest.mark.slow
def test_a_static_library_rebuilt_on_the_link_line(loaded, tmp_path):
    source = _scaling_source("bi_static", 'extern "C" int factor(void);\n', value="factor()")
    ldflags = f"-L{tmp_path} -lfactor"
    _static_library(tmp_path, 3)
    loaded.append(compile_library(source, extra_ldflags=ldflags, progress=None))
    assert _scale("bi_static") == 3.0
    _static_library(tmp_path, 5)
    loaded.append(compile_library(source, extra_ldflags=ldflags, progress=None, replace=loaded[-1]))
    assert not loaded[-1].build.cached and _scale("bi_static") == 5.0
