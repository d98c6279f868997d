"""Every dispatcher shim in opmagic/_torch/dispatcher.py, one test each.

When a torch release changes a private API, the failing test names the shim to update.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from opmagic._torch import dispatcher


def test_keyset_helpers():
    full = dispatcher.full_keyset_raw()
    names = dispatcher.keyset_names(full)
    assert {"CPU", "AutogradCPU", "Python", "PythonDispatcher"} <= set(names)
    assert dispatcher.num_backends() >= 16
    assert dispatcher.keyset_names(0) == []
    assert dispatcher.single_key_raw("Python") and dispatcher.single_key_raw("NoSuchKey") is None
    assert dispatcher.full_after_raw("Python") & dispatcher.single_key_raw("BackendSelect")
    assert not dispatcher.full_after_raw("Python") & dispatcher.single_key_raw("Python")


def test_redispatch_masks():
    backend_bits = (1 << dispatcher.num_backends()) - 1
    autograd_cpu = dispatcher.single_key_raw("AutogradCPU") & ~backend_bits
    ad_inplace_or_view = dispatcher.single_key_raw("ADInplaceOrView")
    assert not dispatcher.after_autograd_raw() & autograd_cpu
    assert dispatcher.after_autograd_raw() & ad_inplace_or_view
    assert not dispatcher.after_ad_inplace_or_view_raw() & ad_inplace_or_view


def test_alias_and_device_helpers():
    assert dispatcher.is_alias_key("CompositeImplicitAutograd")
    assert not dispatcher.is_alias_key("CPU")
    assert dispatcher.dispatch_key_for_device("cpu") == "CPU"
    assert dispatcher.dispatch_key_for_device("meta") == "Meta"


def test_thread_local_state():
    python = dispatcher.single_key_raw("Python")
    assert not dispatcher.tls_included_raw() & python
    with FakeTensorMode() as mode:
        assert dispatcher.tls_included_raw() & python
        assert dispatcher.dispatch_modes() == [mode]
        assert dispatcher.is_fake_mode(mode)
        assert dispatcher.is_fake_tensor_type(type(mode.from_tensor(torch.randn(1))))
    assert dispatcher.dispatch_modes() == []
    autocast_cpu = dispatcher.single_key_raw("AutocastCPU")
    assert dispatcher.tls_excluded_raw() & autocast_cpu
    with torch.autocast("cpu"):
        assert not dispatcher.tls_excluded_raw() & autocast_cpu
    assert dispatcher.autograd_fallback_mode() in ("nothing", "warn", "error")
    assert not dispatcher.is_fake_tensor_type(torch.Tensor) and issubclass(FakeTensor, torch.Tensor)


def test_torch_function_disabled():
    from torch.overrides import TorchFunctionMode

    seen = []

    class Watching(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    x = torch.randn(2)
    with Watching():
        with dispatcher.torch_function_disabled():
            _ = x.dtype, x.shape
        assert seen == []
        _ = x.dtype
    assert seen  # the mode sees attribute reads outside the guard


def test_tensor_keys_and_functorch():
    x = torch.randn(2)
    assert "AutogradCPU" in dispatcher.keyset_names(dispatcher.tensor_keyset_raw(x))
    assert dispatcher.functorch_layers() == [] and dispatcher.batched_level(x) is None

    def inside(batched):
        assert dispatcher.functorch_layers() == [("Vmap", 1)]
        assert dispatcher.batched_level(batched) == 1
        assert dispatcher.unwrap_functorch(batched).shape == (3, 2)
        return batched

    torch.vmap(inside)(torch.randn(3, 2))

    def graded(t):
        assert dispatcher.is_grad_wrapper(t)
        return t.sum()

    torch.func.grad(graded)(torch.randn(2))
    functional = torch._to_functional_tensor(x)
    assert dispatcher.is_functional_tensor(functional) and not dispatcher.is_functional_tensor(x)
    assert dispatcher.unwrap_functional(functional) is not functional


def test_operator_queries():
    assert "aten::add.Tensor" in dispatcher.all_op_names()
    assert "CPU: registered at" in dispatcher.dump_table("aten::add.Tensor")
    assert "schema: aten::add.Tensor" in dispatcher.dump_registrations("aten::add.Tensor")
    assert "aten::add.Tensor" in dispatcher.registrations_for_key("CPU")
    assert dispatcher.registrations_for_key("QuantizedHIP") == []  # torch cannot parse that name
    assert str(dispatcher.find_schema("aten::add", "Tensor")).startswith("aten::add.Tensor(")
    assert dispatcher.find_schema("aten::add", "nope") is None
    assert dispatcher.has_operator("aten::add.Tensor") and dispatcher.has_operator("aten::sin")
    assert not dispatcher.has_operator("aten::add") and not dispatcher.has_operator("aten::add.int")
    assert set(dispatcher.overload_names("aten::add")) == {"Tensor", "Scalar", "out", "Scalar_out"}
    assert list(dispatcher.overload_names("aten::len")) == []  # TorchScript's, not an operator
    x = torch.randn(1)
    assert dispatcher.select_overload("aten::add", (x, x), {}) == "Tensor"


def test_key_names_and_operator_objects():
    names = dispatcher.dispatch_key_names()
    assert {"CPU", "AutogradCPU", "CompositeImplicitAutograd", "Dense"} <= set(names)
    assert dispatcher.operator_parts(torch.ops.aten.add.Tensor) == ("aten", "add", "Tensor")
    assert dispatcher.operator_parts(torch.ops.aten.sin.default) == ("aten", "sin", "")
    assert dispatcher.operator_parts(torch.ops.aten.add) == ("aten", "add", None)
    assert dispatcher.operator_parts("aten::add") is None
    assert dispatcher.operator_parts(torch.add) is None


def test_refresh_operators_forgets_stale_packets_on_every_torch():
    lib = torch.library.Library("shim_refresh", "FRAGMENT")
    try:
        lib.define("op(Tensor x) -> Tensor")
        packet = torch.ops.shim_refresh.op
        assert "op" in vars(torch.ops.shim_refresh)
        # torch 2.11 has no torch.library._clear_torch_ops_cache: opmagic must not need it
        dispatcher.refresh_operators(["shim_refresh::op", "shim_refresh::never.made", "nons::x"])
        assert "op" not in vars(torch.ops.shim_refresh)
        assert torch.ops.shim_refresh.op is not packet  # made again on next use
    finally:
        lib._destroy()


def test_hold_operators_keeps_an_entry_alive_until_released():
    library = torch.library.Library("shim_hold", "DEF")
    library.define("held(Tensor x) -> Tensor")
    release = dispatcher.hold_operators(["shim_hold::held"])
    library._destroy()  # the definition goes; the held entry stays, with no schema
    assert "shim_hold::held" in dispatcher.all_op_names()
    assert dispatcher.find_schema("shim_hold::held", "") is None
    assert list(dispatcher.overload_names("shim_hold::held")) == [""]
    release()
    assert "shim_hold::held" not in dispatcher.all_op_names()


def test_call_argument_checks():
    x = torch.randn(2)
    schema = torch.ops.aten.mul.Scalar._schema
    dispatcher.check_call_arguments(schema, (x, 2.0), {})
    try:
        dispatcher.check_call_arguments(schema, (x, "abc"), {})
    except RuntimeError as exc:
        assert "Expected a value of type 'number' for argument 'other'" in str(exc)
    else:
        raise AssertionError("a str for a Scalar must be refused")
    assert dispatcher.allows_numbers_as_tensors("aten::mul")
    assert not dispatcher.allows_numbers_as_tensors("aten::sin")
    assert not dispatcher.allows_numbers_as_tensors("myops::mul")
    with torch.inference_mode(), FakeTensorMode():
        scalar = dispatcher.new_scalar_tensor()
    assert type(scalar) is torch.Tensor and scalar.device.type == "cpu" and scalar.is_inference()


def test_subclass_and_mode_queries():
    from torch._subclasses.functional_tensor import FunctionalTensor, dispatch_functionalize
    from torch.testing._internal.two_tensor import TwoTensor

    two = TwoTensor(torch.randn(2), torch.randn(2))
    assert dispatcher.is_traceable_wrapper_subclass(two)
    assert dispatcher.inner_tensor_names(two) == ["a", "b"]
    assert not dispatcher.has_own_storage(two) and dispatcher.has_own_storage(torch.randn(2))
    real = torch.randn(2)
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(real)
        assert dispatcher.fake_mode_of(fake) is mode
        assert not dispatcher.fake_mode_refuses(mode, fake)
        assert dispatcher.fake_mode_refuses(mode, real)
        assert dispatcher.fake_tensor_passes_on(TwoTensor(fake, fake.clone()))
        assert not dispatcher.fake_tensor_passes_on(fake)
        assert not dispatcher.fake_tensor_passes_on(real)  # refused, not passed on
    assert not dispatcher.fake_mode_refuses(FakeTensorMode(allow_non_fake_inputs=True), real)

    def body(t):
        mode = dispatcher.dispatch_modes()[-1]
        assert dispatcher.is_functional_tensor_mode(mode)
        assert dispatcher.is_functional_tensor_subclass(type(t))
        assert dispatcher.is_functional_tensor(dispatcher.functional_tensor_elem(t))
        op = torch.ops.aten.sin.default
        assert not dispatcher.functional_mode_can_decompose(mode, op, (t,), {})
        return t

    dispatch_functionalize(body)(torch.randn(2))
    assert torch.ops.aten.is_contiguous.default in dispatcher.functional_tensor_metadata_ops()
    assert issubclass(FunctionalTensor, torch.Tensor)


def test_functionalization_and_nested_queries():
    lib = torch.library.Library("shim_mutable", "FRAGMENT")
    try:
        lib.define("bump(Tensor(a!) x) -> ()")
        assert dispatcher.can_auto_functionalize(torch.ops.shim_mutable.bump.default)
        assert not dispatcher.can_auto_functionalize(torch.ops.aten.sin.default)
        assert not dispatcher.has_effects(torch.ops.shim_mutable.bump.default)
    finally:
        lib._destroy()
    jagged = torch.nested.nested_tensor([torch.randn(2), torch.randn(3)], layout=torch.jagged)
    assert dispatcher.jagged_rule(torch.ops.aten.sin.default, (jagged,), {}) is not None
    assert dispatcher.jagged_rule(torch.ops.aten.mm.default, (jagged, jagged), {}) is None
    assert dispatcher.vmap_fallback_enabled()


def test_library_autocast_dtype():
    lib = torch.library.Library("shim_autocast", "FRAGMENT")
    try:
        lib.define("cast(Tensor x) -> Tensor")
        op = torch.ops.shim_autocast.cast.default
        assert dispatcher.library_autocast_dtype(op, "AutocastCPU") is None
        torch.library.register_autocast(op, "cpu", torch.float16, lib=lib)
        assert dispatcher.library_autocast_dtype(op, "AutocastCPU") is torch.float16
        assert dispatcher.library_autocast_dtype(op, "AutocastCUDA") is None
    finally:
        lib._destroy()


def test_python_kernel():
    """torch/_meta_registrations.py puts its Python Meta kernels on the OpOverload too."""
    meta_mm = dispatcher.python_kernel(torch.ops.aten.mm.default, "Meta")
    assert meta_mm is not None and meta_mm.__name__ == "meta_mm"
    assert dispatcher.python_kernel(torch.ops.aten.mm.default, "NoSuchKey") is None
    assert dispatcher.python_kernel(torch.ops.aten.mm.default, "XLA") is None


def test_snapshot_shims():
    names = dispatcher.all_op_names()[:3]
    assert dispatcher.dump_all_registrations(names) == [
        dispatcher.dump_registrations(name) for name in names
    ]
    assert dispatcher.has_backend_fallback("Python") and not dispatcher.has_backend_fallback("CPU")
    assert dispatcher.has_backend_fallback("AutogradMTIA")  # a key torch's parser misses
    assert dispatcher.alias_includes("CompositeExplicitAutograd", "CPU")
    assert dispatcher.alias_includes("Autograd", "AutogradMTIA")
    assert not dispatcher.alias_includes("Autograd", "CPU")
    assert dispatcher.backend_keys_of_autograd("AutogradCPU") == {"CPU"}
    assert dispatcher.backend_keys_of_autograd("CPU") == set()
    assert {"QuantizedCPU", "FPGA"} <= dispatcher.autogradother_backends()


def test_native_override_routes():
    registry = dispatcher.native_registry_file()
    assert registry is not None and registry.endswith("registry.py")
    for (
        op_symbol,
        key,
        dsl,
        node_id,
        active,
        condition,
        impl,
    ) in dispatcher.native_override_routes():
        assert op_symbol and key and dsl and node_id
        assert isinstance(active, bool) and callable(condition) and callable(impl)
