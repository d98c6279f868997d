"""``%%custom_op NS::NAME [options]``: a thin front on :func:`opmagic.custom_op_from_source`."""

from __future__ import annotations

import dataclasses

import torch
from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from ..cells.custom_op import CustomOpResult, custom_op_from_source
from ..verify import check_op
from .arguments import (
    COMPARE_OPTIONS,
    DOCTOR_CELL_OPTIONS,
    PYTHON_OP_OPTIONS,
    check_arguments,
    mutates_args,
    names,
    parse_options,
    with_options,
)
from .compare import compare_cell
from .context import magic_context
from .doctor import doctor_cell
from .session import running_cell_number


def _tags(text: str) -> tuple[torch.Tag, ...]:
    """torch.Tag members from their names."""
    tags = []
    for name in names(text):
        tag = getattr(torch.Tag, name, None)
        if not isinstance(tag, torch.Tag):
            known = ", ".join(sorted(n for n in dir(torch.Tag) if not n.startswith("_")))
            raise UsageError(f"--tags: {name!r} is not a torch.Tag; tags are: {known}")
        tags.append(tag)
    return tuple(tags)


@magics_class
class CustomOpMagics(Magics):
    """The ``%%custom_op`` cell magic."""

    @magic_arguments()
    @argument("name", help="the operator's name, NAMESPACE::NAME (e.g. mylib::numpy_sin)")
    @with_options(PYTHON_OP_OPTIONS)
    @argument(
        "--device-types",
        default=None,
        metavar="TYPES",
        help="comma-separated device types the function is the kernel for (e.g. cpu or "
        "cpu,cuda); default: every device (CompositeExplicitAutograd)",
    )
    @argument(
        "--schema",
        default=None,
        help="the schema to use instead of inferring it from the type hints, e.g. "
        "'(Tensor x, int n) -> Tensor'",
    )
    @argument(
        "--tags",
        default="",
        metavar="TAGS",
        help="comma-separated torch.Tag names for the operator, e.g. pt2_compliant_tag",
    )
    @with_options(COMPARE_OPTIONS)
    @with_options(DOCTOR_CELL_OPTIONS)
    @cell_magic
    def custom_op(self, line: str, cell: str) -> CustomOpResult:
        """Make a PyTorch custom operator from the type-hinted function in this cell.

        The function becomes ``torch.library.custom_op(NAME, ...)`` and is bound under its
        own name, so ``numpy_sin(x)`` and ``torch.ops.mylib.numpy_sin(x)`` both work. The
        operator's function is the one named like the operator, else the only top-level
        function that is not a companion and not private (``_helper``).

        Companions, written in the same cell (these names exist only while it runs)::

            @fake                      register_fake: the FakeTensor/meta implementation
            @setup_context             register_autograd: what backward needs ...
            @backward                  ... and the gradient formula
            @kernel("cuda")            register_kernel for some device types
            @vmap                      register_vmap: (info, in_dims, *args)
            @torch_dispatch(MyMode)    register_torch_dispatch under a mode or subclass
            autocast("cpu", torch.bfloat16)   register_autocast

        The cell shows the schema, what it registered per dispatch key (with its cell
        line) and the operator's dispatch table. Re-running the cell replaces the operator;
        a cell that fails leaves the previous one in place. Example::

            %%custom_op mylib::numpy_sin --check "torch.randn(3),"
            def numpy_sin(x: torch.Tensor) -> torch.Tensor:
                return torch.from_numpy(np.sin(x.numpy()))

            @fake
            def _(x):
                return torch.empty_like(x)
        """
        shell = self.shell
        with magic_context("%%custom_op"):
            args = parse_options(self.custom_op, line)
            devices = names(args.device_types) if args.device_types is not None else None
            source = f"# %%custom_op {line}\n{cell}"
            filename = shell.compile.cache(source, running_cell_number(shell), raw_code=source)
            result = custom_op_from_source(
                source,
                args.name,
                mutates_args=mutates_args(args),
                device_types=devices[0] if devices and len(devices) == 1 else devices,
                schema=args.schema,
                tags=_tags(args.tags),
                namespace=shell.user_ns,
                filename=filename,
            )
            samples = check_arguments(args, shell.user_ns)
            if samples is not None:
                result = dataclasses.replace(result, checks=check_op(result.op, samples))
        compare_cell(shell, args.compare, result, "%%custom_op")
        return doctor_cell(shell, args, result, "%%custom_op")
