"""The option bundles shared by the magics and the command line, and the option-value helper."""

import argparse

import pytest

from opmagic import CallContext
from opmagic.magics.arguments import (
    BUILD_OPTIONS,
    CONTEXT_OPTIONS,
    add_options,
    build_keywords,
    call_context,
    given_build_options,
    unquote,
    without_comment,
)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('"-DFOO=1 -O2"', "-DFOO=1 -O2"),
        ("'x, y'", "x, y"),
        ("plain", "plain"),
        ("\"mixed'", "\"mixed'"),
        ('"', '"'),
        ("", ""),
        (None, None),
    ],
)
def test_unquote_strips_one_matching_pair_of_quotes(raw, expected):
    assert unquote(raw) == expected


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
    add_options(parser, BUILD_OPTIONS)
    defaults = parser.parse_args([])
    assert given_build_options(defaults) == []
    options = parser.parse_args(["-n", "lib", "-O", "3", "-I", "/x", "--cflags", '"-DA=1"', "-f"])
    assert given_build_options(options) == ["--name", "--opt", "--include", "--cflags", "--force"]
    keywords = build_keywords(options)
    assert keywords["name"] == "lib" and keywords["opt_level"] == "3"
    assert keywords["include_dirs"] == ["/x"] and keywords["extra_cflags"] == "-DA=1"
    assert keywords["precompiled_headers"] is True and keywords["force"] is True
    assert build_keywords(parser.parse_args(["--no-pch"]))["precompiled_headers"] is False


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
