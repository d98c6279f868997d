"""``%dispatch <call>``: which kernels the dispatcher runs for a call, and why, unrun.

The call's arguments are evaluated in the user namespace and the path the dispatcher would
take is shown without running the operator (``opmagic.resolve`` inside
``opmagic.CallContext``, whose options lead the line).
"""

from __future__ import annotations

import ast
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from ..dispatch import Resolution
from ..view.diagram import Diagram
from ..view.resolution import resolution_diagram
from .arguments import CONTEXT_OPTIONS, call_context, evaluate, parse_options, with_options
from .context import ShellMagics, magic_context

_VALUED_OPTIONS = {option.flags[0] for option in CONTEXT_OPTIONS if option.takes_value}
_CALL_EXAMPLE = "%dispatch torch.ops.aten.add(x, y)"


@magics_class
class DispatchMagics(ShellMagics):
    """The ``%dispatch`` line magic."""

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
        with magic_context("%dispatch"):
            options_text, expression = split_options(line, _VALUED_OPTIONS)
            options = parse_options(self.dispatch, options_text)
            op, args, kwargs = evaluate_call(expression, self.shell.user_ns)
            resolution = call_context(options).resolve(op, *args, **kwargs)
        return resolution_diagram(resolution, show_all=True) if options.all else resolution


def evaluate_call(
    expression: str, namespace: dict[str, Any]
) -> tuple[Any, list[Any], dict[str, Any]]:
    """The callee, positional and keyword arguments of a call expression, evaluated in
    ``namespace`` (``*args`` and ``**kwargs`` unpacked)."""
    if not expression.strip():
        raise UsageError(f"needs a call, e.g. {_CALL_EXAMPLE}")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise UsageError(
            f"could not parse {expression.strip()!r}: {exc.msg}. Write a call, "
            f"e.g. {_CALL_EXAMPLE}"
        ) from exc
    call = tree.body
    if not isinstance(call, ast.Call):
        raise UsageError(
            f"needs a call expression, and {expression.strip()!r} is not one. "
            f"Write the call with its arguments, e.g. {_CALL_EXAMPLE}; for the operator's "
            "table use opmagic.dispatch_table(op)."
        )
    op = _evaluate(call.func, namespace, "the operator")
    args: list[Any] = []
    for node in call.args:
        if isinstance(node, ast.Starred):
            args.extend(_unpacked(node.value, "*", namespace))
        else:
            args.append(_evaluate(node, namespace, "the argument"))
    kwargs: dict[str, Any] = {}
    for keyword in call.keywords:
        if keyword.arg is None:
            kwargs.update(_unpacked(keyword.value, "**", namespace))
        else:
            kwargs[keyword.arg] = _evaluate(keyword.value, namespace, f"the argument {keyword.arg}")
    return op, args, kwargs


def _evaluate(node: ast.expr, namespace: dict[str, Any], what: str) -> Any:
    """One part of the call (the operator or an argument), evaluated."""
    return evaluate(ast.unparse(node), namespace, what)


def _unpacked(node: ast.expr, stars: str, namespace: dict[str, Any]) -> Any:
    """The value of ``*node`` (a list of arguments) or ``**node`` (keyword arguments)."""
    value = _evaluate(node, namespace, f"the argument after {stars}")
    text = f"{stars}{ast.unparse(node)}"
    try:
        if stars == "*":
            return list(value)
        unpacked = dict(value)
    except (TypeError, ValueError) as exc:
        what = "an iterable of arguments" if stars == "*" else "a mapping of keyword arguments"
        raise UsageError(
            f"cannot unpack {text}: it needs {what}, and "
            f"{ast.unparse(node)!r} is a {type(value).__name__} ({exc})."
        ) from None
    keys = [key for key in unpacked if not isinstance(key, str)]
    if keys:
        raise UsageError(
            f"cannot unpack {text}: keyword arguments are named by strings, and "
            f"it has the keys {', '.join(map(repr, keys))}."
        )
    return unpacked


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
