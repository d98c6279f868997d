"""kernels(): long and wide views agree with each operator's dispatch table."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from opmagic import OpmagicError, dispatch_table, kernels
from opmagic.dispatch.kernels import DEFAULT_KEYS, LONG_COLUMNS
from opmagic.errors import ArgumentTypeError, UnknownDispatchKeyError


def _alias(value: object) -> str | None:
    """The alias column holds a name or pandas' missing value."""
    return None if pd.isna(value) else value


@pytest.fixture(scope="module")
def namespace():
    """A namespace with one op per situation the views must tell apart."""

    @torch.library.custom_op("opmagic_test_kernels::full", mutates_args=())
    def full(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @full.register_fake
    def _(x):
        return torch.empty_like(x)

    @torch.library.custom_op("opmagic_test_kernels::unfaked", mutates_args=())
    def unfaked(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    lib = torch.library.Library("opmagic_test_kernels", "FRAGMENT")
    lib.define("cpu_only(Tensor x) -> Tensor")
    lib.impl("cpu_only", lambda x: x.clone(), "CPU")
    lib.define("decomposed(Tensor x) -> Tensor")
    lib.impl("decomposed", lambda x: x * 2, "CompositeImplicitAutograd")
    yield "opmagic_test_kernels"
    lib._destroy()
    full._lib._destroy()
    unfaked._lib._destroy()


def test_long_form_rows(namespace):
    frame = kernels(namespace, ["CPU", "Meta", "AutogradCPU"])
    assert list(frame.columns) == LONG_COLUMNS
    rows = {(r.op, r.key): (r.kind, _alias(r.alias)) for r in frame.itertuples()}
    assert rows[("opmagic_test_kernels::cpu_only", "CPU")] == ("kernel", None)
    assert ("opmagic_test_kernels::cpu_only", "Meta") not in rows  # the fallback is not listed
    assert rows[("opmagic_test_kernels::full", "CPU")] == ("alias", "CompositeExplicitAutograd")
    assert rows[("opmagic_test_kernels::full", "Meta")] == ("kernel", None)
    assert rows[("opmagic_test_kernels::unfaked", "Meta")] == ("stub", None)
    assert rows[("opmagic_test_kernels::decomposed", "AutogradCPU")] == (
        "alias",
        "CompositeImplicitAutograd",
    )
    assert set(frame["overload"]) == {"default"}


def test_wide_form_finds_ops_without_a_meta_kernel(namespace):
    wide = kernels(namespace, ["CPU", "Meta", "AutogradCPU"], wide=True)
    assert wide.index.names == ["op", "overload"]
    lacking = wide[wide["Meta"].isin(["missing", "fallback", "stub"])]
    assert list(lacking.index.get_level_values("op")) == [
        "opmagic_test_kernels::cpu_only",
        "opmagic_test_kernels::unfaked",
    ]
    assert wide.loc[("opmagic_test_kernels::unfaked", "default"), "Meta"] == "stub"
    missing = kernels(namespace, ["CPU"], wide=True, missing="Meta")
    assert list(missing.index.get_level_values("op")) == list(lacking.index.get_level_values("op"))
    autograd = wide["AutogradCPU"].to_dict()
    assert autograd[("opmagic_test_kernels::cpu_only", "default")] == "fallback"
    assert autograd[("opmagic_test_kernels::full", "default")] == "autograd"


def test_agrees_with_dispatch_table_for_aten_ops():
    frame = kernels("aten", ["CPU", "CUDA", "Meta", "AutogradCPU", "ADInplaceOrView"])
    ops = ["aten::add", "aten::mul", "aten::view", "aten::sin", "aten::mm"]
    sample = frame[frame["op"].isin(ops)]
    assert len(sample) > 10
    for row in sample.itertuples():
        name = row.op if row.overload == "default" else f"{row.op}.{row.overload}"
        entry = dispatch_table(name)[row.key]
        assert (row.kind, _alias(row.alias), row.source) == (
            entry.kind,
            entry.alias,
            entry.source,
        ), row
    mm_meta = sample[(sample["op"] == "aten::mm") & (sample["key"] == "Meta")]
    assert mm_meta["source"].iloc[0].startswith("meta_mm (")


def test_non_functional_kernels_are_named_by_their_alias():
    """torch labels CompositeExplicitAutograd and its NonFunctional variant alike; the site
    (torch's generated RegisterCompositeExplicitAutogradNonFunctional file) tells them apart."""
    frame = kernels("aten", ["SparseCsrMPS"])
    row = frame[(frame["op"] == "aten::add") & (frame["overload"] == "Tensor")].iloc[0]
    assert "RegisterCompositeExplicitAutogradNonFunctional" in row.source
    assert (row.kind, row.alias) == ("alias", "CompositeExplicitAutogradNonFunctional")


def test_all_ops_and_default_keys():
    frame = kernels()
    assert frame["op"].str.startswith("aten::").sum() > 1000
    assert set(frame["key"]) <= set(DEFAULT_KEYS)
    assert len(kernels("aten", "all", wide=True).columns) > 130


def test_unknown_namespace_and_keys_are_explained():
    with pytest.raises(OpmagicError, match=r"No operators in namespace 'nosuchns'.*aten"):
        kernels("nosuchns")
    with pytest.raises(OpmagicError, match="'Autograd' is an alias key"):
        kernels("aten", ["Autograd"])
    with pytest.raises(OpmagicError, match="Unknown dispatch key 'CPUU'"):
        kernels("aten", "CPUU")


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"namespace": 3}, "namespace must be a str or None"),
        ({"missing": ["CPU"]}, "missing must be a str or None"),
        ({"keys": [1]}, "keys must be key names"),
        ({"keys": 5}, "keys must be key names or 'all'"),
    ],
)
def test_arguments_of_the_wrong_type_are_named(kwargs, expected):
    with pytest.raises(ArgumentTypeError, match=expected):
        kernels(**kwargs)
    with pytest.raises(UnknownDispatchKeyError, match="Unknown dispatch key 'CPUU'"):
        kernels("aten", keys=["CPUU"])
