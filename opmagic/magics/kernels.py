"""``%kernels [NS] [options]``: ``opmagic.kernels`` as a styled, folded DataFrame, with the
options of ``python -m opmagic kernels`` (:data:`~opmagic.magics.arguments.KERNELS_OPTIONS`)."""

from __future__ import annotations

from IPython.core.magic import line_magic, magics_class
from IPython.core.magic_arguments import magic_arguments

from ..dispatch import kernels
from ..view.frames import KernelsView, kernels_view
from .arguments import KERNELS_OPTIONS, kernels_keywords, parse_options, with_options
from .context import ShellMagics, magic_context


@magics_class
class KernelsMagics(ShellMagics):
    """The ``%kernels`` line magic."""

    @magic_arguments()
    @with_options(KERNELS_OPTIONS)
    @line_magic
    def kernels(self, line: str) -> KernelsView:
        """Kernels per dispatch key for the operators of a namespace (or of the process):
        a row per operator and a column per key, or with --long a row per kernel."""
        with magic_context("%kernels"):
            query = kernels_keywords(parse_options(self.kernels, line))
            frame = kernels(**query)
        return kernels_view(frame, **query)
