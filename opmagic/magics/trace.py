"""``%%trace``: run a cell and show every operator call it made, with its dispatch path.

A thin front on :func:`opmagic.trace`: the cell runs once in the user namespace (its last
expression's value becomes ``Trace.result``), under the same context options as
``%dispatch`` (``--no-grad``, ``--inference-mode``, ``--autocast cpu``, ``--fake``, ...).
"""

from __future__ import annotations

import ast
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments
from IPython.display import display

from ..dispatch.trace import Trace, trace
from .arguments import CONTEXT_OPTIONS, call_context, parse_options, with_options
from .context import ShellMagics, magic_context, raise_users_error
from .session import running_cell_number

VIEWS = ("tree", "frame", "diagram", "surprises")


@magics_class
class TraceMagics(ShellMagics):
    """``%%trace``."""

    @magic_arguments()
    @argument(
        "--view",
        choices=VIEWS,
        default="tree",
        help="what to show: the call tree (default), a DataFrame, the call graph, or only "
        "the surprises",
    )
    @argument("-o", "--out", metavar="NAME", help="also store the Trace in this variable")
    @argument(
        "--values",
        action="store_true",
        help="also keep min/max/mean of every output (for opmagic.compare_traces)",
    )
    @argument(
        "--warmup",
        action="store_true",
        help="run the cell once untraced first, leaving one-time costs (imports, a custom "
        "op's first call, torch.compile compiling) out of the trace: the cell runs twice",
    )
    @with_options(CONTEXT_OPTIONS)
    @cell_magic
    def trace(self, line: str, cell: str) -> Any:
        """Run the cell once and show every operator call it made, each with the dispatch
        keys whose kernels ran and the calls those kernels made.

        ``%%trace --autocast cpu`` runs it under ``torch.autocast("cpu")`` (the other context
        options as ``%dispatch``'s); ``-o t`` keeps the :class:`~opmagic.Trace` as ``t``
        (``t.result`` is the value of the cell's last expression); ``--values`` and
        ``--warmup`` are ``opmagic.trace``'s ``values=True`` and ``warmup=True``.
        """
        with magic_context("%%trace"):
            options = parse_options(self.trace, line)
            if options.out is not None and not options.out.isidentifier():
                raise UsageError(f"-o needs a variable name, not {options.out!r}.")
            run = self._compiled(cell)
            with call_context(options).applied():
                traced = trace(run, values=options.values, warmup=options.warmup)
        if options.out is not None:
            self.shell.user_ns[options.out] = traced
        shown = traced if options.view == "tree" else _view(traced, options.view)
        if traced.exception is not None:  # show what ran, then the cell's own error
            display(shown)
            raise_users_error(self.shell, traced.exception)
        return shown

    def _compiled(self, cell: str) -> Any:
        """A function running the cell in the user namespace, returning its last expression."""
        # a blank first line for the magic's: the cell's lines keep their numbers in
        # tracebacks and where its calls came from ("cell [3], line 2")
        source = "\n" + self.shell.transform_cell(cell)
        tree = ast.parse(source)  # a SyntaxError is the user's: IPython shows it as such
        last = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        filename = self.shell.compile.cache(source, running_cell_number(self.shell))
        body = compile(ast.Module(tree.body[:-1] if last else tree.body, []), filename, "exec")
        value = compile(ast.Expression(last.value), filename, "eval") if last else None
        namespace = self.shell.user_ns

        def run() -> Any:
            exec(body, namespace)
            return eval(value, namespace) if value is not None else None

        return run


def _view(traced: Trace, name: str) -> Any:
    if name == "surprises":
        return traced.surprises()
    return traced.view(name)
