"""``%%diff``: run a cell and show what it changed in the dispatcher.

A thin front on :func:`opmagic.diff`: a snapshot before the cell, the cell run once in the
user namespace (IPython syntax and magics included), the diff after it, also when the cell
raises (the diff is shown, then the cell's own error).
"""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments
from IPython.display import display

from ..dispatch.diff import DispatchDiff, diff, snapshot
from .arguments import parse_options
from .context import ShellMagics
from .session import running_cell_number


@magics_class
class DiffMagics(ShellMagics):
    """``%%diff``."""

    @magic_arguments()
    @argument("-o", "--out", metavar="NAME", help="also store the DispatchDiff in this variable")
    @cell_magic
    def diff(self, line: str, cell: str) -> DispatchDiff:
        """Run the cell once and show every operator, kernel, backend fallback and
        torch._native route it added, removed or replaced, aten overrides first.

        ``-o d`` keeps the :class:`~opmagic.DispatchDiff` as ``d``: ``d.frame()``,
        ``d.table(op)`` (one operator before and after), ``d.affected(trace)``.
        """
        options = parse_options(self.diff, line)
        if options.out is not None and not options.out.isidentifier():
            raise UsageError(f"-o needs a variable name, not {options.out!r}.")
        # a blank first line for the magic's: the cell's lines keep their numbers in tracebacks
        # and in the sites of what it registers ("cell [3], line 5")
        source = "\n" + self.shell.transform_cell(cell)
        filename = self.shell.compile.cache(source, running_cell_number(self.shell))
        code = compile(source, filename, "exec")  # a SyntaxError is the user's own
        before = snapshot()
        try:
            exec(code, self.shell.user_ns)
        except Exception:
            display(self._found(before, options.out))
            raise
        return self._found(before, options.out)

    def _found(self, before: Any, out: str | None) -> DispatchDiff:
        """The diff since ``before``, stored in the user's variable when ``-o`` asked."""
        found = diff(before)
        if out is not None:
            self.shell.user_ns[out] = found
        return found
