"""``triton_op_from_source``: Triton's tutorials and PyTorch's triton_op examples as cells, in
Triton's interpreter on CPU tensors: run, re-run, edit, failure, unload, check, compare, trace.

The kernels are written after Triton's tutorials (python/tutorials/01-vector-add.py,
02-fused-softmax.py) and PyTorch's triton_op documentation and custom-ops tutorial; the
launchers are typed, launch through ``wrap_triton``, and size the grid from the input instead
of the GPU's properties.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
import torch

import opmagic
from opmagic import Session, TritonOpResult, triton_op_from_source
from opmagic.errors import ArgumentTypeError, CellSourceError, TritonKernelError
from opmagic.native.triton import choose_mode

from ..shell import DispatcherState

pytest.importorskip("triton")

VECTOR_ADD = """
import triton
import triton.language as tl
from torch.library import wrap_triton

@triton.jit
def add_kernel(x_ptr, y_ptr, output_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements  # the last block may run past the end
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(output_ptr + offsets, x {op} y, mask=mask)

def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    output = torch.empty_like(x)
    n_elements = output.numel()
    grid = lambda meta: (triton.cdiv(n_elements, meta["BLOCK_SIZE"]),)
    wrap_triton(add_kernel)[grid](x, y, output, n_elements, BLOCK_SIZE=1024)
    return output
"""

SOFTMAX = """
import triton
import triton.language as tl
from torch.library import wrap_triton

@triton.jit
def softmax_kernel(output_ptr, input_ptr, input_row_stride, output_row_stride, n_rows, n_cols,
                   BLOCK_SIZE: tl.constexpr, num_stages: tl.constexpr):
    # persistent programs: each takes every num_programs-th row
    row_start = tl.program_id(0)
    row_step = tl.num_programs(0)
    for row_idx in tl.range(row_start, n_rows, row_step, num_stages=num_stages):
        col_offsets = tl.arange(0, BLOCK_SIZE)  # the row, padded to a power of two
        mask = col_offsets < n_cols
        row = tl.load(input_ptr + row_idx * input_row_stride + col_offsets, mask=mask,
                      other=-float("inf"))
        numerator = tl.exp(row - tl.max(row, axis=0))
        denominator = tl.sum(numerator, axis=0)
        tl.store(output_ptr + row_idx * output_row_stride + col_offsets,
                 numerator / denominator, mask=mask)

def softmax(x: torch.Tensor) -> torch.Tensor:
    n_rows, n_cols = x.shape
    y = torch.empty_like(x)
    programs = min(n_rows, 8)
    wrap_triton(softmax_kernel)[(programs,)](
        y, x, x.stride(0), y.stride(0), n_rows, n_cols,
        BLOCK_SIZE=triton.next_power_of_2(n_cols), num_stages=2,
    )
    return y
"""

# PyTorch's custom-ops tutorial: the launcher before its kernel, a string annotation, and
# an autograd formula written with the cell's companions
MYSIN = """
import triton
import triton.language as tl
from torch.library import wrap_triton

def mysin(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n_elements = x.numel()
    wrap_triton(sin_kernel)[(n_elements,)](x, out, n_elements, BLOCK_SIZE=4)
    return out

@triton.jit
def sin_kernel(in_ptr0, out_ptr, n_elements, BLOCK_SIZE: "tl.constexpr"):
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    tl.store(out_ptr + offsets, tl.sin(tl.load(in_ptr0 + offsets, mask=mask)), mask=mask)

@setup_context
def _(ctx, inputs, output):
    x, = inputs
    ctx.save_for_backward(x)

@backward
def _(ctx, grad):
    x, = ctx.saved_tensors
    return grad * x.cos()
"""

_names = itertools.count(1)


def fresh(name: str) -> str:
    """An operator name no other test used: ``tt3::add``."""
    return f"tt{next(_names)}::{name}"


@pytest.fixture
def session() -> Iterator[Session]:
    """A started session, closed after the test; the dispatcher must be as it was."""
    before = DispatcherState.now()
    started = Session().start()
    yield started
    started.close()
    assert DispatcherState.now() == before


def run(session: Session, key: str, source: str, name: str, namespace: dict, **kwargs):
    """Run ``source`` as the cell ``key`` of ``session``."""
    with session.cell(key, key, namespace):
        return triton_op_from_source(source, name, namespace=namespace, **kwargs)


def test_the_vector_add_tutorial_becomes_a_triton_op_run_by_the_interpreter():
    namespace = {"torch": torch}
    name = fresh("add")
    result = triton_op_from_source(VECTOR_ADD.format(op="+"), name, namespace=namespace)
    assert isinstance(result, TritonOpResult) and result.mode == "interpreter"
    torch.manual_seed(0)
    x, y = torch.rand(98432), torch.rand(98432)  # the tutorial's size: 97 programs
    torch.testing.assert_close(namespace["add"](x, y), x + y)
    dotted = name.replace("::", ".")
    torch.testing.assert_close(eval(f"torch.ops.{dotted}")(x, y), x + y)
    (kernel,) = result.triton_kernels
    assert (kernel.name, kernel.role) == ("add_kernel", "launched by add")
    assert kernel.where.endswith(":6")  # the @triton.jit line of the source


def test_the_fused_softmax_tutorial_runs_on_an_irregular_shape():
    namespace = {"torch": torch}
    triton_op_from_source(SOFTMAX, fresh("softmax"), namespace=namespace)
    torch.manual_seed(0)
    x = torch.randn(37, 781)  # the tutorial checks 1823 x 781: rows and columns not aligned
    torch.testing.assert_close(namespace["softmax"](x), torch.softmax(x, dim=1))


# Triton's vector-add tutorial as it is today: the device asked of Triton's driver first, the
# launcher named unlike the op, a launch without wrap_triton, the benchmark at the end
DEVICE_TUTORIAL = """
import torch
import triton
import triton.language as tl

DEVICE = triton.runtime.driver.active.get_active_torch_device()

@triton.jit
def add_kernel(x_ptr, y_ptr, output_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(axis=0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    output = tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask)
    tl.store(output_ptr + offsets, output, mask=mask)

def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    output = torch.empty_like(x)
    assert x.device == DEVICE and y.device == DEVICE and output.device == DEVICE
    n_elements = output.numel()
    grid = lambda meta: (triton.cdiv(n_elements, meta['BLOCK_SIZE']), )
    add_kernel[grid](x, y, output, n_elements, BLOCK_SIZE=1024)
    return output

@triton.testing.perf_report(
    triton.testing.Benchmark(x_names=['size'], x_vals=[2**12], line_arg='provider',
                             line_vals=['triton'], line_names=['Triton'], plot_name='add',
                             args={}, ylabel='GB/s'))
def benchmark(size, provider):
    return 0.0
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU driver answers for its device")
def test_the_tutorial_as_written_runs_in_the_interpreter_its_device_the_cpu():
    from triton.runtime import driver

    namespace: dict = {}
    result = triton_op_from_source(DEVICE_TUTORIAL, fresh("vector_add"), namespace=namespace)
    assert result.mode == "interpreter" and namespace["DEVICE"] == torch.device("cpu")
    x = torch.rand(98432, device=namespace["DEVICE"])
    torch.testing.assert_close(namespace["add"](x, x), x + x)
    with pytest.raises(RuntimeError, match="0 active drivers"):  # Triton's own answer again
        driver.active  # noqa: B018
    source = DEVICE_TUTORIAL.replace("\nDEVICE =", "\ndriver.active.utils\nDEVICE =")
    source = source.replace("import triton\n", "import triton\nfrom triton.runtime import driver\n")
    refused = r":7: AttributeError: .*active\.utils: this"
    with pytest.raises(CellSourceError, match=refused) as error:
        triton_op_from_source(source, fresh("vector_add"), namespace={})
    assert "raised in" not in str(error.value)  # opmagic's own frame is no place to look at


def test_pytorchs_tutorial_example_with_its_autograd_formula():
    namespace = {"torch": torch}
    name = fresh("mysin")
    result = triton_op_from_source(MYSIN, name, namespace=namespace)
    x = torch.randn(3, requires_grad=True)
    y = namespace["mysin"](x)
    torch.testing.assert_close(y, x.sin())
    y.sum().backward()
    torch.testing.assert_close(x.grad, x.detach().cos())
    report = opmagic.check_op(result.op, (torch.randn(5, dtype=torch.float64),))
    assert report.passed and {row.name for row in report.rows} >= {"gradcheck", "test_faketensor"}
    roles = {(row.key, row.role) for row in result.kernels}
    assert ("Autograd", "backward") in roles and ("Meta", "fake impl") in roles


def test_an_op_that_mutates_its_argument():
    source = """
import triton
import triton.language as tl
from torch.library import wrap_triton

@triton.jit
def scale_kernel(x_ptr, n, factor, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * factor, mask=mask)

def scale_(x: torch.Tensor, factor: float) -> None:
    wrap_triton(scale_kernel)[(triton.cdiv(x.numel(), 64),)](x, x.numel(), factor, BLOCK=64)
"""
    namespace = {"torch": torch}
    result = triton_op_from_source(
        source, fresh("scale_"), namespace=namespace, mutates_args=("x",)
    )
    x = torch.ones(100)
    namespace["scale_"](x, 3.0)
    torch.testing.assert_close(x, torch.full((100,), 3.0))
    assert "Tensor(a0!) x" in result.schema
    assert opmagic.check_op(result.op, (torch.randn(10), 2.0)).passed


def test_check_op_passes_every_opcheck_test_in_the_interpreter():
    namespace = {"torch": torch}
    result = triton_op_from_source(VECTOR_ADD.format(op="+"), fresh("add"), namespace=namespace)
    report = opmagic.check_op(result.op, (torch.randn(1000), torch.randn(1000)))
    assert [(row.name, row.status) for row in report.rows] == [
        ("test_schema", "pass"),
        ("test_autograd_registration", "pass"),
        ("test_faketensor", "pass"),
        ("test_aot_dispatch_dynamic", "pass"),
    ]
    text = str(result)
    reason = choose_mode(None)[1]  # a CPU build of torch, or a CUDA one without a GPU
    assert f"kernels: Triton's interpreter ({reason[:30]}" in " ".join(text.split())
    assert "keeps the op whole (interpreted kernels cannot be traced)" in " ".join(text.split())


def test_compare_checks_and_times_it_against_torch():
    namespace = {"torch": torch}
    result = triton_op_from_source(VECTOR_ADD.format(op="+"), fresh("add"), namespace=namespace)

    def inputs(size, dtype, device):
        a = torch.randn(size, dtype=dtype, device=device)
        return a, torch.randn_like(a)

    comparison = opmagic.compare(
        result.op, torch.add, inputs, sizes=[1000, 5000], min_run_time=0.01
    )
    assert comparison.passed and len(comparison.rows) == 2


def test_resolve_and_trace_show_the_path_and_the_launches_under_the_call():
    namespace = {"torch": torch}
    name = fresh("add")
    result = triton_op_from_source(VECTOR_ADD.format(op="+"), name, namespace=namespace)
    x, y = torch.randn(3000), torch.randn(3000)
    resolution = opmagic.resolve(result.op, x, y)
    assert resolution.path == ("AutogradCPU", "CPU")
    source = resolution.steps[-1].entry.source
    assert source.startswith("triton_op launcher add (<triton_op ")
    assert "launching add_kernel" in source
    traced = opmagic.trace(namespace["add"], x, y)
    torch.testing.assert_close(traced.result, x + y)
    (call,) = traced.calls
    assert call.op == name and call.path == resolution.path
    (launch,) = call.notes
    assert (launch.kernel, launch.grid) == ("add_kernel", (3,))
    assert launch.meta == (("BLOCK_SIZE", 1024),)
    assert launch.mode == "interpreter" and launch.where == result.triton_kernels[0].where
    assert "▸ launch add_kernel grid (3,) BLOCK_SIZE=1024" in str(traced)
    table = str(opmagic.dispatch_table(result.op))
    assert "triton_op launcher add" in " ".join(table.split())


def test_rerun_edit_failure_and_close_in_a_session(session: Session):
    namespace = {"torch": torch}
    name = fresh("add")
    x, y = torch.randn(500), torch.randn(500)
    first = run(session, "cell", VECTOR_ADD.format(op="+"), name, namespace)
    torch.testing.assert_close(namespace["add"](x, y), x + y)
    old_kernel = namespace["add_kernel"]
    run(session, "cell", VECTOR_ADD.format(op="*"), name, namespace)  # edited: the new kernel
    torch.testing.assert_close(namespace["add"](x, y), x * y)
    assert first.triton_kernels[0].name == "add_kernel"
    assert namespace["add_kernel"] is not old_kernel
    function = old_kernel.fn
    assert function not in type(old_kernel).rewritten_fn  # what Triton kept for it is gone
    broken = VECTOR_ADD.format(op="-").replace("BLOCK_SIZE: tl.constexpr", "BLOCK_SIZE")
    refused = pytest.raises(TritonKernelError, match="arange's arguments must be of type")
    with refused, session.cell("cell", "cell", namespace):
        triton_op_from_source(broken, name, namespace=namespace)
        namespace["add"](x, y)  # the first call finds the error: the cell fails
    torch.testing.assert_close(namespace["add"](x, y), x * y)  # the previous version stays
    assert namespace["add_kernel"].fn.__code__.co_filename != "broken"
    from torch._library import triton as torch_triton

    assert name in torch_triton.triton_ops_to_kernels
    session.close()  # what %unload_ext does
    assert name not in torch_triton.triton_ops_to_kernels
    assert not hasattr(getattr(torch.ops, name.split("::")[0]), "add")
    session.start()  # the fixture closes it again


def test_a_source_that_cannot_become_an_op_is_refused_at_its_line():
    with pytest.raises(CellSourceError, match=r":3: add\(\) needs type hints"):
        triton_op_from_source("import triton\n\ndef add(x, y):\n    return x\n", fresh("add"))
    with pytest.raises(ArgumentTypeError, match="interpret must be True, False or None"):
        triton_op_from_source(VECTOR_ADD, fresh("add"), interpret="yes")
