"""Private torch APIs of tracing and compiling: FakeTensorMode and its exceptions, make_fx,
dynamo's config and per-code caches, Inductor's config and AOTInductor packages.

What the doctor runs an op through; one thin function per private call.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator
from types import CodeType
from typing import Any

import torch


def fake_mode() -> Any:
    """A fresh ``FakeTensorMode`` (no shape environment: static shapes)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode()


# what FakeTensorMode logs, with torch's traceback, before it re-raises a meta kernel's or a
# fake impl's error (torch/_subclasses/fake_tensor.py)
_RERAISED_FAKE_ERRORS = frozenset(
    {"failed while attempting to run meta for %s", "fake tensor raised TypeError"}
)


class _ReraisedFakeErrorsFilter(logging.Filter):
    """Drops FakeTensorMode's log of an error it re-raises."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg not in _RERAISED_FAKE_ERRORS


@contextlib.contextmanager
def fake_errors_unlogged() -> Iterator[None]:
    """FakeTensorMode's own log of an error it re-raises left out: opmagic (or IPython) shows
    that error once, and the log would show it again with torch's internal frames."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    dropped = _ReraisedFakeErrorsFilter()
    logger.addFilter(dropped)
    try:
        yield
    finally:
        logger.removeFilter(dropped)


def fake_tensor(mode: Any, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as a fake tensor of ``mode`` (same sizes, strides, dtype and device)."""
    return mode.from_tensor(tensor)


def no_fake_kernel_errors() -> tuple[type[BaseException], ...]:
    """What FakeTensorMode raises for an operator with no fake (meta) kernel."""
    from torch._subclasses.fake_tensor import UnsupportedOperatorException

    return (UnsupportedOperatorException,)


def data_dependent_errors() -> tuple[type[BaseException], ...]:
    """What fake tensors and symbolic tracing raise for a shape or value known only from the
    data: an output size the fake cannot know, a ``.item()``, a branch on a data-dependent
    size."""
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
    )
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    return (DataDependentOutputException, DynamicOutputShapeException, GuardOnDataDependentSymNode)


def dynamic_output_shape_error() -> type[BaseException]:
    """What a fake impl that asks for a data-dependent size raises without a shape env."""
    from torch._subclasses.fake_tensor import DynamicOutputShapeException

    return DynamicOutputShapeException


def make_fx_symbolic(fn: Callable[..., Any], args: tuple) -> Any:
    """``make_fx(fn, tracing_mode="symbolic")(*args)``: an FX graph with symbolic shapes."""
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn, tracing_mode="symbolic")(*args)


@contextlib.contextmanager
def dynamo_settings() -> Iterator[None]:
    """Dynamo's config as the doctor compiles with it (ops whose output size depends on the
    data, and ``.item()``, captured in the graph), restored afterwards."""
    import torch._dynamo

    with torch._dynamo.config.patch(
        capture_dynamic_output_shape_ops=True, capture_scalar_outputs=True
    ):
        yield


def forget_compiled_code(code: CodeType) -> None:
    """Drop what dynamo compiled and cached for one code object (``torch._dynamo.reset_code``)."""
    import torch._dynamo

    torch._dynamo.reset_code(code)


def forget_all_compiled_code() -> None:
    """Drop the code torch.compile made so far, so that every compiled function traces again
    (``torch._dynamo.reset_code_caches``); a no-op until torch.compile was first used.

    Dynamo guards a compiled call on the identity of the OpOverloads it saw; an operator
    whose definition is taken over in place keeps them, so code compiled with its previous
    kernels and fake impl would keep running.
    """
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset_code_caches()


def compiled_entries(code: CodeType) -> int:
    """How many compiled versions dynamo keeps for a code object."""
    from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list

    return len(_debug_get_cache_entry_list(code))


def global_configs() -> dict[str, dict[str, Any]]:
    """Copies of the config modules the doctor's rungs read (dynamo, Inductor, functorch,
    export), to check that they are left as they were."""
    import torch._dynamo
    import torch._functorch.config
    import torch._inductor.config

    modules = {
        "dynamo": torch._dynamo.config,
        "inductor": torch._inductor.config,
        "functorch": torch._functorch.config,
    }
    return {name: module.get_config_copy() for name, module in modules.items()}


def aot_inductor_package(exported: Any, path: str) -> str:
    """Compile an ExportedProgram with AOTInductor into the package file ``path``."""
    import torch._inductor

    return torch._inductor.aoti_compile_and_package(exported, package_path=path)


def load_aot_inductor_package(path: str) -> Callable[..., Any]:
    """The runner of an AOTInductor package, called with the exported program's inputs."""
    import torch._inductor

    return torch._inductor.aoti_load_package(path)
