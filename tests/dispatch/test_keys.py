"""The key catalogue against the live dispatcher: names, order, keyset algebra, words."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from opmagic import key_info, runtime_keys
from opmagic._torch import dispatcher
from opmagic.dispatch.keys import CATEGORIES, catalogue
from opmagic.errors import ArgumentTypeError, UnknownDispatchKeyError

C = torch._C


def test_every_runtime_key_of_this_torch_is_catalogued_with_words():
    names = {k.name for k in runtime_keys()}
    assert names == set(dispatcher.keyset_names(dispatcher.full_keyset_raw()))
    for info in runtime_keys():
        assert info.category in CATEGORIES, info
        assert "No description" not in info.explanation, f"{info.name} needs an explanation"
        assert len(info.explanation) > 20


def test_priority_order_is_the_dispatchers():
    """Of two keys, torch picks the one the catalogue lists first.

    Two per-backend keys of different backends combine into a third key (NestedTensorCPU
    with SparseCsrMeta gives NestedTensorMeta), so those pairs are not orderable and skipped.
    """
    ordered = runtime_keys()
    rng = random.Random(1)
    pairs = list(itertools.pairwise(ordered))
    pairs += [tuple(sorted(rng.sample(ordered, 2), key=lambda k: k.priority)) for _ in range(3000)]
    for higher, lower in pairs:
        if higher.backend and lower.backend and higher.backend != lower.backend:
            continue
        picked = C.DispatchKeySet.from_raw_repr(higher.raw | lower.raw).highestPriorityTypeId()
        assert C._dispatch_key_name(picked) == higher.name, (higher.name, lower.name)


def test_names_and_highest_match_torch_on_random_keysets():
    key_catalogue = catalogue()
    rng = random.Random(0)
    full = dispatcher.full_keyset_raw()
    for _ in range(3000):
        raw = rng.getrandbits(64) & rng.getrandbits(64) & full
        assert set(key_catalogue.names(raw)) == set(dispatcher.keyset_names(raw))
        torch_pick = C._dispatch_key_name(
            C.DispatchKeySet.from_raw_repr(raw).highestPriorityTypeId()
        )
        assert (key_catalogue.highest(raw) or "Undefined") == torch_pick


@pytest.mark.parametrize(
    "name", ["AutogradCPU", "ADInplaceOrView", "Python", "BackendSelect", "Conjugate", "CPU"]
)
def test_full_after_and_minus_follow_dispatch_key_set(name):
    key_catalogue = catalogue()
    key = C._parse_dispatch_key(name)
    assert key_catalogue.full_after(name) == C._dispatch_keyset_full_after(key).raw_repr()
    tensor_keys = C._dispatch_keys(torch.randn(2))
    expected = (tensor_keys - C.DispatchKeySet(key)).raw_repr()
    assert key_catalogue.minus(tensor_keys.raw_repr(), C.DispatchKeySet(key).raw_repr()) == expected


def test_per_backend_keys_carry_functionality_and_backend():
    info = key_info("AutogradCUDA")
    assert (info.functionality, info.backend, info.category) == (
        "AutogradFunctionality",
        "CUDA",
        "autograd",
    )
    assert key_info("SparseMeta").backend == "Meta"
    assert key_info("Python").backend is None


def test_alias_keys_and_undefined_are_described():
    for alias in ("Autograd", "CompositeImplicitAutograd", "CompositeExplicitAutograd"):
        info = key_info(alias)
        assert info.is_alias and info.priority == -1 and info.explanation
    assert "without tensor inputs" in key_info("Undefined").explanation


def test_an_unknown_key_name_is_named_with_close_matches():
    bogus = r"no dispatch key 'Bogus'\..* runtime_keys\(\)"
    with pytest.raises(UnknownDispatchKeyError, match=bogus):
        key_info("Bogus")
    with pytest.raises(UnknownDispatchKeyError, match=r"'cpu'\. Did you mean CPU"):
        key_info("cpu")
    with pytest.raises(ArgumentTypeError, match="a dispatch key's name"):
        key_info(3)
