"""``%export_ops DIR --name NAME [--verify]``: a thin front on :func:`opmagic.export`."""

from __future__ import annotations

import sys

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments
from IPython.display import display

from ..package import Export, Verification, export
from .arguments import names, parse_options
from .context import magic_context
from .torch_library import DisplayProgress


@magics_class
class ExportMagics(Magics):
    """The ``%export_ops`` line magic."""

    @magic_arguments()
    @argument("directory", help="where to write the package (a new or empty directory)")
    @argument("--name", required=True, help="the package's name: what `import NAME` imports")
    @argument("--version", default="0.1.0", help="the package's version (default 0.1.0)")
    @argument(
        "--cells",
        default=None,
        metavar="N,M",
        help="only these cells, by the number of their latest run (In [n]), e.g. 3,5",
    )
    @argument(
        "--overwrite",
        action="store_true",
        help="replace an earlier export in DIRECTORY (never another directory)",
    )
    @argument(
        "--verify",
        action="store_true",
        help="then build the wheel, install it where opmagic is not importable and run the "
        "generated tests there (Export.verify())",
    )
    @line_magic
    def export_ops(self, line: str) -> Export | Verification:
        """Export the operators of this session's cells as an installable package.

        C++/CUDA cells become NAME/csrc/ files built by setup.py (the stable-ABI ones as an
        abi3 wheel), Python cells (%%custom_op, torch.library) NAME/ops.py, and the checks run
        in the session (--check, check_op, torch.library.opcheck, compare) tests/. Failed
        cells, cells re-run since and cells that registered nothing are left out, each named
        with the reason. With --verify the package is built, installed into a fresh
        environment without opmagic and tested there; the result shows each step. Example::

            %export_ops my_ops_pkg --name my_ops --verify
        """
        with magic_context("%export_ops"):
            args = parse_options(self.export_ops, line)
            result = export(
                args.directory,
                args.name,
                version=args.version,
                cells=_cell_numbers(args.cells),
                overwrite=args.overwrite,
            )
            if not args.verify:
                return result
            display(result)
            if getattr(self.shell, "kernel", None) is None:  # a terminal: progress on stderr
                return result.verify(lambda step: print(step, file=sys.stderr))
            progress = DisplayProgress()
            verification = result.verify(progress)
            progress.clear()
        return verification


def _cell_numbers(text: str | None) -> list[int] | None:
    """``--cells 3,5`` as ``[3, 5]``; a UsageError for anything but cell numbers."""
    if text is None:
        return None
    numbers = names(text)
    if not numbers or not all(n.isdigit() and int(n) > 0 for n in numbers):
        raise UsageError(f"--cells takes cell numbers, e.g. --cells 3,5; got {text!r}.")
    return [int(n) for n in numbers]

