"""BuildOptions: compile_library's options checked and normalised once, before any build."""

from __future__ import annotations

from pathlib import Path

import pytest

from opmagic import compile_library
from opmagic.errors import BuildOptionError
from opmagic.native.options import DEFAULT_NAME, DEFAULT_OPT_LEVEL, BuildOptions

from .sources import op_source


def _options(source: str, **overrides) -> BuildOptions:
    """``BuildOptions.create`` with compile_library's defaults, ``overrides`` applied."""
    keywords = {
        "cuda": False,
        "name": None,
        "extra_cflags": (),
        "extra_ldflags": (),
        "include_dirs": (),
        "opt_level": DEFAULT_OPT_LEVEL,
        "precompiled_headers": True,
        "force": False,
        "verbose": False,
        "label": None,
        "first_line": 1,
        **overrides,
    }
    return BuildOptions.create(source, **keywords)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        pytest.param({"source": "   \n"}, "The source is empty", id="empty"),
        pytest.param({"name": "my-lib"}, "must be a C identifier", id="name"),
        pytest.param({"opt_level": 5}, "Unknown optimisation level 5", id="opt-level"),
        pytest.param({"extra_cflags": ["-O2", 3]}, "extra_cflags must be strings", id="flags"),
        pytest.param({"first_line": 0}, "first_line must be a positive", id="first-line"),
        pytest.param({"include_dirs": ["/no/such/dir"]}, "not found: /no/such/dir", id="include"),
        pytest.param({"extra_cflags": "-O2 -D"}, "ends with -D and no macro", id="define"),
        pytest.param({"extra_cflags": "'-DA=1"}, "cannot be split.*Close the quote", id="quote"),
        pytest.param(
            {"extra_cflags": 5}, "a string of flags or a list of strings", id="cflags-int"
        ),
        pytest.param({"extra_ldflags": b"-lm"}, "a string of flags or a list", id="ldflags-bytes"),
        pytest.param(
            {"extra_cflags": "-fsyntax-only"}, "-fsyntax-only, which a build", id="syntax"
        ),
        pytest.param({"extra_cflags": ["-MF", "x.d"]}, "writes a dependency file", id="deps"),
        pytest.param({"extra_ldflags": "-o /tmp/x.so"}, "extra_ldflags has -o", id="output"),
        pytest.param({"name": "n" * 300}, "300 characters long.*at most 100", id="long-name"),
        pytest.param({"include_dirs": 5}, "include_dirs must be a list", id="include-int"),
        pytest.param({"include_dirs": [None]}, "directory paths", id="include-none"),
        pytest.param({"force": "yes"}, "force must be True or False", id="force"),
        pytest.param({"first_line": True}, "first_line must be a positive", id="first-line-bool"),
        pytest.param({"label": 3}, "label must be a string", id="label"),
        pytest.param(
            {"source": None}, "must be C\\+\\+ source text \\(a str\\), got NoneType", id="none"
        ),
        pytest.param({"replace": "x"}, "replace must be the LoadedLibrary", id="replace"),
        pytest.param({"progress": 3}, "progress must be a callable or None", id="progress"),
    ],
)
def test_bad_arguments_are_refused_before_building(kwargs, expected):
    arguments = {"source": op_source("err_args"), "progress": None, **kwargs}
    with pytest.raises(BuildOptionError, match=expected):
        compile_library(**arguments)


def test_the_first_error_is_the_one_reported():
    with pytest.raises(BuildOptionError, match="The source is empty: write CUDA C\\+\\+"):
        _options("", cuda=True, name="my-lib", opt_level=9)
    with pytest.raises(BuildOptionError, match="must be a C identifier"):
        _options(op_source("opt_order"), name="my-lib", opt_level=9)


def test_flags_are_split_and_defines_kept_apart(tmp_path):
    options = _options(
        op_source("opt_flags") + "\n\n",
        extra_cflags="-march=native -D A=1 -UB '-DC=two words'",
        extra_ldflags="-L/opt/lib -lfoo",
        include_dirs=[tmp_path],
        opt_level="-O2",
    )
    assert options.source == op_source("opt_flags")  # trailing blank lines make no new build
    assert options.cflags == ("-march=native",)
    assert options.defines == ("-DA=1", "-UB", "-DC=two words")
    assert options.ldflags == ("-L/opt/lib", "-lfoo")
    assert options.include_dirs == (str(Path(tmp_path).absolute()),)
    assert options.opt_level == "2"


def test_the_name_is_the_first_namespace_and_the_label_follows_it():
    source = "// TORCH_LIBRARY(commented_out, m)\n" + op_source("opt_name")
    options = _options(source)
    assert (options.name, options.label) == ("opt_name", "opt_name.cpp")
    assert _options(source, cuda=True).label == "opt_name.cu"
    assert _options(source, name="mine", label="cell [4]").label == "cell [4]"
    fallback_first = "TORCH_LIBRARY_IMPL(_, AutogradCPU, m) {}\n" + op_source("opt_later")
    assert _options(fallback_first).name == DEFAULT_NAME
    assert _options("int no_blocks;\n").name == DEFAULT_NAME


def test_relative_paths_in_flags_are_from_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    options = _options(
        op_source("opt_paths"),
        extra_cflags="-I. -include cfg.h -isystem sys -DX=./y",
        extra_ldflags="-Llib -L /abs -lfoo",
        include_dirs=".",  # one directory on its own
    )
    assert options.cflags == (
        "-I" + str(tmp_path),
        "-include",
        str(tmp_path / "cfg.h"),
        "-isystem",
        str(tmp_path / "sys"),
    )
    assert options.defines == ("-DX=./y",)
    assert options.ldflags == ("-L" + str(tmp_path / "lib"), "-L", "/abs", "-lfoo")
    assert options.include_dirs == (str(tmp_path),)


def test_a_long_namespace_names_the_library_by_default():
    long_namespace = "n" * 150
    assert _options(op_source(long_namespace)).name == DEFAULT_NAME
