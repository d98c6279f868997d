"""Every private-torch shim in opmagic/dispatch/_torch.py, one test each.

When a torch release changes a private API, the failing test names the shim to update.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from opmagic.dispatch import _torch


def test_keyset_helpers():
    full = _torch.full_keyset_raw()
    names = _torch.keyset_names(full)
    assert {"CPU", "AutogradCPU", "Python", "PythonDispatcher"} <= set(names)
    assert _torch.num_backends() >= 16
    assert _torch.keyset_names(0) == []
    assert _torch.single_key_raw("Python") and _torch.single_key_raw("NoSuchKey") is None
    assert _torch.full_after_raw("Python") & _torch.single_key_raw("BackendSelect")
    assert not _torch.full_after_raw("Python") & _torch.single_key_raw("Python")


def test_redispatch_masks():
    autograd_cpu = _torch.single_key_raw("AutogradCPU") & ~((1 << _torch.num_backends()) - 1)
    assert not _torch.after_autograd_raw() & autograd_cpu
    assert _torch.after_autograd_raw() & _torch.single_key_raw("ADInplaceOrView")
    assert not _torch.after_ad_inplace_or_view_raw() & _torch.single_key_raw("ADInplaceOrView")


def test_alias_and_device_helpers():
    assert _torch.is_alias_key("CompositeImplicitAutograd")
    assert not _torch.is_alias_key("CPU")
    assert _torch.dispatch_key_for_device("cpu") == "CPU"
    assert _torch.dispatch_key_for_device("meta") == "Meta"


def test_thread_local_state():
    python = _torch.single_key_raw("Python")
    assert not _torch.tls_included_raw() & python
    with FakeTensorMode() as mode:
        assert _torch.tls_included_raw() & python
        assert _torch.dispatch_modes() == [mode]
        assert _torch.is_fake_mode(mode)
        assert _torch.is_fake_tensor_type(type(mode.from_tensor(torch.randn(1))))
    assert _torch.dispatch_modes() == []
    autocast_cpu = _torch.single_key_raw("AutocastCPU")
    assert _torch.tls_excluded_raw() & autocast_cpu
    with torch.autocast("cpu"):
        assert not _torch.tls_excluded_raw() & autocast_cpu
    assert _torch.autograd_fallback_mode() in ("nothing", "warn", "error")
    assert not _torch.is_fake_tensor_type(torch.Tensor) and issubclass(FakeTensor, torch.Tensor)


def test_tensor_keys_and_functorch():
    x = torch.randn(2)
    assert "AutogradCPU" in _torch.keyset_names(_torch.tensor_keyset_raw(x))
    assert _torch.functorch_layers() == [] and _torch.batched_level(x) is None

    def inside(batched):
        assert _torch.functorch_layers() == [("Vmap", 1)]
        assert _torch.batched_level(batched) == 1
        assert _torch.unwrap_functorch(batched).shape == (3, 2)
        return batched

    torch.vmap(inside)(torch.randn(3, 2))

    def graded(t):
        assert _torch.is_grad_wrapper(t)
        return t.sum()

    torch.func.grad(graded)(torch.randn(2))
    functional = torch._to_functional_tensor(x)
    assert _torch.is_functional_tensor(functional) and not _torch.is_functional_tensor(x)
    assert _torch.unwrap_functional(functional) is not functional


def test_operator_queries():
    assert "aten::add.Tensor" in _torch.all_op_names()
    assert "CPU: registered at" in _torch.dump_table("aten::add.Tensor")
    assert "schema: aten::add.Tensor" in _torch.dump_registrations("aten::add.Tensor")
    assert "aten::add.Tensor" in _torch.registrations_for_key("CPU")
    assert _torch.registrations_for_key("QuantizedHIP") == []  # torch cannot parse that name
    assert str(_torch.find_schema("aten::add", "Tensor")).startswith("aten::add.Tensor(")
    assert _torch.find_schema("aten::add", "nope") is None
    x = torch.randn(1)
    assert _torch.select_overload("aten::add", (x, x), {}) == "Tensor"


def test_python_kernels_and_fake_impls_of_library_ops():
    lib = torch.library.Library("opmagic_test_shim", "FRAGMENT")
    try:
        lib.define("g(Tensor x) -> Tensor")
        op = torch.ops.opmagic_test_shim.g.default
        assert _torch.py_kernel_keys(op) == []
        op.py_impl(torch._C.DispatchKey.AutogradCPU)(lambda x: x)
        assert _torch.py_kernel_keys(op) == ["AutogradCPU"]

        def g_fake(x):
            return torch.empty_like(x)

        assert _torch.registered_fake_impl("opmagic_test_shim::g") is None
        torch.library.register_fake("opmagic_test_shim::g", g_fake, lib=lib)
        assert _torch.registered_fake_impl("opmagic_test_shim::g") is g_fake
    finally:
        lib._destroy()


def test_custom_op_introspection():
    @torch.library.custom_op("opmagic_test_shim::f", mutates_args=())
    def f(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @f.register_kernel("cpu")
    def f_cpu(x):
        return x.clone()

    @f.register_fake
    def f_fake(x):
        return torch.empty_like(x)

    def f_backward(ctx, grad):
        return grad

    f.register_autograd(f_backward)
    try:
        opdef = _torch.custom_op_def("opmagic_test_shim::f")
        parts = _torch.custom_op_parts(opdef)
        assert parts["impl"] is f._init_fn
        assert _torch.unwrap_registered_function(parts["device_kernels"]["cpu"]) is f_cpu
        assert parts["fake"] is f_fake and parts["backward"] is f_backward
        assert _torch.registered_torch_dispatch_rule("opmagic_test_shim::f", FakeTensorMode) is None
        assert not _torch.custom_op_can_fake_trivially(f._opoverload)
        assert _torch.custom_op_def("opmagic_test_shim::nothing") is None
    finally:
        f._lib._destroy()


def test_refresh_operators_without_torchs_cache_clearing_function(monkeypatch):
    lib = torch.library.Library("shim_refresh", "FRAGMENT")
    try:
        lib.define("op(Tensor x) -> Tensor")
        packet = torch.ops.shim_refresh.op
        assert "op" in vars(torch.ops.shim_refresh)
        with monkeypatch.context() as patch:  # torch 2.11 (the GPU machine's) has no such function
            patch.delattr(torch.library, "_clear_torch_ops_cache", raising=False)
            _torch.refresh_operators(["shim_refresh::op", "shim_refresh::never.made", "nons::x"])
        assert "op" not in vars(torch.ops.shim_refresh)
        assert torch.ops.shim_refresh.op is not packet  # made again on next use
    finally:
        lib._destroy()
