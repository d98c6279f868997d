"""dispatch_table against the dispatcher's own per-key queries and registrations."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.library import Library

from opmagic import DispatchTable, OverloadTables, dispatch_table, resolve, runtime_keys
from opmagic.dispatch.table import parse_registrations

C = torch._C


@pytest.fixture
def library():
    """A scratch namespace whose operators disappear after the test."""
    lib = Library("opmagic_test_table", "FRAGMENT")
    yield lib
    lib._destroy()


@pytest.mark.parametrize(
    "op",
    ["aten::add.Tensor", "aten::empty.memory_format", "aten::native_layer_norm", "aten::view"],
)
def test_every_entry_agrees_with_the_dispatchers_per_key_answers(op):
    table = dispatch_table(op)
    name = table.op
    for entry in table.entries:
        key = C._parse_dispatch_key(entry.key)
        if key is None:  # torch cannot parse some per-backend names (e.g. QuantizedHIP)
            continue
        has_kernel = C._dispatch_has_computed_kernel_for_dispatch_key(name, entry.key)
        assert has_kernel == (entry.kind != "missing"), entry
        if has_kernel:
            if entry.kind != "kernel":  # torch's getters below answer for direct kernels only
                continue
            assert not C._dispatch_kernel_for_dispatch_key_is_fallthrough(name, key), entry
            kernel = C._dispatch_get_computed_kernel_for_dispatch_key(name, key)
            assert repr(kernel) == f"SafeKernelFunction(debug='{entry.site}')", entry


def test_add_tensor_kinds_aliases_and_sources():
    table = dispatch_table("aten::add.Tensor")
    assert table.schema.startswith("aten::add.Tensor(Tensor self, Tensor other")
    assert [e.key for e in table.entries[:-1]] == [k.name for k in runtime_keys()]
    assert table.entries[-1].key == "Undefined"
    assert table["CPU"].kind == "kernel" and "RegisterCPU" in table["CPU"].source
    if torch._C._dispatch_has_kernel_for_dispatch_key("aten::add.Tensor", "CUDA"):  # CUDA build
        assert table["CUDA"].kind == "kernel" and "RegisterCUDA" in table["CUDA"].source
    else:
        assert (table["CUDA"].kind, table["CUDA"].alias) == (
            "alias",
            "CompositeExplicitAutogradNonFunctional",
        )
    assert (table["AutogradCPU"].kind, table["AutogradCPU"].alias) == ("autograd", "Autograd")
    assert table["AutocastCPU"].kind == "fallthrough" and table["AutocastCPU"].is_fallback
    assert table["Python"].kind == "fallback"
    assert table["TESTING_ONLY_GenericMode"].kind == "missing"
    registered = {(r.key, r.is_alias) for r in table.registrations if r.active}
    assert ("Autograd", True) in registered and ("CPU", False) in registered


def test_composite_implicit_fills_backends_and_autograd(library):
    library.define("decomposed(Tensor x) -> Tensor")
    library.impl("decomposed", lambda x: x * 2, "CompositeImplicitAutograd")
    table = dispatch_table("opmagic_test_table::decomposed")
    for key in ("CPU", "Meta", "AutogradCPU", "Undefined"):
        assert (table[key].kind, table[key].alias) == ("alias", "CompositeImplicitAutograd"), key
    assert "test_table.py" in table["CPU"].source


def test_direct_kernel_wins_over_alias_and_autograd_other_is_ambiguous(library):
    library.define("both(Tensor x) -> Tensor")
    library.impl("both", lambda x: x * 2, "CompositeImplicitAutograd")
    library.impl("both", lambda x: x * 3, "CPU")
    library.impl("both", lambda x: x * 4, "FPGA")  # FPGA's autograd key is AutogradOther
    table = dispatch_table("opmagic_test_table::both")
    assert table["CPU"].kind == "kernel"
    assert table["AutogradOther"].kind == "ambiguous"
    assert (table["AutogradCUDA"].kind, table["AutogradCUDA"].alias) == (
        "alias",
        "CompositeImplicitAutograd",
    )
    inactive = [r for r in table.registrations if not r.active]
    assert inactive == []


def test_re_registration_shows_the_inactive_kernel(library):
    library.define("again(Tensor x) -> Tensor")
    library.impl("again", lambda x: x, "CPU")
    second = Library("opmagic_test_table", "IMPL")
    try:
        with warnings.catch_warnings():  # torch warns about the override (once per process)
            warnings.simplefilter("ignore")
            second.impl("again", lambda x: x + 1, "CPU")
        table = dispatch_table("opmagic_test_table::again")
        states = [r.active for r in table.registrations if r.key == "CPU"]
        assert sorted(states) == [False, True]
    finally:
        second._destroy()


def test_custom_op_entries_name_the_users_functions():
    @torch.library.custom_op("opmagic_test_table::scaled", mutates_args=())
    def scaled(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @scaled.register_kernel("cpu")
    def scaled_cpu(x):
        return x * 2

    @scaled.register_fake
    def scaled_fake(x):
        return torch.empty_like(x)

    def backward(ctx, grad):
        return grad * 2

    scaled.register_autograd(backward)
    try:
        table = dispatch_table(scaled)
        assert table["CPU"].kind == "kernel" and "scaled_cpu" in table["CPU"].source
        assert "test_table.py" in table["CPU"].source
        assert table["CUDA"].alias == "CompositeExplicitAutograd"
        assert "custom_op impl" in table["CUDA"].source and "scaled " in table["CUDA"].source
        assert "scaled_fake" in table["Meta"].source
        assert "backward" in table["AutogradCPU"].source
    finally:
        scaled._lib._destroy()


def test_a_custom_op_without_a_fake_impl_has_a_meta_stub():
    """custom_op always registers a Meta kernel; without a fake impl it only raises."""

    @torch.library.custom_op("opmagic_test_table::unfaked", mutates_args=())
    def unfaked(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @torch.library.custom_op("opmagic_test_table::returns_nothing", mutates_args=["x"])
    def returns_nothing(x: torch.Tensor) -> None:
        x.mul_(2)

    try:
        meta = dispatch_table(unfaked)["Meta"]
        assert (meta.kind, meta.kind_label) == ("stub", "stub: raises (no fake impl)")
        assert meta.source == "no fake impl: register one with register_fake"
        assert meta.has_kernel  # it runs, and raises: resolve puts it on the path and fails
        assert dispatch_table(unfaked).frame().set_index("key").loc["Meta", "kind"] == "stub"
        assert "stub: raises (no fake impl)" in str(dispatch_table(unfaked))
        assert "NotImplementedError" in str(resolve(unfaked, torch.randn(2, device="meta")).error)
        generated = dispatch_table(returns_nothing)["Meta"]  # custom_op makes a fake impl
        assert generated.kind == "kernel" and "generated" in generated.source

        @unfaked.register_fake
        def _(x):
            return torch.empty_like(x)

        assert dispatch_table(unfaked)["Meta"].kind == "kernel"
    finally:
        unfaked._lib._destroy()
        returns_nothing._lib._destroy()


def test_python_meta_kernels_are_named_by_their_functions():
    """torch/_meta_registrations.py registers every Python Meta kernel through one Library
    line; the entry names the function instead."""
    meta = dispatch_table("aten::mm")["Meta"]
    assert "_meta_registrations.py" in meta.site
    assert meta.source.startswith("meta_mm (torch/_meta_registrations.py:")
    assert dispatch_table("aten::mm")["CPU"].impl is None  # a C++ kernel keeps its site


def test_packet_with_default_gives_its_table_and_without_gives_all_overloads():
    assert isinstance(dispatch_table(torch.ops.aten.sin), DispatchTable)
    assert dispatch_table("aten::sin").op == "aten::sin"
    tables = dispatch_table("aten::add")
    assert isinstance(tables, OverloadTables)
    assert {t.op for t in tables} >= {"aten::add.Tensor", "aten::add.Scalar", "aten::add.out"}
    assert tables["Tensor"].op == "aten::add.Tensor"
    every = dispatch_table("aten::sum", all_overloads=True)
    assert every["default"].op == "aten::sum" and len(every) > 1
    with pytest.raises(KeyError, match="no overload 'nope'"):
        tables["nope"]


def test_frame_has_a_row_per_key_with_explanations():
    frame = dispatch_table("aten::mm").frame()
    assert list(frame.columns) == [
        "key",
        "category",
        "kind",
        "alias",
        "source",
        "site",
        "explanation",
    ]
    assert len(frame) == len(runtime_keys()) + 1
    assert frame.set_index("key").loc["AutogradCPU", "category"] == "autograd"


def test_text_and_html_forms():
    table = dispatch_table("aten::add.Tensor")
    text = str(table)
    assert text.splitlines()[0] == table.schema
    assert "AutogradCPU, AutogradCUDA + 16 more keys" in text and "via Autograd" in text
    assert "registrations as made" in text
    html = table._repr_html_()
    assert html.index("<svg") < html.index("<details>") < html.index('<table class="wraps">')
    assert "via CompositeExplicitAutogradNonFunctional" in html
    bundle = table._repr_mimebundle_()
    assert bundle["text/plain"] == text and "<svg" in bundle["image/svg+xml"]


def test_unknown_key_lookup_explains_alias_keys():
    with pytest.raises(KeyError, match="alias keys such as 'Autograd'"):
        dispatch_table("aten::mm")["Autograd"]


def test_registration_lines_are_read_part_by_part() -> None:
    """``_dispatch_dump``'s lines: alias and inactive markers, a signature, kernel flags."""
    dump = (
        "name: ns::f\nschema: ns::f(Tensor x) -> Tensor\ndebug: registered at /a/b.py:3\n"
        "alias analysis kind: FROM_SCHEMA\n"
        "CPU: registered at /a/b.cpp:12 :: (Tensor _0) -> Tensor _0 [ boxed unboxed ]\n"
        "Autograd[alias] (inactive): registered at /a/c.py:7 :: (Tensor _0) -> Tensor _0\n"
        "Meta: registered at /a/d.py:9 [ boxed ]\n"
        "not a registration line\n"
    )
    assert [
        (r.key, r.is_alias, r.site, r.active, r.signature) for r in parse_registrations(dump)
    ] == [
        ("CPU", False, "registered at /a/b.cpp:12", True, "(Tensor _0) -> Tensor _0"),
        ("Autograd", True, "registered at /a/c.py:7", False, "(Tensor _0) -> Tensor _0"),
        ("Meta", False, "registered at /a/d.py:9", True, None),
    ]
