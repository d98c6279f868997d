"""A session's cells as an installable package: :func:`export` writes it (layout, build files,
generated tests), :meth:`Export.verify` proves it by installing it where opmagic is not.

See ``docs/export.md``. The parts: :mod:`.selection` (which cells), :mod:`.native` (C++/CUDA
files and their extensions), :mod:`.python` (``ops.py``), :mod:`.tests` (tests from the checks
the author ran), :mod:`.layout` (build files, README, ``ops.json``, writing), :mod:`.verify`
(build, install, test, audit), :mod:`.result` (what verifying found).
"""

from .export import Export, ExportedCell, export
from .result import Verification, VerifyStep
from .selection import LeftOut
from .tests import Operator
from .verify import verify_package

__all__ = [
    "Export",
    "ExportedCell",
    "LeftOut",
    "Operator",
    "Verification",
    "VerifyStep",
    "export",
    "verify_package",
]
