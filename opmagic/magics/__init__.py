"""The IPython front: ``%load_ext opmagic`` registers every opmagic magic.

Each magic class lives in its own module here and is a thin front on a public opmagic
function; each runs its work in :func:`~opmagic.magics.context.magic_context`, the one error
policy. IPython is imported only when the extension is loaded. Loading also starts the
cell session (``SessionMagics``: every cell's torch.library registrations become
re-runnable) and the warm-ups (:data:`WARM_UPS`); unloading removes everything the session's
cells registered.
"""

from __future__ import annotations

import importlib
from typing import Any

# (module, class) of every Magics subclass the extension registers
MAGIC_CLASSES: list[tuple[str, str]] = [
    ("session", "SessionMagics"),
    ("custom_op", "CustomOpMagics"),
    ("triton_op", "TritonOpMagics"),
    ("torch_library", "TorchLibraryMagics"),
    ("cuda_kernel", "CudaKernelMagics"),
    ("dispatch", "DispatchMagics"),
    ("kernels", "KernelsMagics"),
    ("compare", "CompareMagics"),
    ("doctor", "DoctorMagics"),
    ("trace", "TraceMagics"),
    ("diff", "DiffMagics"),
    ("export", "ExportMagics"),
]

# (module, function) of every warm-up: work that ``%load_ext opmagic`` starts in the
# background so that a feature's first use need not wait for it. Each is a public function
# that returns at once (slow work goes to a daemon thread, and the feature's first use waits
# for that thread instead of doing the work again), does nothing when the work is already
# done, and never raises: its failure is reported when the feature is used.
WARM_UPS: list[tuple[str, str]] = [
    ("opmagic.native.headers", "precompile_headers_in_background"),  # for the first C++ cells
    ("opmagic.dispatch.trace", "prepare_in_background"),  # compile trace's operator observer
]


def load_ipython_extension(ipython: Any) -> None:
    """Register opmagic's magics with an IPython shell (the session starts with them), then
    start the warm-ups."""
    for module, name in MAGIC_CLASSES:
        ipython.register_magics(getattr(importlib.import_module(f"{__name__}.{module}"), name))
    warm_up()


def warm_up() -> None:
    """Start every warm-up of :data:`WARM_UPS` (each returns at once)."""
    for module, name in WARM_UPS:
        getattr(importlib.import_module(module), name)()


def unload_ipython_extension(ipython: Any) -> None:
    """Undo :func:`load_ipython_extension` (``%unload_ext opmagic``).

    Every magic is removed and closed (the session last, which removes everything its cells
    registered), even when one of them fails to close; the first failure is raised after,
    with the extension unloaded all the same (so that ``%load_ext opmagic`` loads it again).
    """
    failures: list[BaseException] = []
    for module, name in reversed(MAGIC_CLASSES):
        magics = getattr(importlib.import_module(f"{__name__}.{module}"), name)
        for kind, names in magics.magics.items():
            for magic_name in names:
                ipython.magics_manager.magics[kind].pop(magic_name, None)
        instance = ipython.magics_manager.registry.pop(name, None)
        try:
            if hasattr(instance, "close"):  # magics holding resources: the session
                instance.close()
        except Exception as error:  # unload must finish: report the first failure after
            failures.append(error)
    if failures:
        # IPython counts an extension whose unload raised as still loaded, which would make
        # %load_ext a no-op while every magic is gone
        package = __name__.partition(".")[0]
        ipython.extension_manager.loaded.difference_update({package, __name__})
        raise failures[0]
