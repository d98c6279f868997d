"""``python -m opmagic``: dispatch tables, call resolution and kernels from a terminal."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence
from typing import Any

from .errors import OpmagicError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m opmagic",
        description="Inspect the PyTorch dispatcher of this process.",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    table = commands.add_parser("table", help="an operator's dispatch table")
    table.add_argument("op", help="ns::name or ns::name.overload, e.g. aten::add.Tensor")
    table.add_argument("--all", action="store_true", help="show keys without a kernel too")

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
    resolve.add_argument("--no-grad", action="store_true", help="resolve under torch.no_grad()")
    resolve.add_argument(
        "--inference-mode", action="store_true", help="resolve under torch.inference_mode()"
    )
    resolve.add_argument(
        "--autocast", metavar="DEVICE", help="resolve under torch.autocast(DEVICE), e.g. cpu"
    )

    kernels = commands.add_parser("kernels", help="kernels per dispatch key for many operators")
    kernels.add_argument("--namespace", "-n", help="only operators of this namespace, e.g. aten")
    kernels.add_argument(
        "--key",
        "-k",
        action="append",
        help="a runtime key to show (repeat for several; 'all' for every key)",
    )
    kernels.add_argument("--wide", action="store_true", help="a row per operator, a column per key")
    return parser


def _evaluate(expression: str, what: str) -> Any:
    import torch

    try:
        return eval(expression, {"torch": torch})
    except Exception as exc:
        raise OpmagicError(f"could not evaluate {what} {expression!r}: {exc}") from exc


def _resolve(options: argparse.Namespace) -> str:
    import torch

    from .dispatch import resolve

    args = _evaluate(options.args, "--args") if options.args.strip() else ()
    if not isinstance(args, tuple):
        args = (args,)
    kwargs = _evaluate(options.kwargs, "--kwargs") if options.kwargs.strip() else {}
    if not isinstance(kwargs, dict):
        raise OpmagicError(f"--kwargs must evaluate to a dict, got {type(kwargs).__name__}")
    with contextlib.ExitStack() as stack:
        if options.no_grad:
            stack.enter_context(torch.no_grad())
        if options.inference_mode:
            stack.enter_context(torch.inference_mode())
        if options.autocast:
            stack.enter_context(torch.autocast(options.autocast))
        return str(resolve(options.op, *args, **kwargs))


def _kernels(options: argparse.Namespace) -> str:
    import pandas as pd

    from .dispatch import kernels

    keys = None
    if options.key:
        keys = "all" if options.key == ["all"] else options.key
    frame = kernels(options.namespace, keys, wide=options.wide)
    with pd.option_context("display.max_rows", None, "display.width", 200):
        return frame.to_string()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    options = _parser().parse_args(argv)
    try:
        if options.command == "table":
            from .dispatch import dispatch_table
            from .view.text import table_text

            result = dispatch_table(options.op)
            tables = getattr(result, "tables", (result,))
            output = "\n\n".join(table_text(t, include_missing=options.all) for t in tables)
        elif options.command == "resolve":
            output = _resolve(options)
        else:
            output = _kernels(options)
    except OpmagicError as exc:
        print(f"opmagic: {exc}", file=sys.stderr)
        return 2
    print(output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
