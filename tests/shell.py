"""Helpers to drive a real IPython shell the way a notebook does, and to compare torch state."""

from __future__ import annotations

import gc
import itertools
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from IPython.core.interactiveshell import ExecutionResult, InteractiveShell
from torch._library import custom_ops


def warm_up_torch() -> None:
    """Make torch's lazy registrations (imports on first custom op call, fake, vmap) now.

    They happen once per process, outside any session; doing them first keeps them out of
    before/after comparisons of the dispatcher.
    """
    lib = torch.library.Library("opmagic_warmup", "FRAGMENT")
    lib.define("up(Tensor x) -> Tensor")
    lib.impl("up", lambda x: x.clone(), "CompositeExplicitAutograd")
    torch.library.register_fake("opmagic_warmup::up", lambda x: torch.empty_like(x), lib=lib)
    from torch.fx.experimental.proxy_tensor import make_fx

    op = torch.ops.opmagic_warmup.up.default
    make_fx(op, tracing_mode="symbolic")(torch.randn(3))
    torch.vmap(op)(torch.randn(2, 3))
    with torch._subclasses.fake_tensor.FakeTensorMode():
        op(torch.randn(2))
    lib._destroy()


@dataclass(frozen=True)
class DispatcherState:
    """Everything of torch.library's state a session may change, for before/after checks."""

    op_names: tuple[str, ...]
    keep_alive: int
    opdef_libraries: tuple[str, ...]
    opdefs: tuple[str, ...]
    live_libraries: int

    @classmethod
    def now(cls) -> DispatcherState:
        """The current state (collects garbage first, so dead Libraries do not count)."""
        gc.collect()
        libraries = [o for o in gc.get_objects() if type(o) is torch.library.Library]
        return cls(
            tuple(sorted(torch._C._dispatch_get_all_op_names())),
            len(torch.library._keep_alive),
            tuple(sorted(custom_ops.OPDEF_TO_LIB)),
            tuple(sorted(custom_ops.OPDEFS)),
            sum(1 for lib in libraries if lib.m is not None),
        )


NEW_CELL = "<a new cell>"  # Cells.run's default: the run sends an id of its own


class Cells:
    """Runs cells in the shell the way JupyterLab does: with history, and a cell id per run.

    A run sends a new cell's id, as a cell that is run once does, unless ``cell_id`` names
    the cell it runs again; ``cell_id=None`` sends none, as a terminal or nbclient does.
    """

    def __init__(self, shell: InteractiveShell) -> None:
        self.shell = shell
        self._new_ids = itertools.count(1)

    def run(self, source: str, cell_id: str | None = NEW_CELL) -> ExecutionResult:
        """Run a cell that must succeed without warnings; returns IPython's result."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = self._run(source, cell_id)
        assert result.success, f"cell failed: {result.error_in_exec!r}\n{source}"
        assert not caught, [str(w.message) for w in caught]
        return result

    def fail(self, source: str, cell_id: str | None = NEW_CELL) -> BaseException:
        """Run a cell that must fail; returns its exception."""
        result = self._run(source, cell_id)
        assert not result.success, f"cell succeeded:\n{source}"
        error = result.error_in_exec or result.error_before_exec
        assert error is not None
        return error

    def _run(self, source: str, cell_id: str | None) -> ExecutionResult:
        """Run ``source`` as a cell, sending ``cell_id`` (a new one for :data:`NEW_CELL`)."""
        if cell_id == NEW_CELL:
            cell_id = f"new-cell-{next(self._new_ids)}"
        return self.shell.run_cell(source, store_history=True, cell_id=cell_id)

    def eval(self, expression: str) -> Any:
        """The value of an expression in the user namespace."""
        return eval(expression, self.shell.user_ns)

    @property
    def ns(self) -> dict[str, Any]:
        """The user namespace."""
        return self.shell.user_ns
