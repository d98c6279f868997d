"""The one scanner of registration blocks: TORCH_LIBRARY* and STABLE_TORCH_LIBRARY* macros."""

from __future__ import annotations

import textwrap

import pytest

from opmagic.native.blocks import Block, scan_blocks


def _blocks(source: str) -> list[tuple[str, str, str | None, int]]:
    """``(macro, namespace, key, line)`` of each block of ``source``."""
    return [(b.macro, b.namespace, b.key, b.line) for b in scan_blocks(textwrap.dedent(source))]


def test_every_registration_macro_is_a_block_with_its_namespace_key_and_line():
    source = """\
        TORCH_LIBRARY(ops, m) { m.def("f(Tensor x) -> Tensor"); }
        TORCH_LIBRARY_FRAGMENT(ops, m) {}
        TORCH_LIBRARY_IMPL(ops, CPU, m) { m.impl("f", &f); }
        STABLE_TORCH_LIBRARY(stable_ops, m) {}
        STABLE_TORCH_LIBRARY_FRAGMENT(stable_ops, m) {}
        STABLE_TORCH_LIBRARY_IMPL(stable_ops, CompositeExplicitAutograd, m) {}
        TORCH_LIBRARY_IMPL(_, AutogradCPU, m) { m.fallback(fallthrough()); }
    """
    assert _blocks(source) == [
        ("TORCH_LIBRARY", "ops", None, 1),
        ("TORCH_LIBRARY_FRAGMENT", "ops", None, 2),
        ("TORCH_LIBRARY_IMPL", "ops", "CPU", 3),
        ("STABLE_TORCH_LIBRARY", "stable_ops", None, 4),
        ("STABLE_TORCH_LIBRARY_FRAGMENT", "stable_ops", None, 5),
        ("STABLE_TORCH_LIBRARY_IMPL", "stable_ops", "CompositeExplicitAutograd", 6),
        ("TORCH_LIBRARY_IMPL", "_", "AutogradCPU", 7),
    ]
    kinds = [(b.kind, b.stable) for b in scan_blocks(textwrap.dedent(source))]
    assert kinds == [
        ("DEF", False),
        ("FRAGMENT", False),
        ("IMPL", False),
        ("DEF", True),
        ("FRAGMENT", True),
        ("IMPL", True),
        ("IMPL", False),
    ]


def test_comments_strings_and_directives_hold_no_blocks():
    source = """\
        // TORCH_LIBRARY(in_line_comment, m) {}
        /* TORCH_LIBRARY_IMPL(in_block_comment, CPU, m) {}
           STABLE_TORCH_LIBRARY(still_comment, m) {} */
        const char* text = "TORCH_LIBRARY(in_string, m) {}";
        const char* raw = R"x(TORCH_LIBRARY_FRAGMENT(in_raw_string, m) {})x";
        #define REGISTER TORCH_LIBRARY(in_directive, m)
        TORCH_LIBRARY(real, m) {}
    """
    assert _blocks(source) == [("TORCH_LIBRARY", "real", None, 7)]


def test_arguments_may_span_lines_and_hold_comments():
    source = """\
        TORCH_LIBRARY_IMPL(
            ops,  // the namespace
            /* the key */ CUDA,
            m) {}
        STABLE_TORCH_LIBRARY(
            ops2, m) {}
    """
    assert _blocks(source) == [
        ("TORCH_LIBRARY_IMPL", "ops", "CUDA", 1),
        ("STABLE_TORCH_LIBRARY", "ops2", None, 5),
    ]


@pytest.mark.parametrize(
    "source",
    [
        pytest.param("int TORCH_LIBRARY_count = 0;\n", id="longer-name"),
        pytest.param("MY_TORCH_LIBRARY(ops, m) {}\n", id="prefixed-name"),
        pytest.param("auto name = TORCH_LIBRARY;\n", id="no-arguments"),
        pytest.param("TORCH_LIBRARY(ops, m\n", id="never-closed"),
    ],
)
def test_names_that_are_not_invocations_are_not_blocks(source):
    assert scan_blocks(source) == ()


def test_an_impl_block_without_three_arguments_has_no_key():
    assert _blocks("TORCH_LIBRARY_IMPL(ops, m) {}\n") == [("TORCH_LIBRARY_IMPL", "ops", None, 1)]


def test_a_block_prints_as_its_macro_and_arguments():
    assert str(Block("TORCH_LIBRARY_IMPL", "ops", "CPU", 3)) == "TORCH_LIBRARY_IMPL(ops, CPU)"
    assert str(Block("STABLE_TORCH_LIBRARY", "ops", None, 1)) == "STABLE_TORCH_LIBRARY(ops)"
