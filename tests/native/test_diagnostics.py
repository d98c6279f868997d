"""Compiler and linker output read as diagnostics at the user's lines (no compiler run here:
the outputs are those of GCC, GNU ld, gold, lld and mold, as they print them)."""

from __future__ import annotations

import pytest

from opmagic.native.diagnostics import locate_link_errors, parse_diagnostics, reported_errors

SOURCE = (
    "int missing_factor();\n"  # 1
    "int twice(int v) { return 2 * v; }\n"  # 2
    "at::Tensor scale(const at::Tensor& x) {\n"  # 3
    "  int unused = 0;\n"  # 4
    "  return x.mul(missing_factor());\n"  # 5
    "}\n"
)
LINKERS = {
    "ld.bfd": (
        "/usr/bin/ld: lib.o: in function `scale(at::Tensor const&)':\n"
        "lib.cpp:(.text+0x1d): undefined reference to `missing_factor()'\n"
        "collect2: error: ld returned 1 exit status\n"
    ),
    "gold": (
        "lib.o:lib.cpp:function scale(at::Tensor const&): error: undefined reference to "
        "'missing_factor()'\n"
        "collect2: error: ld returned 1 exit status\n"
    ),
    "lld": (
        "ld.lld: error: undefined symbol: missing_factor()\n"
        ">>> referenced by lib.cpp\n"
        ">>>               lib.o:(scale(at::Tensor const&))\n"
        "collect2: error: ld returned 1 exit status\n"
    ),
    "mold": (
        "mold: error: undefined symbol: missing_factor()\n"
        ">>> referenced by lib.cpp\n"
        ">>>               lib.o:(scale(at::Tensor const&))\n"
        "collect2: error: ld returned 1 exit status\n"
    ),
    "multiple definition": (
        "/usr/bin/ld: other.o: in function `twice(int)':\n"
        "other.cpp:(.text+0x0): multiple definition of `twice(int)'; lib.o:lib.cpp:(.text+0x0):"
        " first defined here\n"
        "collect2: error: ld returned 1 exit status\n"
    ),
}


@pytest.mark.parametrize("linker", LINKERS)
def test_a_link_error_is_located_where_the_function_uses_the_symbol(linker):
    diagnostics = locate_link_errors(parse_diagnostics(LINKERS[linker], "lib.cpp"), SOURCE)
    lines = {error.user_line for error in reported_errors(diagnostics)}  # what the user sees
    assert lines == {2 if linker == "multiple definition" else 5}, diagnostics


def test_a_link_error_without_a_symbol_in_the_source_has_no_line():
    output = "/usr/bin/ld: cannot find -lnope: No such file or directory\ncollect2: error: ld\n"
    diagnostics = locate_link_errors(parse_diagnostics(output, "lib.cpp"), SOURCE)
    assert all(d.user_line is None for d in diagnostics)
