"""torch.library keeps its own rules inside a session: the same cells, with and without one.

Each scenario is a cell written against torch.library's documented behaviour (kernels and
fake impls stack, destroying the newer Library brings the older back, ``allow_override=False``
and duplicate rules fail in torch's words, a kernel taken with ``get_kernel`` stays valid while
its registration lives). It runs in a real IPython shell, first without opmagic, then as a
cell of a session; what it saw must be the same, and what torch documents.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell

from opmagic import active_session

from ..shell import Cells


@dataclass(frozen=True)
class Scenario:
    """A cell that appends what it sees to ``seen``, and what torch documents it sees."""

    source: str
    check: Callable[[list[Any]], bool]


OP = """
import torch
seen = []
def value():
    return torch.ops.t_rules.foo(torch.zeros(1)).item()
"""

SCENARIOS = {
    "a newer kernel sits on top and leaving _scoped_library brings the older back": Scenario(
        OP
        + """
with torch.library._scoped_library("t_rules", "FRAGMENT") as lib:
    lib.define("foo(Tensor x) -> Tensor")
    lib.impl("foo", lambda x: x + 1, "CPU")
    with torch.library._scoped_library("t_rules", "FRAGMENT") as newer:
        newer.impl("foo", lambda x: x + 2, "CPU")
        seen.append(value())
    seen.append(value())
""",
        lambda seen: seen == [2.0, 1.0],
    ),
    "destroying any Library of a stack leaves the newest of the others": Scenario(
        OP
        + """
with torch.library._scoped_library("t_rules", "FRAGMENT") as lib:
    lib.define("foo(Tensor x) -> Tensor")
    libs = [torch.library.Library("t_rules", "FRAGMENT") for _ in range(3)]
    for n, each in enumerate(libs, 1):
        each.impl("foo", lambda x, n=n: x + n, "CPU")
    seen.append(value())
    libs[1]._destroy()
    seen.append(value())
    libs[2]._destroy()
    seen.append(value())
    libs[0]._destroy()
    try:
        value()
    except NotImplementedError:
        seen.append("no kernel")
""",
        lambda seen: seen == [3.0, 3.0, 1.0, "no kernel"],
    ),
    "fake impls stack like kernels": Scenario(
        OP
        + """
def shapes():
    with torch._subclasses.FakeTensorMode():
        fake = torch.ops.t_rules.foo(torch.ones(3)).shape[0]
    return fake, torch.ops.t_rules.foo(torch.ones(3, device="meta")).shape[0]

with torch.library._scoped_library("t_rules", "FRAGMENT") as lib:
    lib.define("foo(Tensor x) -> Tensor")
    torch.library.register_fake("t_rules::foo", lambda x: x.clone(), lib=lib)
    seen.append(shapes())
    torch.library.register_fake("t_rules::foo", lambda x: torch.cat([x, x]), lib=lib)
    seen.append(shapes())
    with torch.library._scoped_library("t_rules", "FRAGMENT") as newer:
        torch.library.register_fake("t_rules::foo", lambda x: x.clone(), lib=newer)
        seen.append(shapes())
    seen.append(shapes())
""",
        lambda seen: seen == [(3, 3), (6, 6), (3, 3), (6, 6)],
    ),
    "allow_override=False fails in torch's words": Scenario(
        OP
        + """
with torch.library._scoped_library("t_rules", "FRAGMENT") as lib:
    lib.define("foo(Tensor x) -> Tensor")
    lib.impl("foo", lambda x: x, "CPU")
    torch.library.register_fake("t_rules::foo", lambda x: x, lib=lib)
    for register in (
        lambda: lib.impl("foo", lambda x: x, "CPU", allow_override=False),
        lambda: torch.library.register_fake(
            "t_rules::foo", lambda x: x, lib=lib, allow_override=False
        ),
    ):
        try:
            register()
            seen.append("registered")
        except RuntimeError as error:
            seen.append(str(error))
""",
        lambda seen: (
            "already a kernel registered from python" in seen[0]
            and "already has a fake impl registered at <cell line>" in seen[1]
        ),
    ),
    "a second torch_dispatch rule for a class fails in torch's words": Scenario(
        OP
        + """
class Mode(torch.utils._python_dispatch.TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))

with torch.library._scoped_library("t_rules", "FRAGMENT") as lib:
    lib.define("foo(Tensor x) -> Tensor")
    for _ in range(2):
        try:
            torch.library.register_torch_dispatch("t_rules::foo", Mode, lambda *a: 0, lib=lib)
            seen.append("registered")
        except RuntimeError as error:
            seen.append(str(error))
""",
        lambda seen: seen[0] == "registered" and "already has a `__torch_dispatch__`" in seen[1],
    ),
    "a second fallback for a key fails in torch's words": Scenario(
        OP
        + """
with torch.library._scoped_library("_", "IMPL") as first:
    first.fallback(torch.library.fallthrough_kernel, "PrivateUse3")
    with torch.library._scoped_library("_", "IMPL") as second:
        try:
            second.fallback(torch.library.fallthrough_kernel, "PrivateUse3")
            seen.append("registered")
        except RuntimeError as error:
            seen.append(str(error))
""",
        lambda seen: "Tried to register multiple backend fallbacks" in seen[0],
    ),
    "a kernel from get_kernel stays valid while its registration lives": Scenario(
        OP
        + """
keys = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)

def ones(keys, start, end, dtype=None, layout=None, device=None, pin_memory=None):
    return torch.ones(int(end - start))

def twice_below(keys, start, end, dtype=None, layout=None, device=None, pin_memory=None):
    return below.call_boxed(keys, start, end) * 2

with torch.library._scoped_library("aten", "IMPL") as outer:
    outer.impl("arange.start", ones, "CPU", with_keyset=True)
    below = torch.library.get_kernel("aten::arange.start", "CPU")
    with torch.library._scoped_library("aten", "IMPL") as inner:
        inner.impl("arange.start", twice_below, "CPU", with_keyset=True)
        seen.append(torch.arange(0, 3).tolist())
    seen.append(torch.arange(0, 3).tolist())
    seen.append(below.call_boxed(keys, 0, 2).tolist())
try:
    below.call_boxed(keys, 0, 2)
except RuntimeError as error:
    seen.append("invalidated" if "has been invalidated" in str(error) else str(error))
""",
        lambda seen: seen == [[2.0] * 3, [1.0] * 3, [1.0] * 2, "invalidated"],
    ),
}


def _seen(shell: InteractiveShell, source: str) -> list[Any]:
    """Run ``source`` as a cell; what it saw, with sites (which name each run's file) unified."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns once per process about overriding kernels
        result = shell.run_cell(source, store_history=True)
    assert result.success, f"cell failed: {result.error_in_exec!r}"
    return [
        re.sub(r"\S+:\d+\b", "<cell line>", item) if isinstance(item, str) else item
        for item in shell.user_ns["seen"]
    ]


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_a_cell_sees_torch_library_behave_the_same_with_and_without_a_session(
    ipython: InteractiveShell, name: str
) -> None:
    scenario = SCENARIOS[name]
    names = torch._C._dispatch_get_all_op_names()
    assert active_session() is None
    try:
        without_session = _seen(ipython, scenario.source)
    finally:
        ipython.reset()
    ipython.run_line_magic("load_ext", "opmagic")
    try:
        in_session = _seen(ipython, scenario.source)
    finally:
        ipython.run_line_magic("unload_ext", "opmagic")
        ipython.reset()
    assert in_session == without_session
    assert scenario.check(without_session), without_session
    assert torch._C._dispatch_get_all_op_names() == names


# ---------------------------------------------------------------- across cells of a session

DEFINE = """
definition = torch.library.Library("t_cells", "FRAGMENT")
definition.define("foo(Tensor x) -> Tensor")
"""
KERNELS = """
lib = torch.library.Library("t_cells", "FRAGMENT")
lib.impl("foo", lambda x: x + {value}, "CPU")
torch.library.register_fake("t_cells::foo", lambda x: x.clone(), lib=lib)
"""
ON_TOP = """
newer = torch.library.Library("t_cells", "FRAGMENT")
newer.impl("foo", lambda x: x + {value}, "CPU")
torch.library.register_fake("t_cells::foo", lambda x: torch.cat([x, x]), lib=newer)
"""


def _kernel_and_fake() -> tuple[float, int]:
    """What t_cells::foo computes on CPU, and the length its fake impl gives a 1-element input."""
    with torch._subclasses.FakeTensorMode():
        length = torch.ops.t_cells.foo(torch.zeros(1)).shape[0]
    return torch.ops.t_cells.foo(torch.zeros(1)).item(), length


def _run_stacking(cells: Cells, source: str, cell_id: str) -> None:
    """Run a cell that stacks a kernel: torch warns about that once per process, so the warning
    may or may not come."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = cells.shell.run_cell(source, store_history=True, cell_id=cell_id)
    assert result.success, result.error_in_exec


def test_another_cells_kernel_sits_on_top_and_its_rerun_replaces_only_its_own(
    cells: Cells, dump
) -> None:
    cells.run(DEFINE, "def")
    cells.run(KERNELS.format(value=1), "a")
    _run_stacking(cells, ON_TOP.format(value=10), "b")
    assert _kernel_and_fake() == (10.0, 2)
    _run_stacking(cells, ON_TOP.format(value=20), "b")  # replaces b's kernel; a's stays below
    assert _kernel_and_fake() == (20.0, 2)
    cpu = [line.split(":")[0] for line in dump("t_cells::foo").splitlines() if "CPU" in line]
    assert cpu == ["CPU", "CPU (inactive)"]  # b's newest kernel, a's under it: nothing piles up
    cells.run("newer = None", "b")  # b no longer registers: a's kernel and fake impl are back
    assert _kernel_and_fake() == (1.0, 1)


def test_a_failed_rerun_puts_its_kernels_back_under_the_newer_ones(cells: Cells) -> None:
    cells.run(DEFINE, "def")
    cells.run(KERNELS.format(value=1), "a")
    _run_stacking(cells, ON_TOP.format(value=10), "b")
    cells.fail(KERNELS.format(value=2) + "raise ValueError('the edit fails')", "a")
    assert _kernel_and_fake() == (10.0, 2)  # b's stay on top, as before the failed run
    cells.run("newer = None", "b")
    assert _kernel_and_fake() == (1.0, 1)  # and a's first run is still there underneath


def test_a_cell_registering_with_allow_override_false_reruns(cells: Cells) -> None:
    cell = """
lib = torch.library.Library("t_strict", "FRAGMENT")
lib.define("foo(Tensor x) -> Tensor")
lib.impl("foo", lambda x: x + {value}, "CPU", allow_override=False)
torch.library.register_fake("t_strict::foo", lambda x: x.clone(), lib=lib, allow_override=False)
"""
    for value in (1, 2, 3):
        cells.run(cell.format(value=value), "c")
        assert torch.ops.t_strict.foo(torch.zeros(1)).item() == value
    cells.fail(cell.format(value=4) + "1 / 0", "c")
    assert torch.ops.t_strict.foo(torch.zeros(1)).item() == 3
    cells.run(cell.format(value=5), "c")
    assert torch.ops.t_strict.foo(torch.zeros(1)).item() == 5
