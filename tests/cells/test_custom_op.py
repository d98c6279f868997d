"""``%%custom_op`` and ``custom_op_from_source``: options, companions, checks, bad input."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from ipykernel.compiler import XCachingCompiler
from IPython.core.error import UsageError
from torch._subclasses.fake_tensor import FakeTensorMode

import opmagic
from opmagic import CellSourceError, ForeignOperatorError, custom_op_from_source
from opmagic.errors import ArgumentTypeError, OperatorNameError

from ..shell import Cells

SIN = """%%custom_op {ns}::numpy_sin {options}
def numpy_sin(x: Tensor) -> Tensor:
    return torch.from_numpy(np.sin(x.numpy()))
"""


def test_the_cell_becomes_an_op_bound_under_its_function_name(cells: Cells) -> None:
    result = cells.run(SIN.format(ns="t_basic", options=""))
    x = torch.randn(3)
    assert torch.allclose(cells.ns["numpy_sin"](x), x.sin())
    assert torch.allclose(torch.ops.t_basic.numpy_sin(x), x.sin())
    summary = result.result
    assert isinstance(summary, opmagic.CustomOpResult)
    text = str(summary)
    number = result.execution_count
    assert text.startswith("t_basic::numpy_sin(Tensor x) -> Tensor")
    row = rf"CompositeExplicitAutograd +kernel +numpy_sin · cell \[{number}\], line 2"
    assert re.search(row, text)
    words = " ".join(text.split())  # whatever the terminal's width
    assert f"custom_op impl numpy_sin (cell [{number}], line 2)" in words  # the table's source
    assert re.search(r"Meta +fake impl +\(none: FakeTensor/meta calls fail\)", text)
    assert "<details><summary>dispatch table</summary>" in summary._repr_html_()
    assert summary.table["CPU"].kind == "alias"


@pytest.mark.parametrize(
    ("options", "function", "check"),
    [
        (
            "--mutates-args x",
            "def f(x: Tensor) -> None:\n    x.add_(1)\n",
            "x = torch.zeros(2); f(x); assert x.tolist() == [1, 1]\n"
            "assert 'Tensor(a0!) x' in str(f._opoverload._schema)",
        ),
        (
            "--mutates-args unknown",
            "def f(x: Tensor, y: Tensor) -> None:\n    x.add_(y)\n",
            "s = str(f._opoverload._schema); assert '(a0!)' in s and '(a1!)' in s",
        ),
        (
            "--device-types cpu",
            "def f(x: Tensor) -> Tensor:\n    return x + 1\n",
            "assert 'CPU:' in torch._C._dispatch_dump('t_opt::f'); assert f(torch.zeros(1)) == 1",
        ),
        (
            '--device-types "cpu,cuda"',
            "def f(x: Tensor) -> Tensor:\n    return x + 1\n",
            "d = torch._C._dispatch_dump('t_opt::f'); assert 'CPU:' in d and 'CUDA:' in d",
        ),
        (
            "--schema '(Tensor x, int n) -> Tensor'",
            "def f(x, n):\n    return x * n\n",
            "assert f(torch.ones(1), 3) == 3",
        ),
        (
            "--tags pt2_compliant_tag,needs_fixed_stride_order",
            "def f(x: Tensor) -> Tensor:\n    return x + 1\n",
            "assert torch.Tag.needs_fixed_stride_order in f._opoverload.tags",
        ),
        (
            "--device-types cpu",
            "def f(device: torch.device) -> Tensor:\n    return torch.ones(3)\n",
            "assert f('cpu').tolist() == [1, 1, 1]\n"
            "assert 'BackendSelect' in torch._C._dispatch_dump('t_opt::f')",
        ),
    ],
    ids=["mutates", "mutates unknown", "one device", "two devices", "schema", "tags", "factory"],
)
def test_every_custom_op_option(cells: Cells, options: str, function: str, check: str) -> None:
    cells.run(f"%%custom_op t_opt::f {options}\n{function}")
    cells.run(check)


COMPANIONS = """%%custom_op t_comp::f
def f(x: Tensor) -> Tensor:
    return x.sin()

@fake
def _(x):
    return torch.empty_like(x)

@setup_context
def _(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])

@backward
def _(ctx, grad):
    return grad * ctx.saved_tensors[0].cos()

@kernel("cuda")
def _(x):
    return x.sin()

@vmap
def _(info, in_dims, x):
    calls.append(in_dims)
    return f(x), in_dims[0]

autocast("cpu", torch.bfloat16)

@torch_dispatch(Mode)
def _(mode, func, types, args, kwargs):
    return args[0] + 100
"""


def test_companions_register_with_the_op(cells: Cells) -> None:
    cells.run(
        "calls = []\n"
        "class Mode(torch.utils._python_dispatch.TorchDispatchMode):\n"
        "    def __torch_dispatch__(self, func, types, args=(), kwargs=None):\n"
        "        return func(*args, **(kwargs or {}))\n"
    )
    result = cells.run(COMPANIONS).result
    op = torch.ops.t_comp.f
    with FakeTensorMode():
        assert op(torch.empty(2, 3)).shape == (2, 3)
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(op, (x,))
    assert "CUDA:" in torch._C._dispatch_dump("t_comp::f")
    if torch.cuda.is_available():
        assert torch.allclose(op(x.detach().cuda()).cpu(), x.detach().sin())
    assert torch.allclose(torch.vmap(op)(torch.ones(4, 2)), torch.ones(4, 2).sin())
    assert cells.ns["calls"] == [(0,)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert op(torch.randn(2)).dtype == torch.bfloat16
    with cells.ns["Mode"]():
        assert op(torch.zeros(1)).item() == 100
    roles = {(row.key, row.role) for row in result.kernels}
    assert roles >= {
        ("CompositeExplicitAutograd", "kernel"),
        ("CUDA", "kernel"),
        ("Meta", "fake impl"),
        ("Autograd", "backward"),
        ("Autograd", "setup_context"),
        ("FuncTorchBatched", "vmap rule"),
        ("AutocastCPU", "autocast"),
        ("Python", "rule under Mode"),
    }
    assert all(row.where.startswith("cell [") for row in result.kernels)
    for name in ("fake", "backward", "kernel", "vmap", "autocast", "torch_dispatch"):
        assert name not in cells.ns  # the companion decorators exist only while the cell runs


def test_companions_do_not_clobber_user_names(cells: Cells) -> None:
    cells.run("from torch import vmap\nkernel = 'mine'")
    cells.run(SIN.format(ns="t_names", options="") + "\n@vmap\ndef _(info, in_dims, x):\n    ...\n")
    assert cells.ns["vmap"] is torch.vmap and cells.ns["kernel"] == "mine"


def test_check_runs_opcheck_and_gradcheck(cells: Cells) -> None:
    passing = cells.run(
        COMPANIONS.split("@kernel")[0].replace(
            "%%custom_op t_comp::f", ('%%custom_op t_check::f --check "torch.randn(3),"')
        )
    ).result
    assert [(r.name, r.status) for r in passing.checks.rows] == [
        ("test_schema", "pass"),
        ("test_autograd_registration", "pass"),
        ("test_faketensor", "pass"),
        ("test_aot_dispatch_dynamic", "pass"),
        ("gradcheck", "pass"),
    ]
    assert "checks (5 passed) with (float32[3])" in str(passing)
    failing = cells.run(SIN.format(ns="t_check", options="--check 'torch.randn(3)'")).result
    statuses = {r.name: r.status for r in failing.checks.rows}
    assert statuses["test_faketensor"] == "FAIL" and statuses["test_schema"] == "pass"
    assert "gradcheck" not in statuses  # no backward, so no gradcheck
    assert not failing.checks.passed
    assert "There was no fake impl registered" in " ".join(str(failing.checks).split())
    assert "#c62828" in failing.checks._repr_html_()


def test_a_check_expression_that_does_not_evaluate_is_a_usage_error(cells: Cells) -> None:
    error = cells.fail(SIN.format(ns="t_check_bad", options="--check 'nope(3)'"))
    assert type(error) is UsageError
    assert str(error) == (
        "%%custom_op: could not evaluate --check 'nope(3)': NameError: name 'nope' is not defined"
    )
    assert "numpy_sin" not in cells.ns  # the cell failed: nothing of it is left
    assert not hasattr(torch.ops.t_check_bad, "numpy_sin")


def test_after_a_failed_rerun_the_note_names_the_run_it_replaces(cells: Cells, monkeypatch) -> None:
    """As in JupyterLab: a cell id, and ipykernel's compiler, which names a cell's code after
    its source alone (a run of the same source is the same file, whatever its number)."""
    monkeypatch.setattr(cells.shell, "compile", XCachingCompiler())
    good = SIN.format(ns="t_note", options="")
    first = cells.run(good, "c")
    cells.fail(good + "raise ValueError('not this time')\n", "c")
    again = cells.run(good, "c")
    replaced = f"replaces the previous t_note::numpy_sin from cell [{first.execution_count}]"
    assert again.result.notes == (f"{replaced}, line 2",)
    newer = cells.run(good.replace("np.sin", "np.cos"), "c")
    assert newer.result.notes[0].startswith(
        f"replaces the previous t_note::numpy_sin from cell [{again.execution_count}]"
    )


GOOD = "%%custom_op t_bad::op\ndef op(x: Tensor) -> Tensor:\n    return x + 1\n"
BAD_INPUT = [
    ("%%custom_op t_bad::op\nx = 1\n", "defines no function", 1, CellSourceError),
    (
        "%%custom_op t_bad::op\ndef a(x: Tensor) -> Tensor:\n    return x\n"
        "def b(x: Tensor) -> Tensor:\n    return x\n",
        "several functions that could be t_bad::op: a (line 2), b (line 4). Name the",
        1,
        CellSourceError,
    ),
    (
        "%%custom_op t_bad::op\ndef op(x, y: int):\n    return x\n",
        "op() needs type hints to become an operator; missing for parameter x, the return value",
        2,
        CellSourceError,
    ),
    (
        "%%custom_op t_bad::op\ndef op(x: dict) -> Tensor:\n    return x\n",
        "cannot infer a schema for op(): Parameter x has unsupported type",
        2,
        CellSourceError,
    ),
    (
        "%%custom_op t-bad::op\ndef op(x: Tensor) -> Tensor:\n    return x\n",
        "the namespace 't-bad' is not a Python identifier",
        None,
        OperatorNameError,
    ),
    (
        "%%custom_op aten::add\ndef add(x: Tensor) -> Tensor:\n    return x\n",
        "aten::add is already defined outside this opmagic session",
        None,
        ForeignOperatorError,
    ),
    (
        "%%custom_op t_bad::op\ndef op(x: Tensor) -> Tensor:\n    return x\nhelper()\n",
        "NameError: name 'helper' is not defined\n    helper()\n"
        "Fix the cell and run it again; the previous t_bad::op is still registered",
        4,
        CellSourceError,
    ),
    (  # sys.exit() in a cell ends the cell (as in any IPython cell), not the process
        "%%custom_op t_bad::op\ndef op(x: Tensor) -> Tensor:\n    return x\nraise SystemExit(3)\n",
        "SystemExit",
        4,
        CellSourceError,
    ),
    (
        "%%custom_op t_bad::op\ndef op(x: Tensor) -> Tensor:\n    return x\n"
        "@setup_context\ndef _(ctx, inputs, output):\n    pass\n",
        "@setup_context needs a @backward in the same cell",
        4,
        CellSourceError,
    ),
    (
        "%%custom_op t_bad::op\ndef op(x: Tensor) -> Tensor:\n    return x\n"
        "@kernel\ndef _(x):\n    return x\n",
        '@kernel takes an argument; write @kernel("cuda")',
        4,
        CellSourceError,
    ),
    (
        "%%custom_op t_bad::op\ndef op(x: Tensor) -> Tensor:\n    return x +\n",
        "SyntaxError: invalid syntax",
        3,
        CellSourceError,
    ),
    (
        "%%custom_op t_bad::op --mutates-args y\ndef op(x: Tensor) -> Tensor:\n    return x\n",
        "mutates_args",
        2,
        CellSourceError,
    ),
    (
        "%%custom_op t_bad::op --schema '(Tensor x, Tensor y) -> Tensor'\n"
        "def op(x: Tensor) -> Tensor:\n    return x\n",
        "the schema '(Tensor x, Tensor y) -> Tensor' does not fit op(): it has 2 argument(s)",
        2,
        CellSourceError,
    ),
    (
        "%%custom_op t_bad::op\ndef op(x: Tensor) -> Tensor:\n    return x\nglobal op\n",
        "SyntaxError: name 'op' is assigned to before global declaration",
        4,
        CellSourceError,
    ),
    (
        "%%custom_op t_bad::op\ndef op(x: Tensor) -> Tensor:\n    return x\nop = 3\n",
        "after the cell ran, op is a int, not the function defined here",
        2,
        CellSourceError,
    ),
    (
        "%%custom_op t_bad::op\ndef op(x: Tensor) -> Tensor:\n    return x\n"
        "@torch_dispatch(1)\ndef _(mode, func, types, args, kwargs):\n    pass\n",
        "@torch_dispatch takes a TorchDispatchMode subclass or a tensor subclass, got 1",
        4,
        CellSourceError,
    ),
]


@pytest.mark.parametrize(("cell", "message", "line", "kind"), BAD_INPUT)
def test_bad_input_gives_one_clear_message_and_keeps_the_previous_op(
    cells: Cells, cell: str, message: str, line: int | None, kind: type
) -> None:
    cells.run(GOOD, "the-cell")
    previous = cells.ns["op"]
    error = cells.fail(cell, "the-cell")
    assert type(error) is kind  # its own class, not a UsageError
    assert message in str(error)
    if line is not None:
        number = cells.shell.execution_count - 1
        assert str(error).startswith(f"%%custom_op: cell [{number}], line {line}: ")
        assert error.line == line
    assert cells.ns["op"] is previous
    assert torch.ops.t_bad.op(torch.zeros(1)).item() == 1


def test_an_error_in_a_helper_shows_the_cells_call_chain(cells: Cells) -> None:
    """The line that raised, and the cell line that called it, both at their cell lines."""
    cell = (
        "%%custom_op t_chain::op\n"
        "def _checked(factor):\n"
        "    if factor < 0:\n"
        "        raise ValueError('factor must be positive')\n"
        "    return torch.zeros(2)\n"
        "def op(x: Tensor) -> Tensor:\n"
        "    return x\n"
        "_checked(-1.0)\n"
    )
    error = cells.fail(cell)
    number = cells.shell.execution_count - 1
    assert str(error).splitlines() == [
        f"%%custom_op: cell [{number}], line 4: ValueError: factor must be positive",
        f"    cell [{number}], line 8: _checked(-1.0)",
        f"    cell [{number}], line 4, in _checked: raise ValueError('factor must be positive')",
        "Fix the cell and run it again; t_chain::op was not registered.",
    ]
    assert error.line == 4
    outside = cells.fail(cell.replace("_checked(-1.0)", "torch.zeros(2).view(3)"))
    assert "line 8: RuntimeError: shape '[3]' is invalid" in str(outside)
    assert "raised in" not in str(outside)  # torch raised in C++: the cell line is the last
    inside_torch = cells.fail(cell.replace("_checked(-1.0)", "torch.nn.functional.pad(1, 1)"))
    assert re.search(r"\(raised in \w+, .*\.py:\d+\)", str(inside_torch)), str(inside_torch)


def test_help_shows_every_option_and_companion(cells: Cells) -> None:
    doc = cells.shell.find_cell_magic("custom_op").__doc__
    for text in ("--mutates-args", "--device-types", "--schema", "--tags", "--check"):
        assert text in doc
    for text in ("@fake", "@setup_context", "@backward", '@kernel("cuda")', "@vmap"):
        assert text in doc
    assert "@torch_dispatch(MyMode)" in doc and 'autocast("cpu", torch.bfloat16)' in doc


def test_the_op_has_the_registrations_plain_custom_op_makes(cells: Cells) -> None:
    cells.run(SIN.format(ns="t_same", options=""))
    cells.run(
        '@torch.library.custom_op("t_same::plain", mutates_args=())\n'
        "def plain(x: Tensor) -> Tensor:\n"
        "    return torch.from_numpy(np.sin(x.numpy()))\n"
    )

    def registrations(op: str) -> list[str]:
        """The keys an operator has registrations for, as the dispatcher lists them."""
        dump = torch._C._dispatch_dump(op).split("alias analysis kind")[1]
        return [line.split(":")[0] for line in dump.splitlines()[1:]]

    assert registrations("t_same::numpy_sin") == registrations("t_same::plain")


def test_custom_op_from_source_without_ipython() -> None:
    namespace = {"torch": torch, "Tensor": torch.Tensor}
    source = "def twice(x: Tensor) -> Tensor:\n    return x * 2\n\n@fake\ndef _(x):\n    return x\n"
    result = custom_op_from_source(source, "t_script::twice", namespace=namespace)
    try:
        assert namespace["twice"] is result.op
        assert torch.ops.t_script.twice(torch.ones(1)).item() == 2
        assert result.kernels[1].where == "<custom_op t_script::twice>:4"
        edited = source.replace("2", "3")
        again = custom_op_from_source(edited, "t_script::twice", namespace=namespace)
        assert torch.ops.t_script.twice(torch.ones(1)).item() == 3  # no session: torch replaces
        with pytest.raises(CellSourceError) as error:
            custom_op_from_source("def twice(x):\n    return x\n", "t_script::twice")
        assert error.value.line == 1
        with pytest.raises(ForeignOperatorError):
            custom_op_from_source(source, "aten::sin", namespace=dict(namespace))
    finally:
        namespace["twice"]._lib._destroy()
    assert again.op is namespace["twice"]


def _outside(x: torch.Tensor) -> torch.Tensor:
    """The function of an op made outside any cell."""
    return torch.from_numpy(np.sin(x.numpy()))


def _resolution_text(op: object, args: tuple) -> tuple:
    """What resolve says about a call, with the operator's and functions' names left out."""
    resolution = opmagic.resolve(op, *args)
    notes = [step.note.split(" (")[0] for step in resolution.steps]
    text = " | ".join([*resolution.path, str(resolution.error), *notes])
    return re.sub(r"t_read::\w+|impl \w+", "OP", text)


def test_tables_and_resolve_read_session_ops_like_plain_ones(cells: Cells) -> None:
    cells.run(SIN.format(ns="t_read", options=""))
    outside = torch.library.custom_op("t_read::outside", mutates_args=())(_outside)
    try:
        for args in ((torch.randn(2, device="meta"),), (torch.randn(2, requires_grad=True),)):
            made = _resolution_text("t_read::numpy_sin", args)
            assert "raises NotImplementedError" in made or "no backward" in made
            assert made == _resolution_text(outside, args)
        tables = [opmagic.dispatch_table(op) for op in ("t_read::numpy_sin", outside)]
        described = [[(e.key, e.kind, (e.impl or "")[:14]) for e in t.entries] for t in tables]
        assert described[0] == described[1]
    finally:
        outside._lib._destroy()


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"source": None}, "source must be the cell's Python source, got NoneType"),
        ({"name": 3}, "name must be 'namespace::name'"),
        ({"namespace": []}, "namespace must be a dict or None"),
        ({"schema": 1}, "schema must be a str"),
        ({"mutates_args": 3}, "mutates_args must be argument names or 'unknown'"),
        ({"mutates_args": [1]}, "mutates_args must be argument names"),
        ({"device_types": 3}, "device_types must be device types"),
        ({"tags": ["x"]}, "tags must be torch.Tag members"),
    ],
)
def test_api_arguments_of_the_wrong_type_are_named(kwargs, expected) -> None:
    arguments = {"source": "def f(x: Tensor) -> Tensor:\n    return x\n", "name": "t_api::f"}
    with pytest.raises(ArgumentTypeError, match=re.escape(expected)):
        custom_op_from_source(**{**arguments, **kwargs})
    assert not hasattr(torch.ops.t_api, "f")
