"""resolve on built-in and custom operators: paths, steps, errors, and bad input."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.library import Library
from torch.testing._internal.two_tensor import TwoTensor

from opmagic import ArgumentsMismatchError, dispatch_table, resolve

from .probes import make_probe_op


@pytest.fixture
def custom_ops():
    """Custom ops made in a test, destroyed afterwards."""
    made = []
    yield made
    for op in made:
        op._lib._destroy()


def test_aten_paths_in_common_contexts():
    x = torch.randn(3, requires_grad=True)
    assert resolve("aten::add", x, x).path == ("AutogradCPU", "CPU")
    with torch.inference_mode():
        assert resolve(torch.ops.aten.add.Tensor, x, x).path == ("CPU",)
    with torch.autocast("cpu"):
        mm = resolve(torch.ops.aten.mm, torch.randn(2, 2), torch.randn(2, 2))
    assert mm.path == ("AutocastCPU", "AutogradCPU", "CPU")
    assert mm.steps[0].action == "call" and "autocast" in mm.steps[0].note
    assert resolve("aten::add", x.to("meta"), x.to("meta")).path == ("AutogradMeta", "Meta")
    complex_x = torch.randn(2, dtype=torch.cfloat)
    assert resolve("aten::add", complex_x.conj(), complex_x).path == (
        "AutogradCPU",
        "Conjugate",
        "CPU",
    )


def test_factory_op_picks_the_backend_from_its_device_argument():
    default = resolve("aten::empty.memory_format", [2, 3])
    assert default.path == ("BackendSelect", "CPU")
    assert default.steps[0].origin.startswith("the TLS include set")
    assert resolve("aten::empty.memory_format", [2], device="meta").path == (
        "BackendSelect",
        "Meta",
    )
    sparse = resolve("aten::empty.memory_format", [2], layout=torch.sparse_coo)
    assert sparse.path == ("BackendSelect", "SparseCPU")


def test_steps_say_where_keys_came_from_and_why_others_were_skipped():
    r = resolve("aten::add", torch.randn(2), torch.randn(2, requires_grad=True))
    first, second = r.steps
    assert first.key == "AutogradCPU" and first.origin == "arguments self, other"
    assert {(s.key, s.reason) for s in first.skipped} == {("AutocastCPU", "excluded")}
    assert "autocast for CPU is off" in first.skipped[0].detail
    assert ("ADInplaceOrView", "fallthrough") in {(s.key, s.reason) for s in second.skipped}
    assert second.action == "ends" and "RegisterCPU" in second.note
    assert r.key == "AutogradCPU" and r.error is None
    assert [i.name for i in r.inputs] == ["self", "other"]
    assert "requires_grad" in r.inputs[1].description


def test_context_words():
    x = torch.randn(2)
    with torch.no_grad():
        assert any("no_grad" in w for w in resolve("aten::sin", x).context)
    with torch.inference_mode():
        assert "inference_mode on" in resolve("aten::sin", x).context
        skipped = resolve("aten::sin", x).steps[0].skipped
        assert any("inference_mode is on" in s.detail for s in skipped)


def test_resolve_does_not_run_the_op():
    probe = make_probe_op(["CPU", "Autograd"])
    try:
        resolution = resolve(probe.op, torch.randn(2), torch.randn(2))
        assert resolution.path == ("AutogradCPU", "CPU")
        assert probe.log == []
    finally:
        probe.close()


def test_custom_op_without_fake_impl_fails_on_meta_and_says_how_to_fix(custom_ops):
    @torch.library.custom_op("opmagic_test_resolve::plain", mutates_args=())
    def plain(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    custom_ops.append(plain)
    r = resolve(plain, torch.randn(2, device="meta"))
    assert r.path == ("AutogradMeta", "Meta")
    assert "register_fake" in r.error
    with pytest.raises(RuntimeError, match="no fake impl"):
        plain(torch.randn(2, device="meta"))

    @plain.register_fake
    def _(x):
        return torch.empty_like(x)

    assert resolve(plain, torch.randn(2, device="meta")).error is None


def test_custom_op_autocast_rule_runs_under_autocast(custom_ops):
    @torch.library.custom_op("opmagic_test_resolve::cast", mutates_args=())
    def cast(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    custom_ops.append(cast)
    cast.register_autocast("cpu", torch.bfloat16)
    with torch.autocast("cpu"):
        r = resolve(cast, torch.randn(2))
    assert r.path == ("AutocastCPU", "AutogradCPU", "CPU")
    assert "bfloat16" in r.steps[0].note
    assert "turned off by AutocastCPU's kernel" in r.steps[1].skipped[0].detail


def test_custom_factory_op_without_kernel_for_the_device(custom_ops):
    @torch.library.custom_op("opmagic_test_resolve::ones", mutates_args=(), device_types="cpu")
    def ones(n: int, device: torch.device) -> torch.Tensor:
        return torch.ones(n, device=device)

    custom_ops.append(ones)
    assert resolve(ones, 3, torch.device("cpu")).path == ("BackendSelect", "CPU")
    r = resolve(ones, 3, torch.device("meta"))
    assert "register_kernel('meta')" in r.error


def test_fake_tensor_mode_runs_the_fake_impl(custom_ops):
    @torch.library.custom_op("opmagic_test_resolve::faked", mutates_args=())
    def faked(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @faked.register_fake
    def faked_fake(x):
        return torch.empty_like(x)

    custom_ops.append(faked)
    with FakeTensorMode() as mode:
        r = resolve(faked, mode.from_tensor(torch.randn(2)))
    assert r.path[-1] == "Python"
    assert "faked_fake" in r.python


def test_tensor_subclass_is_followed_into_its_inner_tensors():
    x = TwoTensor(torch.randn(2), torch.randn(2))
    r = resolve("aten::add", x, x)
    assert r.path == ("PythonTLSSnapshot", "AutogradCPU", "Python", "CPU")
    python = r.steps[2]
    assert python.action == "call" and "TwoTensor.__torch_dispatch__" in python.note
    assert "inner tensors (a, b" in python.note
    assert r.steps[3].assumed and r.python is None


def test_a_wrapper_subclass_that_does_not_say_what_it_wraps_hands_over_to_python():
    class Opaque(torch.Tensor):
        @staticmethod
        def __new__(cls, elem):
            return torch.Tensor._make_wrapper_subclass(cls, elem.shape, dtype=elem.dtype)

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            raise NotImplementedError

    r = resolve("aten::add", Opaque(torch.randn(2)), torch.randn(2))
    assert r.path[-1] == "Python" and "Opaque.__torch_dispatch__" in r.python


def test_dispatch_mode_steps_after_the_handler_are_marked_assumed():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Passing(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Passing():
        r = resolve("aten::add", torch.randn(2, requires_grad=True), torch.randn(2))
    assert r.path == ("PythonTLSSnapshot", "AutogradCPU", "Python", "CPU")
    assert [s.assumed for s in r.steps] == [False, False, False, True]
    assert "Passing" in r.steps[2].note


def test_aten_op_against_probes_overriding_its_kernels():
    """Probes registered over aten::mul.Tensor's own kernels log the real path."""
    log: list[str] = []
    library = Library("aten", "IMPL")
    op = torch.ops.aten.mul.Tensor

    def probe(keyset, *args):
        log.append(torch._C._dispatch_key_name(keyset.highestPriorityTypeId()))
        below = torch._C._dispatch_keyset_full_after(keyset.highestPriorityTypeId())
        return op.redispatch(keyset & below, *args)

    def cpu(keyset, a, b):
        log.append("CPU")
        return torch.empty_like(a)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            library.impl("mul.Tensor", probe, "AutocastCPU", with_keyset=True)
            library.impl("mul.Tensor", cpu, "CPU", with_keyset=True)
        x = torch.randn(2)
        with torch.autocast("cpu"):
            predicted = resolve(op, x, x).path
            op(x, x)
        assert (
            [k for k in predicted if k in ("AutocastCPU", "CPU")]
            == log
            == [
                "AutocastCPU",
                "CPU",
            ]
        )
    finally:
        library._destroy()
    assert dispatch_table(op)["CPU"].site.endswith(
        ".cpp:" + dispatch_table(op)["CPU"].site.split(":")[-1]
    )
    assert "RegisterCPU" in dispatch_table(op)["CPU"].site


@pytest.mark.parametrize(
    ("op", "args", "kwargs", "message"),
    [
        ("aten::add", ("a", 1), {}, r"No overload of aten::add accepts \(str 'a', int 1\)"),
        ("aten::add.Tensor", (torch.randn(1),), {}, "missing the required argument 'other'"),
        ("aten::sin.default", (torch.randn(1), torch.randn(1)), {}, "at most 1 positional"),
        ("aten::sin.default", (torch.randn(1),), {"bogus": 1}, "no argument named 'bogus'"),
        ("aten::sin.out", (torch.randn(1),), {}, "missing the required argument 'out'"),
    ],
)
def test_a_call_of_the_wrong_shape_is_one_clear_error(op, args, kwargs, message):
    with pytest.raises(ArgumentsMismatchError, match=message):
        resolve(op, *args, **kwargs)


@pytest.mark.parametrize(
    ("op", "args", "message"),
    [
        ("aten::add.Tensor", (torch.randn(1), "a"), "'other' of aten::add.Tensor must be a Tensor"),
        (
            "aten::cat.default",
            ([torch.randn(1), 3],),
            "'tensors' of aten::cat must be a list of Tensors",
        ),
    ],
)
def test_a_value_of_the_wrong_type_is_the_resolutions_error(op, args, message):
    resolution = resolve(op, *args)  # the real call refuses it before any kernel runs
    assert re.search(message, resolution.error)
    assert resolution.path == () and resolution.key is None


def test_same_argument_twice_is_rejected():
    x = torch.randn(1)
    with pytest.raises(ArgumentsMismatchError, match="both by position and by keyword"):
        resolve("aten::add.Tensor", x, x, other=x)


def test_text_and_html_forms():
    r = resolve("aten::add", torch.randn(2, requires_grad=True), torch.randn(2))
    text = str(r)
    assert "path: AutogradCPU -> CPU" in text and "skipped AutocastCPU" in text
    html = r._repr_html_()
    assert html.index("<svg") < html.index("<details>") < html.index("<ol>")
    assert "AutogradCPU &rarr; CPU" in html


def test_python_dispatcher_comes_first_and_hands_on_the_rest_of_the_path():
    """Under enable_python_dispatcher, probes cannot tell their runtime key (the Python
    dispatcher calls Python kernels with its own keyset), so this is checked directly."""
    from torch._dispatch.python import enable_python_dispatcher

    x = torch.randn(2, requires_grad=True)
    plain = resolve("aten::add", x, x)
    with enable_python_dispatcher():
        routed = resolve("aten::add", x, x)
        torch.ops.aten.add(x, x)  # the real call works under the same state
    assert routed.path == ("PythonDispatcher", *plain.path)
    assert "Python dispatcher enabled" in routed.context
    assert "torch._ops" in routed.steps[0].note
