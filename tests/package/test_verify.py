"""Exported packages built, installed where opmagic is not importable, and tested there
(opmagic/package/verify.py): a Python-only session, a classic C++ one (a cell relying on what
opmagic's prefix header gave it, and a CUDA cell only CUDA builds have) and a stable-ABI one (an
abi3 wheel whose library's symbols tie it to this torch, named by the audit; a stable package
verified to its tests is tests/notebooks/test_export_notebook.py's). One build per kind, shared
by its tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from IPython.utils.capture import capture_output

import opmagic
from opmagic.package import Export, Verification
from opmagic.package.verify import classic_symbols, fresh_environment

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@dataclass
class Exported:
    """A session's export and its verification."""

    export: Export
    verification: Verification


def _session(ipython, cells: list[str]) -> list[int]:
    """Run ``cells`` in a fresh opmagic session (each must succeed); their In [n] numbers."""
    ipython.run_line_magic("load_ext", "opmagic")
    numbers = []
    with capture_output():
        for index, cell in enumerate(cells):
            result = ipython.run_cell(cell, store_history=True, cell_id=f"cell-{index}")
            assert result.success, f"{result.error_in_exec!r}\n{cell}"
            numbers.append(result.execution_count)
    return numbers


def _unload(ipython) -> None:
    ipython.run_line_magic("unload_ext", "opmagic")
    ipython.reset()


def _steps(verification: Verification) -> dict[str, str]:
    return {step.name: step.status for step in verification.steps}


# ---------------------------------------------------------------- Python only

PYTHON_CELLS = [
    "import torch\nimport numpy as np\nimport opmagic",
    """%%custom_op vpy::numpy_sin --check "torch.randn(4, requires_grad=True),"
def numpy_sin(x: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.sin(x.numpy(force=True))).to(x.device)

@fake
def _(x):
    return torch.empty_like(x)

@setup_context
def _(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])

@backward
def _(ctx, grad):
    return grad * ctx.saved_tensors[0].cos()
""",
    """SCALE = 3.0
lib = torch.library.Library("vpy", "FRAGMENT")
lib.define("scale(Tensor x) -> Tensor")
def scale_kernel(x):
    return x * SCALE
lib.impl("scale", scale_kernel, "CompositeExplicitAutograd")
print(torch.ops.vpy.scale(torch.ones(2)))
""",
    "opmagic.compare(torch.ops.vpy.scale.default, lambda x: x * 3, [(torch.randn(5),)], "
    "min_run_time=0.01, progress=False)",
]


@pytest.fixture(scope="module")
def python_only(ipython, tmp_path_factory) -> Iterator[Exported]:
    _session(ipython, PYTHON_CELLS)
    try:
        export = opmagic.export(tmp_path_factory.mktemp("python") / "pkg", "vpy_ops")
    finally:
        _unload(ipython)
    yield Exported(export, export.verify())


def test_a_python_session_installs_as_a_pure_wheel_and_its_tests_pass(python_only) -> None:
    verification = python_only.verification
    assert verification.passed, str(verification)
    assert verification.wheel == "vpy_ops-0.1.0-py3-none-any.whl"
    assert _steps(verification) == {
        "build the wheel": "pass",
        "fresh environment": "pass",
        "install": "pass",
        "without opmagic": "pass",
        "tests": "pass",
    }
    tests = next(step for step in verification.steps if step.name == "tests")
    assert tests.detail.startswith("5 passed")  # opcheck, gradcheck, compare, compile, schemas
    assert (python_only.export.directory / "dist" / verification.wheel).is_file()


def test_a_package_that_fails_to_import_fails_with_its_log(python_only, tmp_path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(python_only.export.directory, broken)
    ops = broken / "vpy_ops" / "ops.py"
    ops.write_text(ops.read_text() + "\nraise RuntimeError('broken on purpose')\n")
    run = subprocess.run(  # `python -m opmagic verify DIR`, as a package's CI would
        [sys.executable, "-m", "opmagic", "verify", str(broken)],
        capture_output=True, text=True, check=False, timeout=1200,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "vpy_ops: FAILED at without opmagic" in run.stdout
    assert "FAIL" in run.stdout and "import vpy_ops failed" in run.stdout
    assert "RuntimeError: broken on purpose" in run.stdout  # the end of the step's log
    assert "verify: importing it without opmagic" in run.stderr
    assert "verify: running the generated tests" not in run.stderr


def test_opmagic_cannot_be_imported_in_the_fresh_environment(tmp_path) -> None:
    step, python = fresh_environment(tmp_path / "venv")
    assert step.status == "pass"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # even with opmagic's checkout on the path
    run = subprocess.run(
        [str(python), "-c", "import torch\nimport opmagic"],
        capture_output=True, text=True, env=env, check=False, timeout=600,
    )
    assert run.returncode == 1
    assert "ModuleNotFoundError: No module named 'opmagic' (opmagic is blocked here)" in run.stderr


# ---------------------------------------------------------------- classic C++

# no #include at all: opmagic's prefix header gave the cell torch/library.h and the core headers
CLASSIC_SOURCE = """%%torch_library
at::Tensor shift_cpu(const at::Tensor& x, double amount) {
  TORCH_CHECK(x.dtype() == at::kFloat, "shift takes float tensors");
  at::Tensor out = at::empty(x.sizes(), x.options());
  out.copy_(x);
  return out.add_(amount);
}

TORCH_LIBRARY(vclassic, m) {
  m.def("shift(Tensor x, float amount) -> Tensor");
}

TORCH_LIBRARY_IMPL(vclassic, CPU, m) {
  m.impl("shift", &shift_cpu);
}
"""
CLASSIC_PYTHON = """@torch.library.register_fake("vclassic::shift")
def _(x, amount):
    return torch.empty_like(x)

torch.library.register_autograd(
    "vclassic::shift", lambda ctx, grad: (grad, None), setup_context=lambda ctx, i, o: None)
"""
# the op's CUDA kernel, a .cu as a CUDAExtension builds it: only CUDA builds of the package have it
CUDA_SOURCE = """%%cuda_kernel
#include <torch/library.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>

__global__ void shift_kernel(const float* x, float* out, float amount, int64_t n) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = x[i] + amount;
}

at::Tensor shift_cuda(const at::Tensor& x, double amount) {
  at::Tensor input = x.contiguous();
  at::Tensor out = at::empty_like(input);
  int64_t n = input.numel();
  shift_kernel<<<(n + 255) / 256, 256>>>(
      input.data_ptr<float>(), out.data_ptr<float>(), static_cast<float>(amount), n);
  return out;
}

TORCH_LIBRARY_IMPL(vclassic, CUDA, m) {
  m.impl("shift", &shift_cuda);
}
"""
CLASSIC_CHECK = """opmagic.check_op(torch.ops.vclassic.shift.default, (torch.randn(3), 0.5))
if torch.cuda.is_available():  # a GPU machine: the CUDA kernel is checked (and tested) too
    opmagic.check_op(torch.ops.vclassic.shift.default, (torch.randn(3, device="cuda"), 0.5))
"""


@pytest.fixture(scope="module")
def classic(ipython, build_cache, tmp_path_factory) -> Iterator[Exported]:
    cells = [CLASSIC_SOURCE, CUDA_SOURCE, CLASSIC_PYTHON, CLASSIC_CHECK]
    _session(ipython, ["import torch\nimport opmagic", *cells])
    try:
        export = opmagic.export(tmp_path_factory.mktemp("classic") / "pkg", "vclassic_ops")
    finally:
        _unload(ipython)
    yield Exported(export, export.verify())


def test_a_classic_cell_builds_with_what_opmagic_gave_it_made_explicit(classic) -> None:
    source = (classic.export.directory / "vclassic_ops" / "csrc" / "vclassic.cpp").read_text()
    head, cell = source.split("// ---- cell ", 1)
    assert "#include <torch/library.h>" in head and "#include <ATen/ops/empty.h>" in head
    assert cell.split("\n", 1)[1] == CLASSIC_SOURCE.removeprefix("%%torch_library\n")
    assert classic.export.abi == "classic"
    setup = (classic.export.directory / "setup.py").read_text()
    assert "py_limited_api" not in setup and '"-O3",' in setup
    # the CUDA cell: a file of its own, built only where torch has CUDA and nvcc is there
    cuda = (classic.export.directory / "vclassic_ops" / "csrc" / "cuda" / "vclassic_2.cu")
    assert "TORCH_LIBRARY_IMPL(vclassic, CUDA, m)" in cuda.read_text()
    assert '    if USE_CUDA:\n        built += [\n            CUDAExtension(' in setup
    assert '"vclassic_ops._C_vclassic_2",' in setup


def test_a_classic_session_installs_and_its_tests_pass_without_opmagic(classic) -> None:
    verification = classic.verification
    assert verification.passed, str(verification)
    assert verification.wheel.startswith("vclassic_ops-0.1.0-cp3")
    assert "abi3" not in verification.wheel
    assert "stable ABI" not in _steps(verification)
    tests = next(step for step in verification.steps if step.name == "tests")
    if not torch.cuda.is_available():
        assert tests.detail.startswith("3 passed")  # opcheck, compile, schemas
        isolation = next(step for step in verification.steps if step.name == "without opmagic")
        assert isolation.detail.endswith("(loaded: _C_vclassic)")  # no CUDA library here


@pytest.mark.gpu
def test_on_a_gpu_the_cuda_cell_is_built_and_its_samples_run(classic) -> None:
    if not torch.cuda.is_available() or torch.version.cuda is None:
        pytest.skip("needs an NVIDIA GPU, a CUDA build of torch and nvcc")
    verification = classic.verification
    assert verification.passed, str(verification)
    isolation = next(step for step in verification.steps if step.name == "without opmagic")
    assert isolation.detail.endswith("(loaded: _C_vclassic, _C_vclassic_2)")
    tests = next(step for step in verification.steps if step.name == "tests")
    assert tests.detail.startswith("4 passed")  # opcheck on cpu and cuda, compile, schemas


# ---------------------------------------------------------------- stable ABI

STABLE_INCLUDES = """#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
"""
# no Macros.h: STD_TORCH_CHECK and TORCH_BOX came from opmagic's stable header set
STABLE_SOURCE = f"""%%torch_library
{STABLE_INCLUDES}
torch::stable::Tensor negate_cpu(const torch::stable::Tensor& x) {{
  STD_TORCH_CHECK(x.dim() >= 0);
  torch::stable::Tensor out = torch::stable::empty_like(x);
  torch::stable::fill_(out, 0.0);
  return torch::stable::subtract(out, x);
}}

STABLE_TORCH_LIBRARY(vstable, m) {{
  m.def("negate(Tensor x) -> Tensor");
}}

STABLE_TORCH_LIBRARY_IMPL(vstable, CPU, m) {{
  m.impl("negate", TORCH_BOX(&negate_cpu));
}}
"""
# a stable-ABI library that calls into c10 all the same (a declaration copied from c10's
# headers): it loads with this torch, and would break with another
TIED_SOURCE = f"""%%torch_library
{STABLE_INCLUDES}#include <cstdint>

namespace c10::detail {{
[[noreturn]] void torchCheckFail(const char* func, const char* file, uint32_t line,
                                 const char* message);
}}

torch::stable::Tensor checked_cpu(const torch::stable::Tensor& x) {{
  if (x.dim() > 64) {{
    c10::detail::torchCheckFail(__func__, __FILE__, __LINE__, "too many dimensions");
  }}
  return torch::stable::empty_like(x);
}}

STABLE_TORCH_LIBRARY(vtied, m) {{
  m.def("checked(Tensor x) -> Tensor");
}}

STABLE_TORCH_LIBRARY_IMPL(vtied, CPU, m) {{
  m.impl("checked", TORCH_BOX(&checked_cpu));
}}
"""
STABLE_PYTHON = """@torch.library.register_fake("vstable::negate")
def _(x):
    return torch.empty_like(x)

opmagic.check_op(torch.ops.vstable.negate.default, (torch.randn(2, 3),))
"""


@pytest.fixture(scope="module")
def stable(ipython, build_cache, tmp_path_factory) -> Iterator[tuple[Export, Exported]]:
    """The session's well-behaved stable library exported (notebooks/export.ipynb verifies
    one such package to the end), and its tied one exported and verified."""
    numbers = _session(
        ipython, ["import torch\nimport opmagic", STABLE_SOURCE, STABLE_PYTHON, TIED_SOURCE]
    )
    root = tmp_path_factory.mktemp("stable")
    try:
        good = opmagic.export(root / "good", "vstable_ops", cells=numbers[1:3])
        tied = opmagic.export(root / "tied", "vtied_ops", cells=numbers[3:])
    finally:
        _unload(ipython)
    yield good, Exported(tied, tied.verify())


def test_a_stable_cell_is_built_for_the_stable_abi_as_an_abi3_wheel(stable) -> None:
    good, _ = stable
    assert good.abi == "stable"
    head = (good.directory / "vstable_ops" / "csrc" / "vstable.cpp").read_text()
    assert "#include <torch/headeronly/macros/Macros.h>" in head.split("// ---- cell")[0]
    setup = (good.directory / "setup.py").read_text()
    assert "py_limited_api=True" in setup and '"py_limited_api": "cp310"' in setup
    assert '"-DTORCH_TARGET_VERSION=0x' in setup and '"-DPy_LIMITED_API=0x030A0000",' in setup


def test_a_stable_library_tied_to_this_torch_is_named_by_the_audit(stable) -> None:
    _, tied = stable
    verification = tied.verification
    assert tied.export.abi == "stable"
    assert verification.wheel == "vtied_ops-0.1.0-cp310-abi3-linux_x86_64.whl"
    assert _steps(verification) == {
        "build the wheel": "pass",
        "fresh environment": "pass",
        "install": "pass",
        "without opmagic": "pass",
        "stable ABI": "FAIL",  # the tests are moot once the audit failed
    }
    assert verification.summary == "FAILED at stable ABI"
    audit = verification.steps[-1]
    assert "would break with another torch" in audit.detail
    assert "c10::detail::torchCheckFail(char const*, char const*, unsigned int, char const*)" in (
        audit.log
    )


def test_the_audit_ignores_the_cpp_runtime_torch_also_exports() -> None:
    runtime = "_ZNSt7__cxx1118basic_stringstreamIcSt11char_traitsIcESaIcEEC1Ev"
    shim, classic = "aoti_torch_get_numel", "_ZN3c106detail14torchCheckFailEPKcS2_jS2_"
    found = classic_symbols([runtime, shim, classic, "memcpy"], frozenset({runtime, classic}))
    assert found == ["c10::detail::torchCheckFail(char const*, char const*, unsigned int, "
                     "char const*)"]
