"""``opmagic.native.triton``: a cell's Triton kernels in the interpreter, their launches checked
(compiler front end, memory bounds), noted for the trace, and their errors at cell lines.

Without a GPU (this machine) kernels run in Triton's interpreter; the compiled path is
tested in tests/cells/test_triton_op_gpu.py where a GPU is lent.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import opmagic
from opmagic.cells.custom_op import source_file
from opmagic.errors import NoGPUError, TritonKernelError, TritonNotInstalledError
from opmagic.native import triton as native

pytest.importorskip("triton")

_cells = itertools.count(1)
HEADER = "import triton\nimport triton.language as tl\n"
ADD = HEADER + textwrap.dedent(
    """
    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask)
        tl.store(out_ptr + offsets, x + tl.load(y_ptr + offsets, mask=mask), mask=mask)
    """
)


def run_cell(source: str, namespace: dict | None = None) -> tuple[dict, native.TritonKernels]:
    """Run ``source`` as a cell would (its own file name, kernels made for the interpreter)."""
    namespace = {} if namespace is None else namespace
    filename = source_file(f"<triton test cell {next(_cells)}>", source)
    with native.kernels_made_for(native.INTERPRETER):
        exec(compile(source, filename, "exec"), namespace)
    return namespace, native.instrument_cell_kernels(namespace, filename, native.INTERPRETER)


def launch(kernel, n: int = 1000, block: int = 256, **extra) -> tuple[torch.Tensor, ...]:
    x, y, out = torch.randn(n), torch.randn(n), torch.zeros(n)
    kernel[(triton_cdiv(n, block),)](x, y, out, n, BLOCK=block, **extra)
    return x, y, out


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def kernel_error(source: str, *args, **kwargs) -> TritonKernelError:
    """The error the first launch of the cell's ``k`` raises."""
    namespace, _ = run_cell(source)
    with pytest.raises(TritonKernelError) as raised:
        namespace["k"][(1,)](*args, **kwargs)
    return raised.value


def test_without_a_gpu_kernels_are_interpreted_and_the_reason_is_given():
    why = (
        f"this torch ({torch.__version__}) is a CPU build"
        if torch.version.cuda is None
        else "no GPU is visible to torch (torch.cuda.is_available() is False)"
    )
    assert native.choose_mode(None) == (
        native.INTERPRETER,
        f"{why}: Triton's interpreter runs the kernels on CPU tensors",
    )
    assert native.choose_mode(True) == (native.INTERPRETER, "asked for")
    with pytest.raises(NoGPUError, match="interpret=False asks for kernels compiled for a GPU"):
        native.choose_mode(False)


def test_cell_kernels_run_in_the_interpreter_and_name_their_lines():
    namespace, kernels = run_cell(ADD)
    (kernel,) = kernels.kernels
    assert (kernel.name, kernel.line, kernel.interpreted) == ("add_kernel", 4, True)
    x, y, out = launch(namespace["add_kernel"])
    torch.testing.assert_close(out, x + y)
    assert kernels.description == "Triton kernels (interpreter): add_kernel"


def test_a_launch_on_fake_or_meta_tensors_runs_nothing():
    namespace, _ = run_cell(ADD)
    with FakeTensorMode():
        fake = torch.empty(8)
        assert namespace["add_kernel"][(1,)](fake, fake, fake, 8, BLOCK=8) is None
    meta = torch.empty(8, device="meta")
    assert namespace["add_kernel"][(1,)](meta, meta, meta, 8, BLOCK=8) is None


@pytest.mark.parametrize(
    ("body", "line", "message", "hint"),
    [
        (  # an undefined name
            "    tl.store(x_ptr + tl.arange(0, BLOCK), undefined_thing)\n",
            6,
            "NameError: undefined_thing is not defined",
            None,
        ),
        (  # a type error: a float added to a pointer's values
            "    x = tl.load(x_ptr + tl.arange(0, BLOCK))\n"
            "    tl.store(x_ptr + tl.arange(0, BLOCK), x + x_ptr)\n",
            7,
            "invalid operands of type pointer<fp32> and triton.language.float32",
            None,
        ),
        (  # an unsupported construct
            "    try:\n        pass\n    except Exception:\n        pass\n",
            6,
            "unsupported AST node type: Try",
            "a Triton kernel is a subset of Python",
        ),
    ],
)
def test_what_a_device_compile_rejects_is_an_error_at_the_kernels_cell_line(
    body: str, line: int, message: str, hint: str | None
):
    source = HEADER + "\n@triton.jit\ndef k(x_ptr, BLOCK: tl.constexpr):\n" + body
    error = kernel_error(source, torch.zeros(8), BLOCK=8)
    assert error.kernel == "k" and error.line == line
    first, excerpt = str(error).splitlines()[:2], str(error).splitlines()
    assert first[0].startswith("Triton kernel k (<triton test cell ") and message in first[0]
    assert any(row.startswith(f"  > {line} | ") for row in excerpt)
    assert (f"  hint: {hint}" in str(error)) if hint else "hint:" not in str(error)
    assert str(error).endswith("Fix the kernel and run its cell again.")


def test_a_block_size_that_is_not_constexpr_is_named_with_the_fix():
    source = HEADER + textwrap.dedent(
        """
        @triton.jit
        def k(x_ptr, BLOCK):
            offsets = tl.arange(0, BLOCK)
            tl.store(x_ptr + offsets, tl.load(x_ptr + offsets) * 2)
        """
    )
    error = kernel_error(source, torch.zeros(8), 8)
    assert error.line == 6 and "arange's arguments must be of type tl.constexpr" in str(error)
    lines = str(error).splitlines()
    caret = lines[lines.index(next(row for row in lines if row.startswith("  > 6 |"))) + 1]
    assert caret.index("^") == lines[2].index("tl.arange")  # the caret under the call
    assert "annotate the parameter as tl.constexpr" in str(error)


def test_an_error_in_a_helper_is_at_the_helpers_line_called_from_the_kernels():
    source = HEADER + textwrap.dedent(
        """
        @triton.jit
        def twice(x):
            return x * nowhere

        @triton.jit
        def k(x_ptr, BLOCK: tl.constexpr):
            offsets = tl.arange(0, BLOCK)
            tl.store(x_ptr + offsets, twice(tl.load(x_ptr + offsets)))
        """
    )
    error = kernel_error(source, torch.zeros(8), BLOCK=8)
    text = str(error)
    assert error.line == 6 and text.startswith("Triton kernel twice (<triton test cell ")
    assert "NameError: nowhere is not defined" in text.splitlines()[0]
    assert "  called from k (<triton test cell " in text and ">:11)" in text


def test_an_error_inside_tritons_library_is_at_the_line_that_called_it():
    source = HEADER + textwrap.dedent(
        """
        @triton.jit
        def k(x_ptr, BLOCK):
            accumulator = tl.zeros((BLOCK,), dtype=tl.float32)
            tl.store(x_ptr + tl.arange(0, 8), accumulator)
        """
    )
    error = kernel_error(source, torch.zeros(8), 8)
    first = str(error).splitlines()[0]
    assert error.line == 6 and first.startswith("Triton kernel k (<triton test cell ")
    assert "): TypeError: Shape element 0 must have type `constexpr[int]`, got " in first
    assert "  hint: shapes and block sizes must be known when the kernel compiles" in str(error)
    assert "called from" not in str(error)


def test_a_launch_the_front_end_cannot_check_runs_and_its_error_is_at_the_kernel_line():
    source = HEADER + textwrap.dedent(
        """
        @triton.jit
        def k(values, out_ptr, BLOCK: tl.constexpr):
            offsets = tl.arange(0, BLOCK)
            tl.store(out_ptr + offsets, tl.load(values + offsets))
        """
    )
    error = kernel_error(source, [1.0, 2.0], torch.zeros(2), BLOCK=2)  # a list, not a tensor
    first = str(error).splitlines()[0]
    assert error.line == 7 and "): AttributeError: 'list' object has no attribute " in first


def test_a_device_compile_error_is_reported_as_the_front_ends_is(monkeypatch):
    """A compiled kernel's launch compiles it, and Triton raises the same CompilationError;
    without a GPU that compile is stood in for by a ``run`` raising the error Triton's front end
    raises for the kernel (the one mock here: a device compile is impossible on this machine)."""
    from triton.runtime.jit import JITFunction

    from opmagic._torch import triton as shim

    source = HEADER + "\n@triton.jit\ndef k(x_ptr, BLOCK):\n    tl.arange(0, BLOCK)\n"
    namespace = {}
    filename = source_file(f"<triton test cell {next(_cells)}>", source)
    with native.kernels_made_for(native.DEVICE):
        exec(compile(source, filename, "exec"), namespace)
    function = namespace["k"].fn

    def compile_on_launch(self, *args, grid, warmup, **kwargs):
        shim.front_end_check(function, args, kwargs)

    monkeypatch.setattr(JITFunction, "run", compile_on_launch)
    (kernel,) = native.instrument_cell_kernels(namespace, filename, native.DEVICE).kernels
    assert not kernel.interpreted
    with pytest.raises(TritonKernelError, match=r":6\): ValueError: arange's arguments") as raised:
        namespace["k"][(1,)](torch.zeros(4), 4)
    assert raised.value.line == 6 and raised.value.__cause__ is None


def test_an_out_of_bounds_load_is_caught_before_it_reads():
    source = HEADER + textwrap.dedent(
        """
        @triton.jit
        def k(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            x = tl.load(x_ptr + offsets)
            tl.store(out_ptr + offsets, x, mask=offsets < n)
        """
    )
    namespace, _ = run_cell(source)
    x, out = torch.randn(100), torch.zeros(100)
    with pytest.raises(TritonKernelError) as raised:
        namespace["k"][(2,)](x, out, 100, BLOCK=64)
    text = str(raised.value)
    assert raised.value.line == 7 and text.splitlines()[0].endswith(
        "out-of-bounds load in program (1, 0, 0): it reads 28 elements past the memory of "
        "x_ptr (float32, 100 elements): offsets 100..127 from x_ptr. Mask the access "
        "(mask=offsets < n) or launch fewer programs."
    )
    assert "  > 7 |     x = tl.load(x_ptr + offsets)" in text


def test_an_out_of_bounds_store_is_caught_before_it_writes():
    source = HEADER + textwrap.dedent(
        """
        @triton.jit
        def k(out_ptr, start, BLOCK: tl.constexpr):
            offsets = start + tl.arange(0, BLOCK)
            tl.store(out_ptr + offsets, offsets.to(tl.float32))
        """
    )
    namespace, _ = run_cell(source)
    storage = torch.zeros(16)
    out = storage[:8]  # a view: its storage's memory is the bound
    with pytest.raises(
        TritonKernelError,
        match=r"writes 8 elements past the memory of out_ptr "
        r"\(float32, 8 elements\): offsets 16..23 from out_ptr",
    ):
        namespace["k"][(1,)](out, 8, BLOCK=16)
    assert torch.equal(storage, torch.zeros(16))  # nothing was written, in bounds or not
    namespace["k"][(1,)](out, 8, BLOCK=8)  # inside the storage (past the view) is not flagged
    torch.testing.assert_close(storage[8:], torch.arange(8, 16, dtype=torch.float32))


def test_launches_are_noted_for_the_trace_with_grid_and_meta_parameters():
    namespace, _ = run_cell(ADD)
    x, y, out = torch.randn(1000), torch.randn(1000), torch.zeros(1000)

    def code():
        grid = lambda meta: (triton_cdiv(1000, meta["BLOCK"]),)  # noqa: E731
        namespace["add_kernel"][grid](x, y, out, 1000, BLOCK=256, num_warps=4)

    result = opmagic.trace(code)
    (launched,) = result.notes  # launched by the traced code itself, under no operator call
    assert launched == native.TritonLaunch(
        "add_kernel",
        launched.where,
        (4,),
        (("BLOCK", 256), ("num_warps", 4)),
        (
            ("x_ptr", "float32[1000]"),
            ("y_ptr", "float32[1000]"),
            ("out_ptr", "float32[1000]"),
            ("n", "1000"),
        ),
        native.INTERPRETER,
    )
    assert str(launched) == (
        "launch add_kernel grid (4,) BLOCK=256, num_warps=4 (x_ptr=float32[1000], "
        f"y_ptr=float32[1000], out_ptr=float32[1000], n=1000) · {launched.where} · interpreter"
    )


def test_redefining_a_helper_makes_the_kernels_that_call_it_forget_what_they_compiled():
    helpers, _ = run_cell(HEADER + "@triton.jit\ndef scale(x):\n    return x * 2\n")
    source = HEADER + textwrap.dedent(
        """
        @triton.jit
        def k(x_ptr, BLOCK: tl.constexpr):
            offsets = tl.arange(0, BLOCK)
            tl.store(x_ptr + offsets, scale(tl.load(x_ptr + offsets)))
        """
    )
    namespace, kernels = run_cell(source, helpers)
    x = torch.ones(8)
    namespace["k"][(1,)](x, BLOCK=8)
    (kernel,) = kernels.kernels
    assert kernel._checked and kernel.function in type(namespace["k"]).rewritten_fn
    run_cell(HEADER + "@triton.jit\ndef scale(x):\n    return x * 3\n", namespace)
    assert not kernel._checked and kernel.function not in type(namespace["k"]).rewritten_fn
    namespace["k"][(1,)](x, BLOCK=8)
    torch.testing.assert_close(x, torch.full((8,), 6.0))  # the new helper ran


def test_closing_the_kernels_drops_what_triton_keeps_for_them():
    namespace, kernels = run_cell(ADD)
    launch(namespace["add_kernel"])
    function = kernels.kernels[0].function
    assert function in type(namespace["add_kernel"]).rewritten_fn
    kernels.close()
    assert function not in type(namespace["add_kernel"]).rewritten_fn and kernels.closed


def test_the_install_command_follows_the_version_torch_pins(monkeypatch):
    if native.torch_triton_requirement() is None:  # a CPU build of torch pins no Triton
        assert native.install_command().startswith("pip install triton, or pip install ")
    # a CUDA wheel of torch requires the Triton it was built with
    monkeypatch.setattr(
        native.importlib.metadata,
        "requires",
        lambda name: ['triton==3.7.1; platform_system == "Linux" and python_version < "3.15"'],
    )
    assert native.install_command() == (
        'pip install "triton==3.7.1" (the version this torch wheel requires)'
    )


HIDDEN_TRITON = textwrap.dedent(
    """
    import importlib.abc, sys

    class HideTriton(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "triton" or name.startswith("triton."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    sys.meta_path.insert(0, HideTriton())
    """
)


@pytest.mark.slow
def test_without_triton_the_error_says_how_to_install_it():
    script = HIDDEN_TRITON + textwrap.dedent(
        """
        import opmagic
        try:
            opmagic.triton_op_from_source("def f(x: int) -> int:\\n    return x\\n", "t::f")
        except opmagic.TritonNotInstalledError as error:
            print(error)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True
    )
    assert done.stdout.startswith(f"Triton is not installed in this Python ({sys.executable}). ")
    assert f"Install it with {native.install_command().split(' (')[0]}" in done.stdout
    assert issubclass(TritonNotInstalledError, opmagic.ToolchainError)
