"""compile_library end to end, with the real compiler and the real dispatcher: what a library
registers and reports, for the kinds of source an extension is written as."""

from __future__ import annotations

import textwrap

import pytest
import torch

import opmagic
from opmagic.native import compile_library
from opmagic.native.blocks import scan_blocks

from .sources import op_source

pytestmark = pytest.mark.slow  # compiles C++


def test_a_library_registers_its_ops_and_reports_what_it_added(loaded, core_precompiled):
    library = compile_library(op_source("cl_basic"), progress=None)
    loaded.append(library)

    assert torch.equal(torch.ops.cl_basic.scale(torch.ones(2)), torch.full((2,), 2.0))
    assert [(op.name, op.schema, op.line) for op in library.operators] == [
        ("cl_basic::scale", "cl_basic::scale(Tensor x) -> Tensor", 4)
    ]
    assert [(k.op, k.key, k.is_alias, k.line) for k in library.kernels] == [
        ("cl_basic::scale", "CPU", False, 10)
    ]
    assert [str(b) for b in library.blocks] == [
        "TORCH_LIBRARY(cl_basic)",
        "TORCH_LIBRARY_IMPL(cl_basic, CPU)",
    ]
    assert library.blocks == scan_blocks(library.source)  # the compiler and the scanner agree
    assert library.build.header_set == "core" and library.build.precompiled
    text = str(library)
    assert "cl_basic::scale(Tensor x) -> Tensor  cl_basic.cpp, line 4" in text
    assert "CPU" in text and "cl_basic.cpp, line 10" in text  # kernels, and the dispatch table
    html = library._repr_html_()
    assert "cl_basic::scale(Tensor x) -&gt; Tensor" in html and "<table>" in html
    assert opmagic.dispatch_table("cl_basic::scale")["CPU"].source == "cl_basic.cpp, line 10"


def test_a_pybind11_extension_source_compiles_and_registers(loaded):
    """A setup.py CppExtension source: torch/extension.h, TORCH_EXTENSION_NAME, a module."""
    source = textwrap.dedent(
        """\
        #include <torch/extension.h>

        torch::Tensor halve(const torch::Tensor& x) {
          return x / 2;
        }

        PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
          m.def("halve", &halve, "x / 2");
        }

        TORCH_LIBRARY(cl_pybind, m) {
          m.def("halve(Tensor x) -> Tensor");
        }

        TORCH_LIBRARY_IMPL(cl_pybind, CPU, m) {
          m.impl("halve", halve);
        }
        """
    )
    library = compile_library(source, progress=None)
    loaded.append(library)
    assert library.build.header_set == "extension"
    assert "-DTORCH_EXTENSION_NAME=cl_pybind" in library.build.commands[0]
    assert torch.ops.cl_pybind.halve(torch.full((2,), 3.0)).tolist() == [1.5, 1.5]


def test_a_c_extension_module_source_compiles_and_registers(loaded):
    source = textwrap.dedent(
        """\
        #include <Python.h>
        #include <torch/library.h>
        #include <ATen/core/Tensor.h>
        #include <ATen/ops/mul.h>

        // A C extension module as setup.py builds it; opmagic loads it without importing it.
        static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "cl_setup", nullptr, -1};

        PyMODINIT_FUNC PyInit_cl_setup(void) {
          return PyModule_Create(&module_def);
        }

        at::Tensor triple(const at::Tensor& x) {
          return at::mul(x, 3);
        }

        TORCH_LIBRARY(cl_setup, m) {
          m.def("triple(Tensor x) -> Tensor");
        }

        TORCH_LIBRARY_IMPL(cl_setup, CPU, m) {
          m.impl("triple", triple);
        }
        """
    )
    library = compile_library(source, progress=None)
    loaded.append(library)
    assert library.build.header_set == "core"  # Python.h and mul.h parsed on top of it
    assert torch.ops.cl_setup.triple(torch.ones(2)).tolist() == [3.0, 3.0]


def test_every_block_form_takes_any_name_for_its_library(loaded):
    """vLLM and others name the block's library ``ops``, ``lib``, ``registry``: every macro,
    classic and stable, passes the name the block uses to its body."""
    source = textwrap.dedent(
        """\
        #include <torch/library.h>
        #include <ATen/core/Tensor.h>
        #include <torch/csrc/stable/library.h>
        #include <torch/csrc/stable/ops.h>
        #include <torch/csrc/stable/tensor.h>

        at::Tensor twice(const at::Tensor& x) { return x.mul(2); }
        at::Tensor thrice(const at::Tensor& x) { return x.mul(3); }
        torch::stable::Tensor fill(const torch::stable::Tensor& x) {
          return torch::stable::fill_(torch::stable::empty_like(x), 4.0);
        }

        TORCH_LIBRARY(cl_names, ops) { ops.def("twice(Tensor x) -> Tensor"); }
        TORCH_LIBRARY_FRAGMENT(cl_names, more_ops) { more_ops.def("thrice(Tensor x) -> Tensor"); }
        TORCH_LIBRARY_IMPL(cl_names, CPU, cpu_registry) {
          cpu_registry.impl("twice", twice);
          cpu_registry.impl("thrice", thrice);
        }
        STABLE_TORCH_LIBRARY(cl_names_stable, lib) { lib.def("fill(Tensor x) -> Tensor"); }
        STABLE_TORCH_LIBRARY_FRAGMENT(cl_names_stable, frag) {
          frag.def("fill_too(Tensor x) -> Tensor");
        }
        STABLE_TORCH_LIBRARY_IMPL(cl_names_stable, CPU, impls) {
          impls.impl("fill", TORCH_BOX(&fill));
          impls.impl("fill_too", TORCH_BOX(&fill));
        }
        """
    )
    library = compile_library(source, progress=None)
    loaded.append(library)
    one = torch.ones(1)
    assert torch.ops.cl_names.twice(one).item() == 2.0
    assert torch.ops.cl_names.thrice(one).item() == 3.0
    assert torch.ops.cl_names_stable.fill(one).item() == 4.0
    assert torch.ops.cl_names_stable.fill_too(one).item() == 4.0
