"""``opmagic.snapshot`` / ``opmagic.diff``: exact against a brute-force comparison of every
operator's ``_dispatch_dump``, for each way of registering (Library, custom_op, register_fake,
register_autograd, fallbacks) and of removing (``Library._destroy``).

The oracle reads the dumps itself, line by line, without opmagic's parser: an operator changed
when its header lines (schema, definition) differ; a key changed when its list of kernel lines
differs: ``added`` when it had none, ``removed`` when nothing new came, else ``replaced``.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

import opmagic
from opmagic.dispatch.diff import DispatchDiff
from opmagic.errors import ArgumentTypeError, UnknownOperatorError

_C = torch._C
HEADER = ("schema:", "debug:", "alias analysis kind:")


def raw_dumps() -> dict[str, str]:
    """Every operator's dump, read straight from torch."""
    return {name: _C._dispatch_dump(name) for name in _C._dispatch_get_all_op_names()}


def raw_fallbacks() -> set[str]:
    """Keys with a backend fallback, asked of torch for every key of its enum."""
    return {
        name
        for name, key in _C.DispatchKey.__members__.items()
        if not _C._dispatch_is_alias_key(key) and _C._dispatch_has_backend_fallback(key)
    }


def _lines(text: str) -> tuple[tuple[str, ...], dict[str, list[str]]]:
    """A dump's header lines and, per key, its kernel lines without the key prefix."""
    header = tuple(line for line in text.splitlines() if line.startswith(HEADER))
    kernels: dict[str, list[str]] = {}
    for line in text.splitlines():
        if not line or line.startswith((*HEADER, "name:")):
            continue
        head, _, rest = line.partition(": ")
        key = head.replace("[alias]", "").replace(" (inactive)", "")
        kernels.setdefault(key, []).append(rest)
    return header, kernels


def brute_force(before: dict[str, str], after: dict[str, str]) -> set[tuple[str, str, str]]:
    """``(op, key, change)`` of every difference between two sets of dumps (key ``""``: the
    operator's definition)."""
    found = set()
    for op in before.keys() | after.keys():
        old_text, new_text = before.get(op, ""), after.get(op, "")
        if old_text == new_text:
            continue
        (old_header, old_kernels), (new_header, new_kernels) = _lines(old_text), _lines(new_text)
        old_defined = bool(old_header) and old_header[0] != "schema: (none)"
        new_defined = bool(new_header) and new_header[0] != "schema: (none)"
        if old_header != new_header and (old_defined or new_defined):
            change = "added" if not old_defined else "removed" if not new_defined else "replaced"
            found.add((op, "", change))
        for key in old_kernels.keys() | new_kernels.keys():
            old, new = old_kernels.get(key, []), new_kernels.get(key, [])
            if old == new:
                continue
            came = Counter(new) - Counter(old)
            change = "added" if not old else "removed" if not new or not came else "replaced"
            found.add((op, key, change))
    return found


@contextmanager
def exact_diff() -> Iterator[list[DispatchDiff]]:
    """Diff the block, and check the diff against the brute-force comparison of the dumps
    and of the fallbacks; the diff is appended to the yielded list."""
    dumps, fallbacks, before = raw_dumps(), raw_fallbacks(), opmagic.snapshot()
    box: list[DispatchDiff] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about overriding aten kernels
        yield box
    found = opmagic.diff(before)
    own = {(c.op, c.key, c.change) for c in (*found.operators, *found.kernels)}
    assert own == brute_force(dumps, raw_dumps())
    changed = fallbacks ^ raw_fallbacks()
    assert {c.key for c in found.fallbacks} == changed
    box.append(found)


def one(found: DispatchDiff, op: str, key: str) -> Any:
    """The registration change of one operator and key (no derived entry, no route)."""
    (change,) = [
        c
        for c in (*found.operators, *found.kernels, *found.fallbacks)
        if c.op == op and c.key == key
    ]
    return change


@pytest.fixture
def libraries() -> Iterator[list[torch.library.Library]]:
    """Libraries a test made; destroyed after it."""
    made: list[torch.library.Library] = []
    yield made
    for library in made:
        if library.m is not None:
            library._destroy()


def library(made: list, namespace: str, kind: str) -> torch.library.Library:
    found = torch.library.Library(namespace, kind)
    made.append(found)
    return found


def test_an_unchanged_dispatcher_gives_an_empty_diff():
    with opmagic.diff() as found:
        torch.ones(2).sin()
    assert len(found) == 0 and not found.aten_overrides
    assert str(found).startswith("dispatcher diff: nothing changed")


def test_library_definitions_kernels_and_an_aten_override(libraries):
    with exact_diff() as box:
        defs = library(libraries, "dfa", "DEF")
        defs.define("scale(Tensor x) -> Tensor")
        defs.impl("scale", lambda x: x * 2, "CPU")
        defs.impl("scale", lambda x: x * 2, "CompositeExplicitAutograd")
        defs.impl("scale", torch.library.fallthrough_kernel, "AutocastCPU")
        aten = library(libraries, "aten", "IMPL")
        aten.impl("sin", lambda x: x, "CPU")
    (found,) = box
    definition = one(found, "dfa::scale", "")
    assert (definition.change, definition.after) == ("added", "dfa::scale(Tensor x) -> Tensor")
    assert one(found, "dfa::scale", "AutocastCPU").kind == "fallthrough"
    assert one(found, "dfa::scale", "CPU").kind == "Python"
    override = one(found, "aten::sin", "CPU")
    assert override.change == "replaced" and override.overrides_aten
    assert "/tests/dispatch/test_diff.py:" in override.site
    assert override.hides.startswith("C++ · aten/src/ATen/RegisterCPU")  # torch's, now inactive
    assert override.before == override.hides
    assert found.aten_overrides == (override,)
    assert found.table("aten::sin").changed[0].key == "CPU"

    with exact_diff() as box:
        for made in libraries:
            made._destroy()
    (removed,) = box
    back = one(removed, "aten::sin", "CPU")
    assert (back.change, back.after) == ("removed", override.hides)  # torch's kernel again
    assert one(removed, "dfa::scale", "").change == "removed"


def test_a_kernel_on_top_and_removing_the_one_under_it(libraries):
    defs = library(libraries, "dfb", "DEF")
    defs.define("f(Tensor x) -> Tensor")
    lower = library(libraries, "dfb", "IMPL")
    lower.impl("f", lambda x: x, "CPU")
    with exact_diff() as box:
        upper = library(libraries, "dfb", "IMPL")
        upper.impl("f", lambda x: x + 1, "CPU")
    replaced = one(box[0], "dfb::f", "CPU")
    assert replaced.change == "replaced" and replaced.hides == replaced.before
    with exact_diff() as box:
        lower._destroy()  # the hidden kernel goes; the active one stays
    gone = one(box[0], "dfb::f", "CPU")
    assert gone.change == "removed"
    assert gone.before == gone.after == replaced.after
    assert gone.site == replaced.hides.split(" · ", 1)[1]


def test_custom_op_register_fake_register_autograd_and_a_device_kernel():
    def backward(ctx, grad):
        return grad * 2

    with exact_diff() as box:

        @torch.library.custom_op("dfc::double", mutates_args=())
        def double(x: torch.Tensor) -> torch.Tensor:
            return x * 2

        @double.register_fake
        def double_fake(x):
            return torch.empty_like(x)

        double.register_autograd(backward)

        @double.register_kernel("cpu")
        def double_cpu(x):
            return x + x

    (found,) = box
    definition = one(found, "dfc::double", "").site
    assert definition.startswith("custom_op ") and ".double (" in definition
    assert "custom_op fake impl" in one(found, "dfc::double", "Meta").site
    assert "double_fake" in one(found, "dfc::double", "Meta").site
    assert "double_cpu" in one(found, "dfc::double", "CPU").site
    assert "backward" in one(found, "dfc::double", "Autograd").site
    assert not found.aten_overrides


def test_register_fake_and_register_autograd_on_a_library_operator(libraries):
    defs = library(libraries, "dfd", "DEF")
    defs.define("g(Tensor x) -> Tensor")
    defs.impl("g", lambda x: x * 3, "CPU")
    with exact_diff() as box:
        torch.library.register_fake("dfd::g", lambda x: torch.empty_like(x), lib=defs)
        torch.library.register_autograd("dfd::g", lambda ctx, grad: grad * 3, lib=defs)
    found = box[0]
    assert {c.key for c in found.kernels} == {"Meta", "Autograd"}
    assert one(found, "dfd::g", "Meta").change == "added"


def test_backend_fallbacks_and_fallthrough_fallbacks(libraries):
    def fallback(op, keyset, *args, **kwargs):
        return op.redispatch(keyset, *args, **kwargs)

    with exact_diff() as box:
        fallbacks = library(libraries, "_", "IMPL")
        fallbacks.fallback(fallback, "PrivateUse2", with_keyset=True)
        fallbacks.fallback(torch.library.fallthrough_kernel, "PrivateUse3")
    found = box[0]
    added = {c.key: c for c in found.fallbacks}
    assert added["PrivateUse2"].change == "added" and added["PrivateUse2"].op == ""
    assert added["PrivateUse2"].kind == "backend fallback"
    assert "/tests/dispatch/test_diff.py:" in added["PrivateUse2"].site
    assert added["PrivateUse3"].kind == "fallthrough fallback"
    assert not found.kernels and not found.derived  # no operator's registrations changed
    with exact_diff() as box:
        fallbacks._destroy()
    assert {(c.key, c.change) for c in box[0].fallbacks} == {
        ("PrivateUse2", "removed"),
        ("PrivateUse3", "removed"),
    }


def test_derived_entries_are_the_computed_entries_that_changed_without_a_registration(
    libraries,
):
    defs = library(libraries, "dfe", "DEF")
    defs.define("h(Tensor x) -> Tensor")
    defs.impl("h", lambda x: x, "CPU")
    table_before = _C._dispatch_dump_table("dfe::h")
    with exact_diff() as box:
        defs.impl("h", lambda x: x, "CompositeImplicitAutograd")
    found = box[0]
    old, new = _entries(table_before), _entries(_C._dispatch_dump_table("dfe::h"))
    expected = {key for key in old.keys() | new.keys() if old.get(key) != new.get(key)}
    assert {c.key for c in found.derived} == expected
    assert "AutogradCPU" not in expected  # the CPU kernel keeps it off the math kernel
    assert {"CUDA", "Meta", "AutogradCUDA"} <= expected
    assert {c.because for c in found.derived} == {"CompositeImplicitAutograd added"}
    assert {c.change for c in found.derived} == {"added"}


def _entries(table: str) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in table.splitlines() if line)


def test_a_diff_is_a_snapshot_that_displays_the_same_after_its_op_is_gone(libraries):
    with opmagic.diff() as found:
        defs = library(libraries, "dff", "DEF")
        defs.define("k(Tensor x) -> Tensor")
        defs.impl("k", lambda x: x, "CompositeExplicitAutograd")
    shown = (str(found), found._repr_html_(), found.frame().to_dict(), str(found.table("dff::k")))
    defs._destroy()
    redefined = library(libraries, "dff", "DEF")
    redefined.define("k(Tensor x, int n) -> Tensor")
    assert (
        str(found),
        found._repr_html_(),
        found.frame().to_dict(),
        str(found.table("dff::k")),
    ) == shown


def test_the_block_form_keeps_the_diff_when_the_block_raises(libraries):
    with pytest.raises(ValueError), opmagic.diff() as found:
        library(libraries, "dfg", "DEF").define("m(Tensor x) -> Tensor")
        raise ValueError("boom")
    assert [c.op for c in found.operators] == ["dfg::m"]


def test_bad_arguments_say_what_to_pass():
    with pytest.raises(ArgumentTypeError, match=r"pass what opmagic\.snapshot"):
        opmagic.diff("aten::sin")
    with pytest.raises(UnknownOperatorError, match="did not change in this diff"):
        opmagic.diff(opmagic.snapshot()).table("aten::sin")
