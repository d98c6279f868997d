"""torch/extension.h narrowed: which sources are compiled with the narrow headers first, and
that a narrowed build registers what the full header's does, or is compiled in full."""

from __future__ import annotations

import textwrap

import pytest
import torch

from opmagic import CompileError, compile_library
from opmagic.cachedir import BuildCache
from opmagic.native.narrowing import (
    NARROW_HEADERS,
    UMBRELLA_HEADERS,
    narrow_include_dir,
    narrowable,
)


def _extension_source(namespace: str, kernel_line: str = "") -> str:
    """The dispatcher tutorial's myadd, with ``torch/extension.h`` (kernel body line 9)."""
    return textwrap.dedent(
        f"""\
        #include <torch/extension.h>

        using torch::Tensor;

        Tensor myadd_cpu(const Tensor& self, const Tensor& other) {{
          TORCH_CHECK(self.sizes() == other.sizes());
          Tensor result = torch::empty(self.sizes(), self.options());
          result.copy_(self + other);
          {kernel_line}
          return result;
        }}

        TORCH_LIBRARY({namespace}, m) {{
          m.def("myadd(Tensor self, Tensor other) -> Tensor");
        }}

        TORCH_LIBRARY_IMPL({namespace}, CPU, m) {{
          m.impl("myadd", myadd_cpu);
        }}
        """
    )


FULL_HEADER_SOURCES = {
    "pybind11": "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {}",
    "py::": "py::object f();",
    "CPython": "PyObject* f();",
    "torch::python": "auto f = &torch::python::bind_module<int>;",
    "torch::nn": "torch::nn::Linear layer(2, 3);",
    "nn:: after using namespace torch": "using namespace torch; nn::Linear layer(2, 3);",
    "autograd::Function": "struct F : torch::autograd::Function<F> {};",
    "NoGradGuard": "void f() { torch::NoGradGuard no_grad; }",
    "a conditional": "#ifdef TORCH_VERSION_MAJOR\nint f();\n#endif",
}


@pytest.mark.parametrize("umbrella", UMBRELLA_HEADERS)
def test_sources_of_tensors_and_registrations_are_narrowed(umbrella: str) -> None:
    source = _extension_source("n").replace("torch/extension.h", umbrella)
    assert narrowable(source)
    assert narrowable(source + '\nconst char* text = "torch::nn:: py:: #ifdef";  // nn::Linear\n')
    # other namespaces' names like the frontend's: the source includes what declares them
    other = "#include <ATen/cuda/CUDAContext.h>\nauto s = at::cuda::getCurrentCUDAStream();\n"
    assert narrowable(source + other + "auto n = std::data(std::vector<int>{});\n")


@pytest.mark.parametrize("what", FULL_HEADER_SOURCES)
def test_sources_using_python_or_the_frontend_are_compiled_in_full_at_once(what: str) -> None:
    assert not narrowable(f"{_extension_source('n')}\n{FULL_HEADER_SOURCES[what]}\n")


def test_only_sources_including_an_umbrella_header_are_narrowed() -> None:
    minimal = _extension_source("n").replace("torch/extension.h", "torch/library.h")
    assert not narrowable(minimal)
    assert not narrowable("// #include <torch/extension.h>\n" + minimal)


def test_the_narrow_headers_stand_in_for_every_umbrella_header(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    directory = narrow_include_dir(BuildCache())
    for name in UMBRELLA_HEADERS:
        text = (directory / name).read_text()
        assert [line for line in text.splitlines() if line.startswith("#include")] == [
            f"#include <{header}>" for header in NARROW_HEADERS
        ]
    (directory / "torch" / "extension.h").write_text("#error damaged\n")
    assert narrow_include_dir(BuildCache()) == directory
    assert "#error" not in (directory / "torch" / "extension.h").read_text()


def _facts(library) -> tuple:
    """What a library registered and how its op behaves."""
    namespace = library.operators[0].schema.split("::", 1)[0]
    x, y = torch.randn(5), torch.randn(5)
    result = getattr(torch.ops, namespace).myadd(x, y)
    return (
        [op.schema.split("::", 1)[1] for op in library.operators],
        [(kernel.key, kernel.is_alias) for kernel in library.kernels],
        [(block.macro, block.key, block.line) for block in library.blocks],
        torch.equal(result, x + y),
    )


@pytest.mark.slow
def test_a_narrowed_build_registers_what_a_build_with_the_full_header_does(loaded) -> None:
    narrowed = compile_library(_extension_source("nr_narrow"), progress=None)
    loaded.append(narrowed)
    # TORCH_VERSION_MAJOR comes from torch/version.h, which the narrow headers leave out:
    # the narrowed compile fails, the source is compiled again with torch/extension.h
    needs_full = _extension_source("nr_full", "TORCH_CHECK(TORCH_VERSION_MAJOR >= 2);")
    assert narrowable(needs_full)
    full = compile_library(needs_full, progress=None)
    loaded.append(full)
    assert (narrowed.build.header_set, full.build.header_set) == ("types", "extension")
    assert "narrow-" in narrowed.build.commands[0] and "narrow-" not in full.build.commands[0]
    assert _facts(narrowed) == _facts(full)


@pytest.mark.slow
def test_an_error_in_a_narrowed_source_is_the_full_compiles(loaded) -> None:
    source = _extension_source("nr_error", "result.no_such_method();")
    with pytest.raises(CompileError) as caught:
        compile_library(source, label="cell [4]", progress=None)
    error = caught.value
    assert "narrow-" not in error.command  # the full header's compile says what is wrong
    assert [d.user_line for d in error.diagnostics if d.is_error] == [9]
    assert "no_such_method" in str(error)
