"""Registering a library in place of the one it replaces, and the errors torch raises there,
with the real compiler and the real dispatcher."""

from __future__ import annotations

import textwrap

import pytest
import torch

from opmagic._torch import dispatcher
from opmagic.dispatch.sites import label_site
from opmagic.errors import RegistrationError
from opmagic.native import compile_library

from .sources import MINIMAL_INCLUDES, op_source

pytestmark = pytest.mark.slow  # compiles C++


def _schema(name: str) -> str | None:
    """The schema the dispatcher has for an operator's default overload, if any."""
    schema = dispatcher.find_schema(name, "")
    return None if schema is None else str(schema)


def test_close_unregisters_everything(build_cache):
    library = compile_library(op_source("cl_close"), progress=None)
    packet = torch.ops.cl_close.scale  # cached by torch.ops until opmagic drops it
    assert packet(torch.ones(1)).item() == 2.0
    library.close()
    library.close()  # idempotent
    assert _schema("cl_close::scale") is None
    assert not any(n.startswith("cl_close::") for n in dispatcher.all_op_names())
    assert not hasattr(torch.ops.cl_close, "scale")
    assert library.tables() == [] and "unregistered" in str(library)


def test_replacing_swaps_schema_and_kernel(loaded):
    old = compile_library(op_source("cl_swap"), progress=None)
    new = compile_library(
        op_source(
            "cl_swap",
            schema="scale(Tensor x, int k) -> Tensor",
            kernel="at::Tensor scale(const at::Tensor& x, int64_t k) { return x.mul(k); }",
        ),
        replace=old,
        progress=None,
    )
    loaded.append(new)
    assert old.closed and not new.closed
    assert _schema("cl_swap::scale") == "cl_swap::scale(Tensor x, int k) -> Tensor"
    assert torch.ops.cl_swap.scale(torch.ones(1), 5).item() == 5.0
    old.close()  # closing a replaced library does not touch its successor
    assert torch.ops.cl_swap.scale(torch.ones(1), 3).item() == 3.0


def test_handles_held_by_other_libraries_survive_a_replacement(loaded):
    """A ``static auto op = findSchemaOrThrow(...)`` in one library points into the
    dispatcher's entry of an operator another library defines: replacing that library must
    keep the entry alive, so the handle calls the new kernel instead of freed memory."""
    base = compile_library(
        op_source("cl_base", kernel="at::Tensor scale(const at::Tensor& x) { return x.add(1); }"),
        progress=None,
    )
    caller = compile_library(
        MINIMAL_INCLUDES
        + textwrap.dedent(
            """
            #include <ATen/core/dispatch/Dispatcher.h>
            at::Tensor twice_base(const at::Tensor& x) {
              static auto op = c10::Dispatcher::singleton()
                  .findSchemaOrThrow("cl_base::scale", "")
                  .typed<at::Tensor(const at::Tensor&)>();
              return op.call(op.call(x));
            }
            TORCH_LIBRARY(cl_caller, m) {
              m.def("twice_base(Tensor x) -> Tensor");
            }
            TORCH_LIBRARY_IMPL(cl_caller, CPU, m) {
              m.impl("twice_base", twice_base);
            }
            """
        ),
        progress=None,
    )
    loaded.append(caller)
    assert torch.ops.cl_caller.twice_base(torch.zeros(1)).item() == 2.0
    base = compile_library(
        op_source("cl_base", kernel="at::Tensor scale(const at::Tensor& x) { return x.add(10); }"),
        replace=base,
        progress=None,
    )
    loaded.append(base)
    assert torch.ops.cl_caller.twice_base(torch.zeros(1)).item() == 20.0


def test_a_kernel_for_an_existing_operator_is_an_override_that_close_undoes(loaded):
    source = MINIMAL_INCLUDES + textwrap.dedent(
        """
        at::Tensor fake_sinc(const at::Tensor& x) { return x.mul(-2); }
        TORCH_LIBRARY_IMPL(aten, CPU, m) {
          m.impl("sinc", fake_sinc);
        }
        """
    )
    packet = torch.ops.aten.sinc  # torch keys its tables by packets: it must stay the same
    library = compile_library(source, name="cl_override", progress=None)
    try:
        assert library.operators == ()
        [kernel] = library.kernels
        assert (kernel.op, kernel.key, kernel.line) == ("aten::sinc", "CPU", 5)
        assert kernel.overrides is not None and "RegisterCPU" in kernel.overrides
        assert "(overrides aten/src/ATen/RegisterCPU" in " ".join(str(library).split())
        assert torch.sinc(torch.ones(1)).item() == -2.0
    finally:
        library.close()
    assert torch.sinc(torch.zeros(1)).item() == 1.0
    assert torch.ops.aten.sinc is packet


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(
            '  m.def("scale(Tensor x) -> Tensor");\n  m.def("scale(Tensor x) -> Tensor");',
            "with the same name and overload name multiple times",
            id="duplicate-op",
        ),
        pytest.param(
            '  m.def("scale(Tensor x) -> Tensorr");',
            "unknown type specifier",
            id="bad-schema",
        ),
    ],
)
def test_a_registration_error_names_the_block_and_keeps_the_previous_version(
    loaded, body, expected
):
    good = compile_library(op_source("err_reg"), label="cell [2]", first_line=2, progress=None)
    loaded.append(good)
    source = op_source("err_reg").replace('  m.def("scale(Tensor x) -> Tensor");', body)
    with pytest.raises(RegistrationError) as caught:
        compile_library(source, replace=good, label="cell [2]", first_line=2, progress=None)
    message = str(caught.value)
    assert message.startswith("cell [2], line 5: ")  # the TORCH_LIBRARY block
    assert expected in message
    assert "The previous version (cell [2]) is registered again." in message
    assert caught.value.line == 4
    assert not good.closed and torch.ops.err_reg.scale(torch.ones(1)).item() == 2.0


def test_a_second_library_defining_a_namespace_is_refused_with_both_sites(loaded):
    first = compile_library(op_source("err_twice"), label="cell [1]", first_line=2, progress=None)
    loaded.append(first)
    other = op_source("err_twice", kernel="at::Tensor scale(const at::Tensor& x) { return x; }")
    with pytest.raises(RegistrationError) as caught:
        compile_library(other, label="cell [5]", first_line=2, progress=None)
    message = str(caught.value)
    assert "Only a single TORCH_LIBRARY can be used to register the namespace err_twice" in message
    assert "registered at cell [1], line 5" in message and "cell [5], line 5" in message
    assert torch.ops.err_twice.scale(torch.ones(1)).item() == 2.0


def test_a_source_without_registration_blocks_is_refused(loaded):
    with pytest.raises(RegistrationError, match="has no registration block"):
        compile_library(MINIMAL_INCLUDES + "int answer() { return 42; }\n", progress=None)


def test_registration_sites_are_named_while_their_library_is_registered(loaded):
    first = compile_library(op_source("reg_sites"), label="cell [1]", first_line=2, progress=None)
    first_site = f"registered at {first.source_file}:10"
    assert label_site(first_site) == "cell [1], line 11"

    # an unchanged re-run is the same build (the same file): the newest label names it
    again = compile_library(
        op_source("reg_sites"), replace=first, label="cell [2]", first_line=2, progress=None
    )
    assert again.source_file == first.source_file and label_site(first_site) == "cell [2], line 11"

    edited = compile_library(
        op_source("reg_sites", kernel="at::Tensor scale(const at::Tensor& x) { return x; }"),
        replace=again,
        label="cell [3]",
        first_line=2,
        progress=None,
    )
    loaded.append(edited)
    edited_site = f"registered at {edited.source_file}:10"
    assert label_site(edited_site) == "cell [3], line 11"
    assert "cell [" not in label_site(first_site)  # the replaced version's entry went with it

    edited.close()
    assert "cell [" not in label_site(edited_site)


def test_a_source_two_registered_libraries_share_is_named_until_both_are_closed(loaded):
    source = MINIMAL_INCLUDES + "TORCH_LIBRARY_FRAGMENT(reg_shared, m) {}\n"
    one = compile_library(source, label="cell [1]", progress=None)
    two = compile_library(source, label="cell [2]", progress=None)  # the same build and file
    loaded += [one, two]
    site = f"registered at {one.source_file}:3"
    assert two.source_file == one.source_file and label_site(site) == "cell [2], line 3"
    two.close()
    assert label_site(site) == "cell [1], line 3"
    one.close()
    assert "cell [" not in label_site(site)
