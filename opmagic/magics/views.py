"""``%dispatch`` and ``%kernels``: the dispatch views as line magics.

``%dispatch <call>`` evaluates the call's arguments in the user namespace and shows the
path the dispatcher would take, without running the operator (``opmagic.resolve`` inside
``opmagic.CallContext``). ``%kernels`` shows ``opmagic.kernels`` as a styled DataFrame.
"""

from __future__ import annotations

import ast
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from ..dispatch import Resolution, kernels
from ..errors import OpmagicError
from ..view.diagram import Diagram
from ..view.frames import KernelsView, kernels_call
from .arguments import CONTEXT_OPTIONS, call_context, parse_options, with_options

_VALUED_OPTIONS = {option.flags[0] for option in CONTEXT_OPTIONS if option.takes_value}
_CALL_EXAMPLE = "%dispatch torch.ops.aten.add(x, y)"


@magics_class
class ViewMagics(Magics):
    """The dispatch views of opmagic as IPython magics."""

    @magic_arguments()
    @argument(
        "--all",
        action="store_true",
        help="draw every dispatch key of the operator, not only those the call touched",
    )
    @with_options(CONTEXT_OPTIONS)
    @argument(
        "call",
        nargs="*",
        help="the call, as you would write it: torch.ops.ns.op(...), "
        "torch.ops.ns.op.overload(...), or a custom op's name called with its arguments",
    )
    @line_magic
    def dispatch(self, line: str) -> Resolution | Diagram:
        """Show which kernels the dispatcher runs for a call, and why, without running it.

        The arguments are evaluated in your namespace; nothing else runs. Options before the
        call set the context (as ``with torch.no_grad():`` etc. would), e.g.
        ``%dispatch --autocast cpu torch.ops.aten.mm(a, b)``. Returns the
        :class:`~opmagic.Resolution` (with ``--all``, its full diagram).
        """
        options_text, expression = split_options(line, _VALUED_OPTIONS)
        options = parse_options(self.dispatch, options_text)
        op, args, kwargs = self._evaluate_call(expression)
        try:
            resolution = call_context(options).resolve(op, *args, **kwargs)
        except OpmagicError as exc:
            raise UsageError(str(exc)) from exc
        return resolution.diagram(show_all=True) if options.all else resolution

    @magic_arguments()
    @argument("namespace", nargs="?", help="only operators of this namespace, e.g. aten or mylib")
    @argument(
        "--key",
        "-k",
        action="append",
        help="a runtime key to show (repeat for several; 'all' for every key)",
    )
    @argument(
        "--missing",
        "-m",
        metavar="KEY",
        help="only operators without a kernel of their own for KEY (e.g. Meta)",
    )
    @argument(
        "--long",
        action="store_true",
        help="a row per (operator, key) kernel with its source, instead of operators x keys",
    )
    @line_magic
    def kernels(self, line: str) -> KernelsView:
        """Kernels per dispatch key for the operators of a namespace (or of the process)."""
        options = parse_options(self.kernels, line)
        keys = None
        if options.key:
            keys = "all" if options.key == ["all"] else options.key
        wide = not options.long
        try:
            frame = kernels(options.namespace, keys, wide=wide, missing=options.missing)
        except OpmagicError as exc:
            raise UsageError(str(exc)) from exc
        return KernelsView(frame, kernels_call(options.namespace, keys, wide, options.missing))

    def _evaluate_call(self, expression: str) -> tuple[Any, list[Any], dict[str, Any]]:
        """The callee, positional and keyword arguments of a call expression, evaluated."""
        if not expression.strip():
            raise UsageError(f"%dispatch needs a call, e.g. {_CALL_EXAMPLE}")
        try:
            tree = ast.parse(expression.strip(), mode="eval")
        except SyntaxError as exc:
            raise UsageError(
                f"%dispatch could not parse {expression.strip()!r}: {exc.msg}. Write a call, "
                f"e.g. {_CALL_EXAMPLE}"
            ) from exc
        call = tree.body
        if not isinstance(call, ast.Call):
            raise UsageError(
                f"%dispatch needs a call expression, and {expression.strip()!r} is not one. "
                f"Write the call with its arguments, e.g. {_CALL_EXAMPLE}; for the operator's "
                "table use opmagic.dispatch_table(op)."
            )
        op = self._evaluate(call.func)
        args: list[Any] = []
        for node in call.args:
            if isinstance(node, ast.Starred):
                args.extend(self._unpacked(node.value, "*"))
            else:
                args.append(self._evaluate(node))
        kwargs: dict[str, Any] = {}
        for keyword in call.keywords:
            if keyword.arg is None:
                kwargs.update(self._unpacked(keyword.value, "**"))
            else:
                kwargs[keyword.arg] = self._evaluate(keyword.value)
        return op, args, kwargs

    def _unpacked(self, node: ast.expr, stars: str) -> Any:
        """The value of ``*node`` (a list of arguments) or ``**node`` (keyword arguments)."""
        value = self._evaluate(node)
        text = f"{stars}{ast.unparse(node)}"
        try:
            if stars == "*":
                return list(value)
            unpacked = dict(value)
        except (TypeError, ValueError) as exc:
            what = "an iterable of arguments" if stars == "*" else "a mapping of keyword arguments"
            raise UsageError(
                f"%dispatch cannot unpack {text}: it needs {what}, and "
                f"{ast.unparse(node)!r} is a {type(value).__name__} ({exc})."
            ) from None
        names = [name for name in unpacked if not isinstance(name, str)]
        if names:
            raise UsageError(
                f"%dispatch cannot unpack {text}: keyword arguments are named by strings, and "
                f"it has the keys {', '.join(map(repr, names))}."
            )
        return unpacked

    def _evaluate(self, node: ast.expr) -> Any:
        """One sub-expression, evaluated in the user namespace."""
        code = compile(ast.Expression(node), "<%dispatch>", "eval")
        try:
            return eval(code, self.shell.user_ns)
        except Exception as exc:  # the user's expression: report it as a usage problem
            raise UsageError(
                f"%dispatch could not evaluate {ast.unparse(node)!r}: {type(exc).__name__}: {exc}"
            ) from exc


def split_options(line: str, valued: set[str]) -> tuple[str, str]:
    """``("--autocast cpu", "f(x)")`` from ``"--autocast cpu f(x)"``: options lead the line.

    Only the leading ``-`` tokens are options (``valued`` ones take the next token); the
    rest is the call, kept verbatim so that strings inside it keep their spacing.
    """
    options: list[str] = []
    rest = line.strip()
    while rest.startswith("-"):
        token, _, rest = rest.partition(" ")
        options.append(token)
        rest = rest.lstrip()
        if token in valued and rest:
            value, _, rest = rest.partition(" ")
            options.append(value)
            rest = rest.lstrip()
    return " ".join(options), rest
