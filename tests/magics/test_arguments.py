"""The option bundles shared by the magics and the command line, and the option-value helper."""

import argparse
import contextlib
import shlex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from IPython.core.error import UsageError

from opmagic import CallContext
from opmagic.magics.arguments import (
    CONTEXT_OPTIONS,
    KERNELS_OPTIONS,
    add_options,
    build_keywords,
    build_options,
    call_context,
    evaluate,
    given_build_options,
    kernels_keywords,
    names,
    parse_options,
    without_comment,
)
from opmagic.magics.compare import CompareMagics
from opmagic.magics.cuda_kernel import CudaKernelMagics
from opmagic.magics.custom_op import CustomOpMagics
from opmagic.magics.dispatch import DispatchMagics
from opmagic.magics.kernels import KernelsMagics
from opmagic.magics.session import SessionMagics
from opmagic.magics.torch_library import TorchLibraryMagics
from opmagic.magics.triton_op import TritonOpMagics

MAGICS = {
    "torch_library": TorchLibraryMagics.torch_library,
    "cuda_kernel": CudaKernelMagics.cuda_kernel,
    "custom_op": CustomOpMagics.custom_op,
    "triton_op": TritonOpMagics.triton_op,
    "compare": CompareMagics.compare,
    "dispatch": DispatchMagics.dispatch,
    "kernels": KernelsMagics.kernels,
    "opmagic": SessionMagics.opmagic,
}


def test_context_options_make_the_call_context() -> None:
    parser = argparse.ArgumentParser()
    add_options(parser, CONTEXT_OPTIONS)
    options = parser.parse_args(["--no-grad", "--autocast", "cpu", "--vmap", "--logging-mode"])
    context = call_context(options)
    assert context == CallContext(no_grad=True, autocast="cpu", vmap=True, logging=True)
    assert context.words() == ["no_grad", "vmap", "autocast cpu", "logging mode"]
    assert call_context(parser.parse_args([])) == CallContext()


def test_build_options_become_compile_library_keywords() -> None:
    parser = argparse.ArgumentParser()
    add_options(parser, build_options())
    defaults = parser.parse_args([])
    assert given_build_options(defaults) == []
    options = parser.parse_args(["-n", "lib", "-O", "3", "-I", "/x", "--cflags=-DA=1", "-f"])
    assert given_build_options(options) == ["--name", "--opt", "--include", "--cflags", "--force"]
    keywords = build_keywords(options)
    assert keywords["name"] == "lib" and keywords["opt_level"] == "3"
    assert keywords["include_dirs"] == ["/x"] and keywords["extra_cflags"] == "-DA=1"
    assert keywords["precompiled_headers"] is True and keywords["force"] is True
    assert build_keywords(parser.parse_args(["--no-pch"]))["precompiled_headers"] is False


@pytest.mark.parametrize(
    "line",
    ["", "aten", "--namespace aten -k CPU -k Meta", "-n aten -m Meta --long", "aten --wide -k all"],
)
def test_kernels_options_are_one_bundle_for_the_magic_and_the_cli(line: str) -> None:
    """``%kernels LINE`` and ``python -m opmagic kernels LINE`` ask for the same frame."""
    parser = argparse.ArgumentParser()
    add_options(parser, KERNELS_OPTIONS)
    cli = kernels_keywords(parser.parse_args(shlex.split(line)))
    assert kernels_keywords(parse_options(MAGICS["kernels"], line)) == cli
    assert cli["wide"] is ("--long" not in line)  # one default layout: wide


def test_evaluate_names_what_did_not_evaluate() -> None:
    assert evaluate("n + 1", {"n": 2}, "--sizes") == 3
    with pytest.raises(UsageError, match=r"^could not evaluate --sizes '2 \*\* k': NameError"):
        evaluate("2 ** k", {}, "--sizes")
    with pytest.raises(UsageError, match=r"could not evaluate --check 'f\(': SyntaxError"):
        evaluate("f(", {}, "--check")


def test_names_are_words_or_comma_separated() -> None:
    assert names("x, y,,z ") == ["x", "y", "z"]
    assert names(["float32,float16", "bfloat16"]) == ["float32", "float16", "bfloat16"]
    assert names(None) == names("") == []


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("mylib --missing Meta   # ops without a Meta kernel", "mylib --missing Meta"),
        ('--cflags="-DA=1 #not a comment"  # but this is', '--cflags="-DA=1 #not a comment"'),
        ("--name a#b", "--name a#b"),  # a # inside a word is part of it
        ("# all comment", ""),
        ("no comment", "no comment"),
        ("'unclosed # quote", "'unclosed # quote"),
    ],
)
def test_option_lines_drop_a_trailing_comment(line, expected):
    assert without_comment(line) == expected


@pytest.mark.parametrize(
    ("magic", "line", "expected"),
    [  # the option values of issue 12, as users write them
        (
            "torch_library",
            '--cflags="-DFOO=1 -march=native"',
            {"cflags": ["-DFOO=1 -march=native"]},
        ),
        ("torch_library", '--cflags "-DA=1 -DB=2"', {"cflags": ["-DA=1 -DB=2"]}),
        ("torch_library", "--cflags -DA=1 --cflags -O3", {"cflags": ["-DA=1", "-O3"]}),
        ("torch_library", '--ldflags="-L/x -lfoo"', {"ldflags": ["-L/x -lfoo"]}),
        (
            "torch_library",
            '-I "/dir with space" -I /b',
            {"include_dirs": ["/dir with space", "/b"]},
        ),
        (
            "torch_library",
            "-I '/dir # not a comment'  # a comment",
            {"include_dirs": ["/dir # not a comment"]},
        ),
        (
            "torch_library",
            "--cflags -fsyntax-only -f",
            {"cflags": ["-fsyntax-only"], "force": True},
        ),
        ("cuda_kernel", '--flags="-DN=4 --use_fast_math"', {"flags": ["-DN=4 --use_fast_math"]}),
        (
            "cuda_kernel",
            '--flags "-DN=4" --flags=--use_fast_math',
            {"flags": ["-DN=4", "--use_fast_math"]},
        ),
        ("custom_op", "ns::f --schema '(Tensor x) -> Tensor'", {"schema": "(Tensor x) -> Tensor"}),
        ("custom_op", 'ns::f --check "torch.randn(3),"', {"check": "torch.randn(3),"}),
        ("triton_op", "ns::f --mutates-args 'x, y' --interpret", {"interpret": True}),
        (
            "compare",
            "'lambda a: a' torch.sin --inputs mk --rtol -1",
            {"functions": ["lambda a: a", "torch.sin"], "rtol": -1.0},
        ),
    ],
)
def test_option_values_are_split_as_a_shell_would(magic, line, expected):
    options = parse_options(MAGICS[magic], line)
    assert {name: getattr(options, name) for name in expected} == expected


def test_repeated_flags_become_one_flags_string():
    options = parse_options(MAGICS["torch_library"], '--cflags "-DA=1 -DB=2" --cflags=-O3')
    assert build_keywords(options)["extra_cflags"] == "-DA=1 -DB=2 -O3"


@pytest.mark.parametrize(
    ("line", "cause"),
    [
        ('--cflags="-DA=1', 'a " quote is never closed'),
        ("--name 'x", "a ' quote is never closed"),
        ("--cflags=-DA \\", "ends with a backslash"),
    ],
)
def test_a_line_that_cannot_be_split_is_a_usage_error_naming_the_cause(line, cause):
    with pytest.raises(UsageError, match=cause):
        parse_options(MAGICS["torch_library"], line)


# words of option lines: the magics' flags, values, and the characters a shell treats specially
_VOCABULARY = (
    "-n --name -O -I --include --cflags --ldflags --flags -f -v --no-pch --compare --schema "
    "--check --tags --arch --op --launch --inputs --sizes --rtol --min-run-time --autocast "
    "--no-grad --all -k --missing --interpret --mutates-args session ns::f x -DA=1 = ' \" \\ # "
    "-- - 3 -1 nan ${x} \0"
)
_WORDS = st.sampled_from(_VOCABULARY.split())
_LINES = st.one_of(
    st.lists(st.one_of(_WORDS, st.text(max_size=8)), max_size=8).map(" ".join),
    st.text(max_size=40),
)


@settings(max_examples=300, deadline=None)
@given(magic=st.sampled_from(sorted(MAGICS)), line=_LINES)
def test_any_option_line_parses_or_is_a_usage_error(magic, line):
    """Generated lines: argparse's and the splitter's errors are all UsageErrors."""
    with contextlib.suppress(UsageError):
        parse_options(MAGICS[magic], line)
