"""The session in a real IPython shell: re-runs, rollback, takeover, unload, tracking."""

from __future__ import annotations

import importlib.util
import re
import sys
import textwrap
from typing import ClassVar

import pytest
import torch
from IPython.utils.capture import capture_output
from torch._subclasses.fake_tensor import FakeTensorMode

import opmagic
from opmagic import Session, active_session
from opmagic.cells.session import CellIdentity
from opmagic.errors import ForeignOperatorError

from ..native.sources import op_source
from ..shell import Cells, DispatcherState

CUSTOM_OP = """
@torch.library.custom_op("{ns}::f", mutates_args=())
def f(x: Tensor) -> Tensor:
    return x + {value}

@f.register_fake
def _(x):
    return torch.empty_like(x)
"""

# cells of every kind a notebook re-runs; {ns} keeps tests apart, {value} is the edit
RERUN_CELLS = {
    "custom_op with companions": """
@torch.library.custom_op("{ns}::f", mutates_args=())
def f(x: Tensor) -> Tensor:
    return x * {value}

@f.register_fake
def _(x):
    return torch.empty_like(x)

def setup_context(ctx, inputs, output):
    pass

def backward(ctx, grad):
    return grad * {value}

f.register_autograd(backward, setup_context=setup_context)
f.register_vmap(lambda info, in_dims, x: (f(x), in_dims[0]))
f.register_autocast("cpu", torch.bfloat16)
""",
    "define, impl and register_* on a raw op": """
torch.library.define("{ns}::g", "(Tensor x) -> Tensor")
torch.library.impl("{ns}::g", "cpu", lambda x: x * {value})
torch.library.register_fake("{ns}::g", lambda x: torch.empty_like(x))
torch.library.register_autograd("{ns}::g", lambda ctx, grad: grad * {value})
torch.library.register_kernel("{ns}::g", "cuda", lambda x: x * {value})
torch.library.register_autocast("{ns}::g", "cpu", torch.float16)
""",
    "Library DEF with define and impl": """
lib = torch.library.Library("{ns}", "DEF")
lib.define("h(Tensor x) -> Tensor")
lib.impl("h", lambda x: x * {value}, "CompositeExplicitAutograd")
""",
    "%%custom_op with companions": """%%custom_op {ns}::m
def m(x: Tensor) -> Tensor:
    return x * {value}

@fake
def _(x):
    return torch.empty_like(x)

@setup_context
def _(ctx, inputs, output):
    pass

@backward
def _(ctx, grad):
    return grad * {value}

@kernel("cuda")
def _(x):
    return x * {value}
""",
}
if importlib.util.find_spec("triton") is not None:  # the triton extra
    RERUN_CELLS["%%triton_op"] = """%%triton_op {ns}::t
import triton
import triton.language as tl
from torch.library import wrap_triton

@triton.jit
def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * {value}, mask=mask)

def t(x: Tensor) -> Tensor:
    out = torch.empty_like(x)
    wrap_triton(scale_kernel)[(triton.cdiv(x.numel(), 64),)](x, out, x.numel(), BLOCK=64)
    return out
"""


def _registrations(dump: str) -> list[str]:
    """A dump's registration lines without their sites (cell files change per run)."""
    return [re.sub(r"registered at \S+", "", line) for line in dump.splitlines()]


@pytest.mark.parametrize("cell_id", ["the-cell", None], ids=["cell id", "no cell id"])
@pytest.mark.parametrize("kind", list(RERUN_CELLS))
def test_rerunning_a_cell_100_times_grows_nothing_and_warns_nothing(
    cells: Cells, kind: str, cell_id: str | None
) -> None:
    ns = f"rerun_{abs(hash((kind, cell_id))) % 10**6}"
    source = RERUN_CELLS[kind]
    cells.run(source.format(ns=ns, value=1), cell_id)
    ops = [n for n in torch._C._dispatch_get_all_op_names() if n.startswith(f"{ns}::")]
    dumps = [_registrations(torch._C._dispatch_dump(op)) for op in ops]
    state = DispatcherState.now()
    session = active_session()
    registrations = sum(len(r.registrations) for r in session.records())
    for value in range(2, 101):
        cells.run(source.format(ns=ns, value=value), cell_id)  # no warnings, no errors
    assert DispatcherState.now() == state
    assert [_registrations(torch._C._dispatch_dump(op)) for op in ops] == dumps
    assert sum(len(r.registrations) for r in session.records()) == registrations
    assert len(session.records()) == 1
    name = ops[0].split("::")[1]
    assert getattr(getattr(torch.ops, ns), name)(torch.full((1,), 3.0)).item() == 300  # last edit


@pytest.mark.parametrize("cell_id", ["cell-a", None], ids=["cell id", "no cell id"])
def test_rerun_replaces_the_op_and_keeps_existing_handles_valid(
    cells: Cells, dump, cell_id: str | None
) -> None:
    cells.run(CUSTOM_OP.format(ns="t_replace", value=1), cell_id)
    handle = torch.ops.t_replace.f.default  # taken before the re-run
    cells.run(CUSTOM_OP.format(ns="t_replace", value=2), cell_id)
    x = torch.zeros(1)
    assert cells.ns["f"](x).item() == 2
    assert handle(x).item() == 2  # the same dispatcher entry, now with the new kernel
    assert dump("t_replace::f").count("CompositeExplicitAutograd") == 1
    with FakeTensorMode():
        assert torch.ops.t_replace.f(torch.zeros(2)).shape == (2,)


@pytest.mark.parametrize(
    "failure",
    [
        "\nraise ValueError('the edited cell fails at its end')",
        "\nf(torch.zeros(1), 'too many arguments')",
    ],
)
def test_a_failing_rerun_leaves_the_previous_registration_in_place(
    cells: Cells, dump, failure: str
) -> None:
    cells.run(CUSTOM_OP.format(ns="t_fail", value=1), "c")
    before = _registrations(dump("t_fail::f"))
    opdef = cells.ns["f"]
    cells.fail(CUSTOM_OP.format(ns="t_fail", value=5) + failure, "c")
    assert _registrations(dump("t_fail::f")) == before
    assert cells.ns["f"] is opdef
    assert torch.ops.t_fail.f(torch.zeros(1)).item() == 1
    assert opdef(torch.zeros(1)).item() == 1
    with FakeTensorMode():
        assert torch.ops.t_fail.f(torch.zeros(2)).shape == (2,)
    cells.run(CUSTOM_OP.format(ns="t_fail", value=7), "c")  # and the cell still re-runs
    assert torch.ops.t_fail.f(torch.zeros(1)).item() == 7


AUTOGRAD_OP = """
@torch.library.custom_op("t_schema::f", mutates_args=())
def f(x: Tensor{extra}) -> Tensor:
    return x * 2

f.register_autograd(lambda ctx, grad: grad * 2, setup_context=lambda ctx, inputs, output: None)
"""


def test_an_identical_redefinition_keeps_the_same_overload_objects(cells: Cells) -> None:
    cells.run(AUTOGRAD_OP.format(extra=""), "c")
    overload = torch.ops.t_schema.f.default
    cells.run(AUTOGRAD_OP.format(extra=""), "c")
    assert torch.ops.t_schema.f.default is overload  # what __torch_dispatch__ sees as func
    assert cells.ns["f"]._opoverload is overload


FAKE_OP = """
@torch.library.custom_op("t_compiled::f", mutates_args=())
def f(x: Tensor) -> Tensor:
    return x.repeat({copies})

@f.register_fake
def _(x):
    traced.append({copies})
    return x.new_empty(x.shape[0] * {copies})
"""


@pytest.mark.slow
def test_an_identical_redefinition_retraces_code_compiled_with_the_previous_one(
    cells: Cells,
) -> None:
    """torch.compile guards a compiled call on the OpOverloads it saw, which a re-run keeps:
    code traced with the previous fake impl traces again, as after a new definition."""
    cells.run("traced = []")
    cells.run(FAKE_OP.format(copies=1), "op")
    cells.run("compiled = torch.compile(lambda x: f(x) * 2, backend='eager')")
    assert cells.eval("compiled(torch.ones(2))").tolist() == [2.0, 2.0]
    cells.run(FAKE_OP.format(copies=2), "op")
    assert cells.eval("compiled(torch.ones(2))").tolist() == [2.0] * 4
    assert cells.eval("traced") == [1, 2]  # the new fake impl saw the call


def test_a_failing_rerun_that_changed_the_schema_restores_a_working_op(cells: Cells) -> None:
    cells.run(AUTOGRAD_OP.format(extra=""), "c")
    opdef, overload = cells.ns["f"], torch.ops.t_schema.f.default
    cells.fail(AUTOGRAD_OP.format(extra=", n: int") + "raise ValueError", "c")
    x = torch.ones(2, requires_grad=True)
    for op in (opdef, overload, torch.ops.t_schema.f, cells.ns["f"]):
        y = op(x)
        (grad,) = torch.autograd.grad(y.sum(), x)  # the backward closes over the OpOverload
        assert y.tolist() == [2, 2] and grad.tolist() == [2, 2]
    cells.run(AUTOGRAD_OP.format(extra=", n: int"), "c")
    assert torch.ops.t_schema.f(torch.ones(1), 3).item() == 2


def test_a_failing_rerun_restores_every_way_into_the_op(cells: Cells) -> None:
    """Every handle a restored OpOverload holds reaches the re-created entry: redispatch, a
    call under ``DisableTorchFunctionSubclass``, and from torch 2.14 custom_op's Python-side
    dispatch shortcut and the C++ handle kept beside it (stale ones point at the entry that
    went away)."""
    cells.run(AUTOGRAD_OP.format(extra=""), "c")
    overload = torch.ops.t_schema.f.default
    before = {
        name: vars(overload).get(name) for name in ("_cpp_dispatch_handle", "_pyobj_dispatcher")
    }
    cells.fail(AUTOGRAD_OP.format(extra=", n: int") + "raise ValueError", "c")
    x = torch.ones(2)
    cpu = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
    assert overload.redispatch(cpu, x).tolist() == [2, 2]
    with torch._C.DisableTorchFunctionSubclass():
        assert overload(x).tolist() == [2, 2]
    assert overload(x).tolist() == [2, 2]
    for name, stale in before.items():
        if stale is not None:  # the field exists and was set: a new one, for the new entry
            assert vars(overload)[name] is not None and vars(overload)[name] is not stale, name
    if before["_pyobj_dispatcher"] is not None:  # calls take the shortcut again
        assert overload._op is not overload._cpp_dispatch_handle


def test_registrations_dropped_for_a_cell_go_when_it_succeeds_and_return_when_it_fails(
    cells: Cells,
) -> None:
    """What a C++ re-run that changes kernel signatures asks for: other cells' kernels on
    the operators go with the run, as a redefinition's do."""
    cells.run("import opmagic")
    cells.run('torch.library.define("t_drop::f", "(Tensor x) -> Tensor")', "def")
    cells.run('torch.library.impl("t_drop::f", "cpu", lambda x: x + 1)', "impl")
    drop = 'assert opmagic.active_session().drop_registrations_on(["t_drop::f", "t_drop::g"])\n'
    cells.fail(drop + "raise ValueError('the edit failed')", "cxx")
    assert torch.ops.t_drop.f(torch.zeros(1)).item() == 1  # back
    run = cells.run(drop + "notes = opmagic.active_session().displaced()", "cxx")
    assert run.success and not torch._C._dispatch_has_kernel_for_dispatch_key("t_drop::f", "CPU")
    (note,) = cells.ns["notes"]
    assert note.startswith("dropped cell ") and note.endswith(
        "'s CPU kernel for t_drop::f (re-run that cell to add it again)"
    )
    assert not cells.eval('opmagic.active_session().drop_registrations_on(["t_drop::f"])')


def test_an_op_defined_twice_in_one_cell_keeps_the_second(cells: Cells, dump) -> None:
    twice = CUSTOM_OP.format(ns="t_twice", value=1) + CUSTOM_OP.format(ns="t_twice", value=2)
    for _ in range(3):
        cells.run(twice, "c")
    assert torch.ops.t_twice.f(torch.zeros(1)).item() == 2
    assert dump("t_twice::f").count("CompositeExplicitAutograd") == 1


def test_a_failing_first_run_registers_nothing(cells: Cells) -> None:
    cells.fail(CUSTOM_OP.format(ns="t_first", value=1) + "\n1 / 0")
    assert not [n for n in torch._C._dispatch_get_all_op_names() if n.startswith("t_first::")]
    assert "f" not in cells.ns


def test_a_failing_rerun_that_rebinds_its_library_restores_the_old_kernels(cells: Cells) -> None:
    cell = """
lib = torch.library.Library("t_rebind", "FRAGMENT")
lib.define("k(Tensor x) -> Tensor")
lib.impl("k", lambda x: x + {value}, "CPU")
"""
    cells.run(cell.format(value=1), "c")
    old_library = cells.ns["lib"]
    cells.fail(cell.format(value=2) + "\nraise RuntimeError", "c")
    assert cells.ns["lib"] is old_library
    assert torch.ops.t_rebind.k(torch.zeros(1)).item() == 1


def test_a_registration_that_fails_mid_cell_gives_back_what_it_replaced(cells: Cells) -> None:
    cell = 'torch.library.define("t_bad::k", "{schema}")\n'
    cells.run(cell.format(schema="(Tensor x) -> Tensor"), "c")
    handle = torch.ops.t_bad.k.default
    error = cells.fail(cell.format(schema="(Tensor x) -> Tensr"), "c")
    assert "Tensr" in str(error)
    assert str(handle._schema) == str(torch.ops.t_bad.k.default._schema)
    assert "t_bad::k(Tensor x) -> Tensor" in torch._C._dispatch_dump("t_bad::k")


def test_redefining_an_op_drops_other_cells_registrations_on_it(cells: Cells, dump) -> None:
    cells.run(CUSTOM_OP.format(ns="t_redef", value=1), "a")
    companions = """
@f.register_kernel("cuda")
def _(x):
    return x + 100
"""
    companion_cell = cells.run(companions, "b")
    assert "CUDA" in dump("t_redef::f")
    cells.run(CUSTOM_OP.format(ns="t_redef", value=2), "a")
    assert "CUDA" not in dump("t_redef::f")
    report = str(cells.shell.run_line_magic("opmagic", "session"))
    assert f"replaced cell [{companion_cell.execution_count}]'s CUDA kernel for t_redef" in report
    cells.run(companions, "b")  # re-running the companion cell adds it to the new op
    assert "CUDA" in dump("t_redef::f")


def test_rerunning_a_companion_cell_replaces_what_it_added_to_another_cells_op(
    cells: Cells, dump
) -> None:
    cells.run(CUSTOM_OP.format(ns="t_comp", value=1), "a")  # its fake impl keeps the shape
    companions = """
@f.register_kernel("cuda")
def _(x):
    return x + 100

@f.register_fake
def _(x):
    return torch.empty_like(x).unsqueeze(0)
"""
    cells.run(companions, "b")
    cells.run(companions, "b")
    assert dump("t_comp::f").count("CUDA") == 1
    with FakeTensorMode():
        assert torch.ops.t_comp.f(torch.zeros(2)).shape == (1, 2)  # cell b's fake impl
    cells.run('@f.register_kernel("cpu")\ndef _(x):\n    return x + 200\n', "b")
    assert "CUDA" not in dump("t_comp::f")
    assert list(cells.ns["f"]._backend_fns) == [None, "cpu"]
    assert torch.ops.t_comp.f(torch.zeros(1)).item() == 200
    with FakeTensorMode():
        assert torch.ops.t_comp.f(torch.zeros(2)).shape == (2,)  # cell a's fake impl again


def test_without_cell_ids_a_cell_defining_the_same_ops_is_a_rerun(cells: Cells, dump) -> None:
    cells.run('torch.library.define("t_anon::other", "(Tensor x) -> Tensor")')
    cell = """
torch.library.define("t_anon::p", "(Tensor x) -> Tensor")
torch.library.define("t_anon::q", "(Tensor x) -> Tensor")
torch.library.impl("t_anon::p", "cpu", lambda x: x + {value})
"""
    extra = 'torch.library.impl("t_anon::other", "Meta", lambda x: x)\n'
    cells.run(cell.format(value=1) + extra, None)
    assert "Meta" in dump("t_anon::other")
    cells.run(cell.format(value=2), None)
    assert len(active_session().records()) == 2  # the "other" cell and the last run
    assert torch.ops.t_anon.p(torch.zeros(1)).item() == 2
    assert "Meta" not in dump("t_anon::other")  # the first run's leftover went with it


def test_registrations_by_imported_modules_are_not_tracked(cells: Cells, tmp_path) -> None:
    module = tmp_path / "t_imported_ops.py"
    module.write_text(
        "import torch\n"
        "lib = torch.library.Library('t_imported', 'FRAGMENT')\n"
        "lib.define('op(Tensor x) -> Tensor')\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        cells.run("import t_imported_ops")
        cells.shell.run_line_magic("unload_ext", "opmagic")
        assert "t_imported::op" in torch._C._dispatch_get_all_op_names()
        cells.shell.run_line_magic("load_ext", "opmagic")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("t_imported_ops").lib._destroy()


def test_a_module_imported_while_a_front_end_registers_keeps_its_registrations(
    cells: Cells, tmp_path
) -> None:
    """torch imports some modules lazily (torch._inductor on the first triton_op), and those
    register operators of their own: they are not the cell's, even inside the front end's
    registration_site."""
    module = tmp_path / "t_lazy_ops.py"
    module.write_text(
        "import torch\n"
        "lib = torch.library.Library('t_lazy', 'FRAGMENT')\n"
        "lib.define('op(Tensor x) -> Tensor')\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        cells.run(
            "from opmagic import registration_site\n"
            "with registration_site('<front end>', 1):\n"
            "    import t_lazy_ops\n"
            "    torch.library.define('t_lazy_cell::op', '(Tensor x) -> Tensor')\n"
        )
        cells.shell.run_line_magic("unload_ext", "opmagic")
        names = torch._C._dispatch_get_all_op_names()
        assert "t_lazy::op" in names and "t_lazy_cell::op" not in names
        cells.shell.run_line_magic("load_ext", "opmagic")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("t_lazy_ops").lib._destroy()


def test_a_schema_written_over_several_lines_is_redefined_on_rerun(cells: Cells) -> None:
    cell = (
        'lib = torch.library.Library("t_lines", "FRAGMENT")\n'
        'lib.define("""\n    f(\n        Tensor x,\n        int n\n    ) -> Tensor\n    """)\n'
    )
    cells.run(cell, "multi-line")
    cells.run(cell, "multi-line")
    assert str(torch.ops.t_lines.f.default._schema) == "t_lines::f(Tensor x, int n) -> Tensor"


def test_tables_name_the_cell_line_of_each_registration(cells: Cells) -> None:
    result = cells.run(
        'lib = torch.library.Library("t_sites", "FRAGMENT")\n'
        'lib.define("k(Tensor x) -> Tensor")\n'
        'lib.impl("k", lambda x: x, "CPU")\n',
        "c",
    )
    table = opmagic.dispatch_table("t_sites::k")
    assert table["CPU"].source == f"cell [{result.execution_count}], line 3"
    assert table.registrations[0].source.startswith(f"cell [{result.execution_count}]")


def test_opmagic_session_lists_what_each_cell_registered(cells: Cells) -> None:
    first = cells.run(CUSTOM_OP.format(ns="t_list", value=1), "a")
    second = cells.run('torch.library.impl("t_list::f", "cuda", lambda x: x)', "b")
    report = cells.shell.run_line_magic("opmagic", "session")
    text = str(report)
    assert f"cell [{first.execution_count}]" in text
    assert "t_list::f: def, Meta kernel, fake impl, Autograd kernel" in text
    assert f"t_list::f: CUDA kernel  cell [{second.execution_count}], line 1" in text
    assert "<table>" in report._repr_html_()


class Handle:
    """A stand-in for a loaded C++ library: something with ``close()``."""

    closed_names: ClassVar[list[str]] = []

    def __init__(self, name: str) -> None:
        self.name = name
        self.description = f"lib {name}"  # what %opmagic session shows

    @property
    def closed(self) -> bool:
        """Whether the session (or the test) closed it: its cell no longer holds it."""
        return self.name in Handle.closed_names

    def close(self) -> None:
        """Record that the session closed this handle."""
        Handle.closed_names.append(self.name)


TRACK = "import opmagic\nopmagic.active_session().track(Handle({name!r}){identity})\n"
SUPERSEDED = "opmagic.active_session().superseded(Handle, {identity})"


def _ns(name: str) -> str:
    """A CellIdentity defining the namespace ``name``, as Python source."""
    return f"CellIdentity(frozenset({{('namespace', {name!r})}}))"


def test_front_ends_track_handles_per_cell(cells: Cells) -> None:
    Handle.closed_names.clear()
    cells.ns.update(Handle=Handle, CellIdentity=CellIdentity)
    cells.run(TRACK.format(name="one", identity=""), "c")
    assert "lib one" in str(cells.shell.run_line_magic("opmagic", "session"))
    cells.run(TRACK.format(name="two", identity=""), "c")
    assert Handle.closed_names == ["one"]  # closed once the re-run succeeded
    cells.fail(TRACK.format(name="three", identity="") + "raise ValueError", "c")
    assert Handle.closed_names == ["one", "three"]  # the failed run's handle; "two" stays open
    cells.run(
        f"previous = {SUPERSEDED.format(identity='CellIdentity()')}\n"
        "assert previous.name == 'two'\n" + TRACK.format(name="four", identity=""),
        "c",
    )
    assert Handle.closed_names == ["one", "three", "two"]
    cells.run(f"assert {SUPERSEDED.format(identity='CellIdentity()')} is None", "d")
    cells.shell.run_line_magic("unload_ext", "opmagic")
    assert Handle.closed_names == ["one", "three", "two", "four"]
    cells.shell.run_line_magic("load_ext", "opmagic")


def test_a_new_cell_defining_a_namespace_takes_over_the_earlier_cells_handle(
    cells: Cells,
) -> None:
    """With cell ids, as in JupyterLab: torch keeps one TORCH_LIBRARY per namespace, so the
    later cell's library replaces the earlier cell's, and its notes name that cell."""
    Handle.closed_names.clear()
    cells.ns.update(Handle=Handle, CellIdentity=CellIdentity)
    first = cells.run(TRACK.format(name="x1", identity=f", identity={_ns('x')}"), "x")
    cells.run(
        f"found = {SUPERSEDED.format(identity=_ns('x'))}\n"
        "assert found.name == 'x1'\n"
        "found.close()  # as compile_library does to the library it replaces\n"
        "notes = opmagic.active_session().displaced()\n"
        + TRACK.format(name="x2", identity=f", identity={_ns('x')}"),
        "y",
    )
    assert cells.ns["notes"] == [f"replaced cell [{first.execution_count}]'s lib x1"]
    assert [r.key for r in active_session().records()] == ["y"]  # cell x held only x1
    cells.run(f"assert {SUPERSEDED.format(identity=_ns('other'))} is None", "z")


def test_cells_without_ids_find_what_they_replace_by_what_it_is(cells: Cells) -> None:
    Handle.closed_names.clear()
    cells.ns.update(Handle=Handle, CellIdentity=CellIdentity)
    blocks = "CellIdentity(frozenset(), frozenset({('b', 'CPU')}))"
    cells.run(TRACK.format(name="a1", identity=f", identity={_ns('a')}"), None)
    cells.run(TRACK.format(name="b1", identity=f", identity={blocks}"), None)
    cells.run(
        f"assert {SUPERSEDED.format(identity=_ns('a'))}.name == 'a1'\n"
        f"assert {SUPERSEDED.format(identity=blocks)}.name == 'b1'  # the same blocks\n"
        f"assert {SUPERSEDED.format(identity=blocks.replace('CPU', 'CUDA'))} is None\n"
        f"assert opmagic.active_session().superseded(int, {_ns('a')}) is None",
        None,
    )
    cells.run(f"assert {SUPERSEDED.format(identity=blocks)} is None", "with-an-id")


def test_a_cpp_source_is_identified_by_its_blocks() -> None:
    assert CellIdentity.of_source(op_source("a")) == CellIdentity(
        frozenset({("namespace", "a")}), frozenset({("a", "CPU")})
    )
    impl_only = "TORCH_LIBRARY_IMPL(a, CPU, m) {}\nTORCH_LIBRARY_FRAGMENT(b, m) {}\n"
    assert CellIdentity.of_source(impl_only) == CellIdentity(
        frozenset(), frozenset({("a", "CPU"), ("b", "FRAGMENT")})
    )


def _identity(x: torch.Tensor) -> torch.Tensor:
    """An operator function for an op defined outside the session."""
    return x.clone()


def test_custom_op_will_not_replace_an_op_defined_outside_the_session(cells: Cells) -> None:
    cells.shell.run_line_magic("unload_ext", "opmagic")
    outside = torch.library.custom_op("t_outside::f", mutates_args=())(_identity)
    cells.shell.run_line_magic("load_ext", "opmagic")
    try:
        error = cells.fail(CUSTOM_OP.format(ns="t_outside", value=1))
        assert isinstance(error, ForeignOperatorError)
        assert "already defined outside this opmagic session" in str(error)
        assert outside(torch.ones(1)).item() == 1
    finally:
        outside._lib._destroy()


PYTHON_KERNELS = """
torch.library.register_autocast("t_pykernel::f", "cpu", torch.float16)
torch.ops.t_pykernel.f.default.py_impl(torch._C.DispatchKey.CPU)(lambda x: x * {value})
"""


def test_python_kernels_a_cell_gives_an_outside_op_go_with_the_cell(cells: Cells, dump) -> None:
    cells.shell.run_line_magic("unload_ext", "opmagic")
    lib = torch.library.Library("t_pykernel", "DEF")
    lib.define("f(Tensor x) -> Tensor")
    lib.impl("f", _identity, "CompositeExplicitAutograd")
    cells.shell.run_line_magic("load_ext", "opmagic")
    op, x = torch.ops.t_pykernel.f.default, torch.ones(1)
    keys = {torch._C.DispatchKey.AutocastCPU, torch._C.DispatchKey.CPU}

    def python_dispatcher_result() -> float:
        with torch._dispatch.python.enable_python_dispatcher():
            return op(x).item()

    try:
        cells.run(PYTHON_KERNELS.format(value=2), "c")
        cells.run(PYTHON_KERNELS.format(value=3), "c")  # not "Trying to override a python impl"
        assert set(op.py_kernels) == keys
        assert python_dispatcher_result() == 3
        cells.fail(PYTHON_KERNELS.format(value=4) + "1 / 0", "c")  # rolled back to the 3
        assert set(op.py_kernels) == keys
        assert python_dispatcher_result() == 3
        cells.shell.run_line_magic("unload_ext", "opmagic")
        assert op.py_kernels == {}
        assert "AutocastCPU" not in dump("t_pykernel::f")
        assert python_dispatcher_result() == 1
        with torch.autocast("cpu", dtype=torch.float16):
            assert op(x).dtype == torch.float32
        cells.shell.run_line_magic("load_ext", "opmagic")
    finally:
        lib._destroy()


@pytest.mark.filterwarnings("ignore:Warning only once for all operators")
def test_unload_leaves_the_dispatcher_as_before_loading(ipython) -> None:
    try:
        cells = Cells(ipython)
        cells.run("import torch\nfrom torch import Tensor")
        names = torch._C._dispatch_get_all_op_names()
        tables = {name: torch._C._dispatch_dump_table(name) for name in names}
        state = DispatcherState.now()
        ipython.run_line_magic("load_ext", "opmagic")
        for kind, source in RERUN_CELLS.items():
            cells.run(source.format(ns=f"unload_{len(kind)}", value=1), kind)
        overrides = ipython.run_cell(  # overriding aten kernels warns (once per process)
            textwrap.dedent("""
            aten = torch.library.Library("aten", "IMPL")
            aten.impl("div.Tensor", lambda self, other: self * 0, "CPU")
            class Mode(torch.utils._python_dispatch.TorchDispatchMode):
                def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                    return func(*args, **(kwargs or {}))
            torch.library.register_torch_dispatch("aten::sin", Mode, lambda *a: None)
            torch.library.register_fake("aten::digamma", lambda x: torch.empty_like(x))
            """),
            store_history=True,
        )
        assert overrides.success
        assert (torch.ones(1) / torch.ones(1)).item() == 0
        ipython.run_line_magic("unload_ext", "opmagic")
        assert torch._C._dispatch_get_all_op_names() == names
        assert {name: torch._C._dispatch_dump_table(name) for name in names} == tables
        assert DispatcherState.now() == state
        assert (torch.ones(1) / torch.ones(1)).item() == 1
        registry = torch._library.simple_registry.singleton
        assert registry.find("aten::digamma").fake_impl.kernel is None
        rules = registry.find("aten::sin").torch_dispatch_rules
        assert rules.find(ipython.user_ns["Mode"]) is None
    finally:
        ipython.reset()


def test_the_session_works_without_ipython() -> None:
    namespace: dict = {"torch": torch, "Tensor": torch.Tensor}
    session = Session().start()
    try:
        for value in (1, 2):
            with session.cell("a", "[a]", namespace):
                exec(compile(CUSTOM_OP.format(ns="t_plain", value=value), "<a>", "exec"), namespace)
        with pytest.raises(ZeroDivisionError), session.cell("a", "[a]", namespace):
            exec(compile(CUSTOM_OP.format(ns="t_plain", value=3) + "1/0", "<a>", "exec"), namespace)
        assert torch.ops.t_plain.f(torch.zeros(1)).item() == 2
        assert active_session() is session
    finally:
        session.close()
    assert active_session() is None
    assert "t_plain::f" not in torch._C._dispatch_get_all_op_names()


def test_torch_library_cells_are_listed_and_removed_at_unload(ipython, build_cache) -> None:
    """A %%torch_library cell's C++ library is one of the session's cells' resources."""
    names = torch._C._dispatch_get_all_op_names()
    ipython.run_line_magic("load_ext", "opmagic")
    cells = Cells(ipython)
    try:
        source = textwrap.dedent("""\
            %%torch_library
            #include <torch/library.h>
            #include <ATen/core/Tensor.h>
            at::Tensor twice(const at::Tensor& x) { return x.add(x); }
            TORCH_LIBRARY(session_cpp, m) { m.def("twice(Tensor x) -> Tensor"); }
            TORCH_LIBRARY_IMPL(session_cpp, CPU, m) { m.impl("twice", twice); }
            """)
        with capture_output():
            cells.run(source, "session-cpp")
            cells.run(source, "session-cpp")  # a re-run replaces the library: listed once
            listing = ipython.run_line_magic("opmagic", "session")
        assert str(listing).count("C++ library session_cpp: session_cpp::twice") == 1
        assert "note" not in str(listing)  # what a cell replaced of its own: no news
        assert torch.ops.session_cpp.twice(torch.ones(2)).tolist() == [2.0, 2.0]
    finally:
        ipython.run_line_magic("unload_ext", "opmagic")
        ipython.reset()
    assert torch._C._dispatch_get_all_op_names() == names


class FailingHandle:
    """A tracked resource whose ``close()`` fails."""

    description = "a handle that cannot be closed"

    def close(self) -> None:
        """Fail, as a resource whose teardown breaks would."""
        raise OSError("the handle could not be closed")


def test_unload_finishes_the_teardown_when_one_step_fails(ipython) -> None:
    names = torch._C._dispatch_get_all_op_names()
    ipython.run_line_magic("load_ext", "opmagic")
    cells = Cells(ipython)
    Handle.closed_names.clear()
    track = "import opmagic\nopmagic.active_session().track({handle})\n"
    try:
        cells.ns.update(Handle=Handle, FailingHandle=FailingHandle)
        cells.run("import torch\nfrom torch import Tensor")
        cells.run(CUSTOM_OP.format(ns="t_teardown_a", value=1), "a")
        cells.run(track.format(handle="Handle('before')"), "b")
        cells.run(  # torn down between the others, and before the handle it tracked first
            track.format(handle="Handle('beside')") + track.format(handle="FailingHandle()"), "c"
        )
        cells.run(track.format(handle="Handle('after')"), "d")
        cells.run(CUSTOM_OP.format(ns="t_teardown_e", value=1), "e")
        with pytest.raises(OSError, match="could not be closed"):
            ipython.run_line_magic("unload_ext", "opmagic")
        assert active_session() is None
        assert torch._C._dispatch_get_all_op_names() == names
        assert sorted(Handle.closed_names) == ["after", "before", "beside"]
        assert "opmagic" not in ipython.magics_manager.magics["line"]
        ipython.run_line_magic("load_ext", "opmagic")  # a whole load again, not a no-op
        assert active_session() is not None
        assert "opmagic" in ipython.magics_manager.magics["line"]
    finally:
        ipython.run_line_magic("unload_ext", "opmagic")
        ipython.reset()


def test_a_cell_may_not_redefine_an_op_of_a_torch_library_cell_and_is_told_why(
    cells: Cells, build_cache
) -> None:
    library_cell = textwrap.dedent("""\
        %%torch_library
        #include <torch/library.h>
        #include <ATen/core/Tensor.h>
        at::Tensor twice(const at::Tensor& x) { return x.add(x); }
        TORCH_LIBRARY(t_owned_cpp, m) { m.def("twice(Tensor x) -> Tensor"); }
        TORCH_LIBRARY_IMPL(t_owned_cpp, CPU, m) { m.impl("twice", twice); }
        """)
    with capture_output():
        loaded = cells.run(library_cell)
    error = cells.fail(
        "%%custom_op t_owned_cpp::twice\ndef twice(x: Tensor) -> Tensor:\n    return x * 3\n"
    )
    assert type(error) is ForeignOperatorError and str(error).startswith("%%custom_op: ")
    message = str(error)
    assert "outside this opmagic session" not in message
    assert (
        "t_owned_cpp::twice is defined by the C++ library that cell "
        f"[{loaded.execution_count}] loaded (C++ library t_owned_cpp" in message
    )
    assert f"take the definition out of cell [{loaded.execution_count}]" in message
    # torch.library.custom_op itself, as without a session, refuses in torch's words
    error = cells.fail(
        "@torch.library.custom_op('t_owned_cpp::twice', mutates_args=())\n"
        "def twice(x: Tensor) -> Tensor:\n    return x * 3\n"
    )
    assert "Tried to register an operator (t_owned_cpp::twice(Tensor x) -> Tensor)" in str(error)
    assert torch.ops.t_owned_cpp.twice(torch.ones(2)).tolist() == [2.0, 2.0]
