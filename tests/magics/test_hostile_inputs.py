"""Hostile input to every magic, generated: each bad option line or cell is a UsageError or an
opmagic error naming the cause, never another exception, and the ops defined before it still
work.

Builds are stopped where the compiler would start (``published_build`` raises
:class:`_WouldBuild`): what is under test is everything before it, which must refuse bad
input without a compile; compiling thousands of generated lines is out of reach. Cells that
reach the compiler are tested with the real one in tests/native.
"""

from __future__ import annotations

import inspect
import os
import re
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

import opmagic.native.library
from opmagic.errors import CellSourceError, OpmagicError

from ..native.sources import VADD, op_source

pytestmark = pytest.mark.slow  # its shell compiles a C++ library; Hypothesis makes many cases


class _WouldBuild(Exception):
    """Raised where a build would start: the options were accepted."""


def _no_build(*args: Any, **kwargs: Any) -> Any:
    """Stands in for ``published_build``."""
    raise _WouldBuild


@pytest.fixture(scope="module")
def shell(ipython, build_cache) -> Iterator[Any]:
    """A shell with ``%load_ext opmagic``, a %%custom_op and a %%torch_library op defined."""
    ipython.run_line_magic("load_ext", "opmagic")
    with capture_output():
        for cell in (
            "import torch\nfrom torch import Tensor\nx = torch.ones(2)",
            # tensors most code never meets, for %dispatch --fake and %%trace
            "import warnings\nwarnings.simplefilter('ignore')\n"
            "q = torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8)\n"
            "nt = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])\n"
            "m = torch.ones(2, device='meta')",
            "%%custom_op hz::keep\ndef keep(x: Tensor) -> Tensor:\n    return x + 1\n",
            f"%%torch_library\n{op_source('hz_kept')}",
        ):
            result = ipython.run_cell(cell, store_history=True)
            assert result.success, result.error_in_exec
    yield ipython
    ipython.run_line_magic("unload_ext", "opmagic")


@pytest.fixture
def no_builds(monkeypatch) -> None:
    """Builds stop where the compiler would start (see the module doc)."""
    monkeypatch.setattr(opmagic.native.library, "published_build", _no_build)


def _run(shell: Any, cell: str) -> BaseException | None:
    """Run a cell; the exception it ended with, checked to be one a user may see, shown
    without a traceback (nor a traceback from displaying what the cell returned)."""
    with capture_output() as captured:
        result = shell.run_cell(cell, store_history=True)
    error = result.error_before_exec or result.error_in_exec
    assert error is None or isinstance(error, (UsageError, OpmagicError, _WouldBuild)), (
        f"{type(error).__name__}: {error}\n--- cell:\n{cell[:2000]}"
    )
    shown = captured.stdout + captured.stderr
    if not isinstance(error, _WouldBuild):
        assert "Traceback" not in shown, f"{shown[-3000:]}\n--- cell:\n{cell[:2000]}"
    return error


def _earlier_ops_work() -> None:
    """The ops the shell defined before the hostile input still run."""
    assert torch.ops.hz.keep(torch.zeros(1)).item() == 1.0
    assert torch.ops.hz_kept.scale(torch.ones(1)).item() == 2.0


# --------------------------------------------------------------------- generated inputs

_FLAG_WORDS = (
    "-n --name -O --opt -I --include --cflags --ldflags --no-pch -f --force -v --verbose "
    "--compare --flags --arch --op --launch --schema --whole --mutates-args --device-types "
    "--tags --check --inputs --sizes --dtypes --devices --rtol --atol --backward --min-run-time "
    "--no-grad --inference-mode --autocast --vmap --fake --logging-mode --all -k --key -m "
    "--missing --long --interpret --version --cells --overwrite"
)
_FLAGS = _FLAG_WORDS.split()
_VALUE_WORDS = (
    "3 -1 0 x hz::keep aten::add torch.add . / /nonexistent -DA=1 -O3 -fsyntax-only -E -o "
    "-MF -include -lm sm_86 9.9 nan inf cpu cuda Meta all float16 1e9 unknown pt2_compliant_tag "
    "keep [] () {} None lambda:0 $x {x} \\ ' \" # ; | && -- = == :: ... é 中 \x00"
)
_VALUES = _VALUE_WORDS.split()
# what str.splitlines breaks at: IPython would run the rest of the line as Python
_LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_WORD = st.one_of(
    st.sampled_from(_FLAGS),
    st.sampled_from(_VALUES),
    st.text(st.characters(codec="utf-8", exclude_characters=_LINE_BREAKS), max_size=12),
    st.sampled_from(["'a b'", '"c d"', "'", '"', "x" * 300, "(" * 50]),
)
_LINE = st.lists(_WORD, max_size=7).map(" ".join)
# OPMAGIC_HOSTILE_EXAMPLES examples per test (default 120: CI's share; see
# tests/test_hostile_api.py for the full run)
_SETTINGS = settings(
    max_examples=int(os.environ.get("OPMAGIC_HOSTILE_EXAMPLES", "120")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@_SETTINGS
@given(line=_LINE)
def test_generated_torch_library_lines(shell, no_builds, line):
    _run(shell, f"%%torch_library {line}\n{op_source('hz_lines')}")
    _earlier_ops_work()


@_SETTINGS
@given(line=_LINE)
def test_generated_cuda_kernel_lines(shell, no_builds, line):
    _run(shell, f"%%cuda_kernel {line}\n{VADD}")  # the quick path: NVRTC, no build
    _run(shell, f"%%cuda_kernel {line}\n{op_source('hz_cuda_lines')}")  # the full path
    _earlier_ops_work()


@_SETTINGS
@given(line=_LINE)
def test_generated_custom_op_lines(shell, line):
    _run(shell, f"%%custom_op hz::lines {line}\ndef lines(x: Tensor) -> Tensor:\n    return x\n")
    _earlier_ops_work()


_TRITON_CELL = """import triton
import triton.language as tl
from torch.library import wrap_triton

@triton.jit
def twice_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n) * 2, mask=offsets < n)

def twice(x: Tensor) -> Tensor:
    out = torch.empty_like(x)
    wrap_triton(twice_kernel)[(1,)](x, out, x.numel(), BLOCK=16)
    return out
"""


@_SETTINGS
@given(line=_LINE)
def test_generated_triton_op_lines(shell, line):
    pytest.importorskip("triton")
    _run(shell, f"%%triton_op hz::twice {line}\n{_TRITON_CELL}")
    _earlier_ops_work()


@_SETTINGS
@given(line=_LINE, magic=st.sampled_from(["dispatch", "kernels", "opmagic", "compare"]))
def test_generated_line_magic_lines(shell, line, magic):
    _run(shell, f"%{magic} {line}")
    _earlier_ops_work()


@pytest.mark.slow
@_SETTINGS
@given(line=_LINE)
def test_generated_export_ops_lines(shell, tmp_path, monkeypatch, line):
    # a line that names a directory writes the package there (--verify is left out: what it
    # checks is the package written, not the line)
    monkeypatch.chdir(tmp_path)
    _run(shell, f"%export_ops {line}")
    _earlier_ops_work()


_CALL = st.one_of(
    st.sampled_from(
        [
            "torch.ops.aten.add(*1)",
            "torch.ops.aten.add(**1)",
            "torch.ops.aten.add(**{1: 2})",
            "torch.ops.aten.add(*x, **{'alpha': 2})",
            "torch.ops.aten.add(x, x, alpha=x)",
            "torch.ops.hz.keep(x, x, x)",
            "torch.ops.hz.keep()",
            "torch.ops.nope.nope(x)",
            "x(x)",
            "1(2)",
            "torch.ops.aten.add",
            "torch.ops.aten.add(",
            "keep(x)",
            "(lambda: 0)()",
            "torch.ops.aten.add(q, q)",
            "torch.ops.aten.add(nt, nt)",
            "torch.ops.aten.mul(m, m)",
            "torch.ops.aten.add(x, 10**30)",
            "torch.ops.hz.keep(q)",
            "torch.ops.hz_kept.scale(nt)",
        ]
    ),
    st.text(st.characters(codec="utf-8", exclude_characters=_LINE_BREAKS), max_size=30).map(
        lambda text: f"torch.ops.aten.add({text})"
    ),
)


@_SETTINGS
@given(call=_CALL, options=st.sampled_from(["", "--all", "--no-grad", "--autocast cpu", "--fake"]))
def test_generated_dispatch_calls(shell, call, options):
    _run(shell, f"%dispatch {options} {call}")
    _earlier_ops_work()


@pytest.mark.slow
@settings(_SETTINGS, max_examples=40)  # each call that resolves climbs rungs: fewer examples
@given(call=_CALL, options=st.sampled_from(["--until fake", "--rungs schema,fake", "--until"]))
def test_generated_doctor_calls(shell, call, options):
    _run(shell, f"%doctor {options} {call}")
    _earlier_ops_work()


_STATEMENT = st.sampled_from(
    [
        "x = 1",
        "raise ValueError('boom')",
        "raise SystemExit",
        "import nonexistent_module",
        "def lines(x: Tensor) -> Tensor:\n    return x",
        "def lines(x):\n    return x",
        "def lines(x: Tensor, *rest) -> Tensor:\n    return x",
        "def lines(x: dict) -> Tensor:\n    return x",
        "def other(x: Tensor) -> Tensor:\n    return x",
        "@fake\ndef _(x):\n    return torch.empty_like(x)",
        "@backward\ndef _(ctx, grad):\n    return grad",
        "@setup_context\ndef _(ctx, inputs, output):\n    pass",
        "@kernel\ndef _(x):\n    return x",
        '@kernel("nonsense_device")\ndef _(x):\n    return x',
        "@torch_dispatch(1)\ndef _(*a):\n    pass",
        "autocast('cpu', 'not a dtype')",
        "@vmap\ndef _(info, in_dims, x):\n    return x, 0",
        "fake = 3",
        "del fake",
        "def f():\n    f()\nf()",
        "y = " + "+".join(["1"] * 50_000),
        "y = " + "(" * 300 + ")" * 300,
        "y = [" * 200 + "]" * 200,
        "if True:\n"
        + "".join("    " * i + "if True:\n" for i in range(1, 101))
        + "    " * 101
        + "pass",
        "lines =",
        "\x00",
        "é = 1",
        "print('é 中')",
        "class lines: pass",
        "lines = 1",
        "global lines",
        "return 1",
        "yield 1",
        "await x",
    ]
)


@_SETTINGS
@given(
    statements=st.lists(_STATEMENT, max_size=5),
    # not hz::keep: a good cell under that name is a legitimate re-definition of the op
    name=st.sampled_from(["hz::lines", "hz::x.y", "hz::" + "n" * 300, "::", "aten::add"]),
)
def test_generated_custom_op_cells(shell, statements, name):
    _run(shell, f"%%custom_op {name}\n" + "\n".join(statements) + "\n")
    _earlier_ops_work()


@_SETTINGS
@given(
    source=st.lists(
        st.sampled_from(
            [
                "TORCH_LIBRARY(",
                "TORCH_LIBRARY(hz_cell, m) {",
                "}",
                "TORCH_LIBRARY_IMPL(hz_cell, CPU, m) {}",
                "TORCH_LIBRARY_FRAGMENT(, m) {}",
                "STABLE_TORCH_LIBRARY(hz_s, m) {}",
                "TORCH_LIBRARY(_, m) {}",
                "// TORCH_LIBRARY(x, m)",
                "/* unclosed",
                '"unclosed',
                "#include <nonexistent.h>",
                "\x00",
                "TORCH_LIBRARY_IMPL(" + "n" * 300 + ", CPU, m) {}",
                "TORCH_LIBRARY(hz_kept, m) {}",
                "",
            ]
        ),
        max_size=6,
    ).map("\n".join)
)
def test_generated_torch_library_cells(shell, no_builds, source):
    _run(shell, f"%%torch_library\n{source}")
    _earlier_ops_work()


# the user's own errors, and the calls %%trace records, odd tensors among them
_TRACED = st.sampled_from(
    [
        "raise ValueError('mine')",
        "def f(t):\n    return t.view(3)\nf(x)",
        "torch.ones(2) + torch.ones(3)",
        "torch.ops.aten.add(q, q)",
        "nt + 1",
        "m * 2",
        "torch.ops.hz.keep(x, x)",
        "torch.ops.hz_kept.scale(m)",
        "[][1]",
        "1 / 0",
        "import nonexistent_module",
        "x.sum()",
        "y = x * 2",
    ]
)
_OPMAGIC_FRAME = re.compile(r"File [^\n]*/opmagic/")
_TRACE_OPTIONS = ["", "--fake", "--no-grad", "--autocast cpu", "--view frame"]


@pytest.mark.slow
@settings(_SETTINGS, max_examples=30)
@given(
    statements=st.lists(_TRACED, min_size=1, max_size=3),
    options=st.sampled_from(_TRACE_OPTIONS),
)
def test_generated_trace_cells_show_users_errors_with_their_frames_only(shell, statements, options):
    _assert_trace_shows_the_users_frames_only(shell, options, statements)


@pytest.mark.slow
def test_a_runaway_recursion_in_a_traced_cell_shows_the_users_frames_only(shell):
    """A fixed case, not a generated one, under a recursion limit ~200 frames above this one:
    IPython takes seconds to format a RecursionError of the default 3,000 frames (with or
    without %%trace; 12-125 s in a test run), which drawn into the cells above cost minutes."""
    recursion = "def g():\n    g()\ng()"
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack(0)) + 200)
    try:
        shown = _assert_trace_shows_the_users_frames_only(
            shell, "--view frame", ["x.sum()", recursion]
        )
    finally:
        sys.setrecursionlimit(limit)
    assert "RecursionError" in shown and "in g()" in shown, shown[-3000:]


def _assert_trace_shows_the_users_frames_only(
    shell: Any, options: str, statements: list[str]
) -> str:
    """``%%trace options`` over the statements shows no opmagic frame, and earlier ops work;
    returns what the cell showed."""
    cell = f"%%trace {options}\n" + "\n".join(statements) + "\n"
    with capture_output() as captured:
        shell.run_cell(cell, store_history=True)
    shown = re.sub(r"\x1b\[[0-9;]*m", "", captured.stdout + captured.stderr)
    assert not _OPMAGIC_FRAME.search(shown), f"{shown[-3000:]}\n--- cell:\n{cell}"
    _earlier_ops_work()
    return shown


# --------------------------------------------------------------------- the inputs of issue 12


@pytest.mark.parametrize(
    ("cell", "message"),
    [
        ('%%torch_library --cflags="-DA=1\n' + op_source("hz_q"), 'a " quote is never closed'),
        ("%%custom_op hz::q --schema '(Tensor x\nq = 1\n", "a ' quote is never closed"),
        ("%%torch_library -n " + "n" * 300 + "\n" + op_source("hz_long"), "at most 100"),
        ('%%torch_library --cflags "-fsyntax-only"\n' + op_source("hz_syntax"), "-fsyntax-only"),
        ("%dispatch torch.ops.aten.add(*1)", "cannot unpack *1: it needs an iterable"),
        ("%dispatch torch.ops.aten.add(**1)", "cannot unpack **1: it needs a mapping"),
        ("%dispatch torch.ops.aten.add(**{1: 2})", "keyword arguments are named by strings"),
        (
            "%%custom_op hz::deep\ndef deep(x: Tensor) -> Tensor:\n    return x\ny = "
            + "+".join(["1"] * 50_000),
            "too deeply nested or too long an expression",
        ),
        (
            "%%custom_op hz::fit --schema '(Tensor x, Tensor y) -> Tensor'\n"
            "def fit(x: Tensor) -> Tensor:\n    return x\n",
            "does not fit fit(): it has 2 argument(s) (Tensor x, Tensor y), the function 1",
        ),
    ],
    ids=[
        "unclosed-quote",
        "unclosed-quote-custom-op",
        "long-name",
        "fsyntax-only",
        "star-1",
        "star-star-1",
        "int-keyword",
        "deep-expression",
        "schema-fit",
    ],
)
def test_the_inputs_of_issue_12_are_usage_errors_naming_the_cause(shell, cell, message):
    error = _run(shell, cell)
    assert isinstance(error, (UsageError, OpmagicError)), error
    assert message in str(error)
    _earlier_ops_work()


def test_a_schema_that_fits_the_function_is_taken(shell):
    cell = (
        "%%custom_op hz::fits --schema '(Tensor x, *, float s) -> Tensor'\n"
        "def fits(x, *, s):\n    return x * s\n"
    )
    assert _run(shell, cell) is None
    assert torch.ops.hz.fits(torch.ones(1), s=3.0).item() == 3.0
    keyword = cell.replace("def fits(x, *, s)", "def fits(x, s)")
    assert "keyword-only ones included" in str(_run(shell, keyword))


def test_a_too_deep_cell_error_points_at_its_longest_line(shell):
    long_line = "y = " + "+".join(["1"] * 50_000)
    error = _run(shell, f"%%custom_op hz::deep2\nx = 1\n{long_line}\nz = 2\n")
    assert isinstance(error, CellSourceError) and error.line == 3
