"""``%%triton_op NS::NAME [options]``: a thin front on :func:`opmagic.triton_op_from_source`."""

from __future__ import annotations

import dataclasses

from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from ..cells.triton_op import TritonOpResult, triton_op_from_source
from ..errors import TritonKernelError
from ..verify import CheckReport, check_op
from .arguments import (
    COMPARE_OPTIONS,
    DOCTOR_CELL_OPTIONS,
    PYTHON_OP_OPTIONS,
    check_arguments,
    mutates_args,
    parse_options,
    with_options,
)
from .compare import compare_cell
from .context import magic_context
from .doctor import doctor_cell
from .session import running_cell_number

MAGIC = "%%triton_op"


@magics_class
class TritonOpMagics(Magics):
    """The ``%%triton_op`` cell magic."""

    @magic_arguments()
    @argument("name", help="the operator's name, NAMESPACE::NAME (e.g. mylib::add)")
    @with_options(PYTHON_OP_OPTIONS)
    @argument(
        "--interpret",
        action="store_true",
        help="make the kernels for Triton's interpreter (it runs them on CPU tensors) even "
        "when there is a GPU; without one they always are",
    )
    @with_options(COMPARE_OPTIONS)
    @with_options(DOCTOR_CELL_OPTIONS)
    @cell_magic
    def triton_op(self, line: str, cell: str) -> TritonOpResult:
        """Make a torch.library.triton_op from the Triton kernels and launcher in this cell.

        The cell holds @triton.jit kernels and one type-hinted launcher function that
        launches them through torch.library.wrap_triton; the launcher becomes
        torch.library.triton_op(NAME) and is bound under its own name. Companions are
        %%custom_op's (@fake, @setup_context + @backward, @vmap, ...). Example::

            %%triton_op mylib::add --check "torch.randn(1000), torch.randn(1000)"
            import triton
            import triton.language as tl
            from torch.library import wrap_triton

            @triton.jit
            def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
                offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
                mask = offsets < n
                x = tl.load(x_ptr + offsets, mask=mask)
                tl.store(out_ptr + offsets, x + tl.load(y_ptr + offsets, mask=mask), mask=mask)

            def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
                out = torch.empty_like(x)
                n = out.numel()
                wrap_triton(add_kernel)[(triton.cdiv(n, 256),)](x, y, out, n, BLOCK=256)
                return out

        Without a GPU the kernels run in Triton's interpreter on CPU tensors; each launch is
        first checked by Triton's compiler front end (the errors a GPU compile gives) and
        every load and store against the tensors' memory. A kernel's error is shown once, at
        its cell line, when the op first runs (with --check: when the cell runs, and the
        previous version of the op stays). The cell shows the schema, the kernels with their
        lines and the dispatch table; re-running it replaces the op and its kernels.
        """
        shell = self.shell
        with magic_context(MAGIC):
            args = parse_options(self.triton_op, line)
            source = f"# {MAGIC} {line}\n{cell}"
            filename = shell.compile.cache(source, running_cell_number(shell), raw_code=source)
            result = triton_op_from_source(
                source,
                args.name,
                mutates_args=mutates_args(args),
                namespace=shell.user_ns,
                filename=filename,
                interpret=True if args.interpret else None,
            )
            samples = check_arguments(args, shell.user_ns)
            if samples is not None:
                result = dataclasses.replace(result, checks=_check(result, samples))
        compare_cell(shell, args.compare, result, MAGIC)
        return doctor_cell(shell, args, result, MAGIC)


def _check(result: TritonOpResult, samples: tuple) -> CheckReport:
    """``--check``: run the op once on the sample arguments (a kernel's error fails the cell
    there, at the kernel's line, instead of failing every check), then the checks (which
    report any other failure, arguments the op refuses included, in their rows)."""
    try:
        result.op(*samples)
    except TritonKernelError:
        raise
    except Exception:  # the checks report it, in their rows
        pass
    return check_op(result.op, samples)
