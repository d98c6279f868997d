"""The explorer: its model (search, inputs, contexts, outcome) and its widgets, headless."""

from __future__ import annotations

from html import unescape

import pytest
import torch

import opmagic
from opmagic.verify.samples import BATCH
from opmagic.view.explorer.model import ExplorerModel, find_ops, namespaces
from opmagic.view.explorer.widgets import Explorer

from ..svgfacts import svg_facts


@torch.library.custom_op("opmagic_explorer::explorer_scale", mutates_args=())
def scale(x: torch.Tensor, factor: float) -> torch.Tensor:
    """A custom op with a fake impl, so meta inputs work too."""
    return x * factor


@scale.register_fake
def _(x, factor):
    return torch.empty_like(x)


# ------------------------------------------------------------------ search


@pytest.mark.parametrize(
    ("query", "first"),
    [
        ("explorer_scale", "opmagic_explorer::explorer_scale"),
        ("explorer_sacle", "opmagic_explorer::explorer_scale"),  # a typo: a close spelling
        ("adm", "aten::addmm"),  # letters in order
        ("mm", "aten::mm"),
        ("torch.ops.aten.add.Tensor", "aten::add"),
        ("aten::add.Tensor", "aten::add"),
    ],
)
def test_search_puts_the_best_match_first(query: str, first: str) -> None:
    assert find_ops(query)[0] == first


def test_search_filters_by_namespace() -> None:
    assert find_ops("scale", "opmagic_explorer") == ["opmagic_explorer::explorer_scale"]
    assert find_ops("opmagic_explorer::") == ["opmagic_explorer::explorer_scale"]
    assert all(name.startswith("aten::") for name in find_ops("add", "aten"))
    assert {"aten", "opmagic_explorer"} <= set(namespaces())


# ------------------------------------------------------------------ model


def test_changing_an_input_changes_the_path() -> None:
    model = ExplorerModel(scale)
    assert model.op_name == "opmagic_explorer::explorer_scale.default"
    (x, factor) = model.slots
    assert (x.kind, factor.value) == ("tensor", "1.0")
    assert model.outcome().resolution.path == ("AutogradCPU", "CPU")
    x.tensor.device = "meta"
    assert model.outcome().resolution.path == ("AutogradMeta", "Meta")
    x.tensor.requires_grad = True
    model.set_context(inference_mode=True)
    assert model.outcome().resolution.path == ("Meta",)


@pytest.mark.parametrize(
    ("toggle", "first_key"),
    [
        ({"vmap": True}, "FuncTorchDynamicLayerFrontMode"),
        ({"fake": True}, "PythonTLSSnapshot"),
        ({"logging": True}, "PythonTLSSnapshot"),
        ({"autocast": "cpu"}, "AutocastCPU"),
        ({"no_grad": True}, "AutogradCPU"),
    ],
    ids=["vmap", "fake", "logging", "autocast", "no_grad"],
)
def test_contexts_are_applied_to_the_call(toggle: dict, first_key: str) -> None:
    model = ExplorerModel("aten::mm")
    model.set_context(**toggle)
    outcome = model.outcome()
    assert outcome.message is None
    assert outcome.resolution.path[0] == first_key
    assert outcome.resolution.context  # each toggle shows up in the thread-local state


@pytest.mark.parametrize(
    ("op", "message"),
    [
        ("nope::missing", "Unknown operator 'nope::missing'"),
        ("aten::set.source_Storage", "cannot build a sample for argument 'source'"),
        (42, "Expected an operator"),
    ],
    ids=["unknown", "unbuildable", "not-an-op"],
)
def test_bad_operators_become_messages(op, message: str) -> None:
    outcome = ExplorerModel(op).outcome()
    assert outcome.resolution is None
    assert message in outcome.message


def test_bad_inputs_become_messages() -> None:
    model = ExplorerModel(scale)
    model.slots[0].tensor.view = "conj"
    assert "a conjugate view needs a complex dtype" in model.outcome().message
    model.slots[0].tensor.view = "none"
    model.slots[1].value = "float("
    assert "argument 'factor': could not evaluate" in model.outcome().message
    model.slots[1].value = "1.0"
    model.slots[0].tensor.shape = ""
    model.set_context(vmap=True)  # vmap adds a batch dimension: a 0-dim spec still works
    assert model.outcome().message is None


@pytest.mark.parametrize("vmap", [False, True])
def test_a_value_of_the_wrong_type_is_a_message_not_a_path(vmap: bool) -> None:
    model = ExplorerModel(scale)
    model.set_context(vmap=vmap)
    model.slots[1].value = "'abc'"  # the real call refuses a str for a float argument
    outcome = model.outcome()
    assert outcome.resolution is None
    assert "Argument 'factor' of opmagic_explorer::explorer_scale must be a float" in (
        outcome.message
    )
    assert "Expected a value of type 'float'" in outcome.message
    model.slots[1].value = "2"  # an int is a float to torch
    assert model.outcome().resolution is not None


def test_opcheck_runs_on_the_sample_inputs() -> None:
    results = ExplorerModel(scale).opcheck()
    assert results["test_schema"] == "SUCCESS"
    assert results["test_faketensor"] == "SUCCESS"


def test_trace_runs_the_sample_call_in_the_contexts() -> None:
    model = ExplorerModel("aten::linear")
    plain = model.trace()
    assert [call.op for call in plain.calls] == ["aten::linear"]
    assert plain.calls[0].path[0].startswith("Autograd")
    model.set_context(autocast="cpu", no_grad=True)
    under_autocast = model.trace()
    assert under_autocast.calls[0].path[0] == "AutocastCPU"
    assert "aten::to.dtype" in {call.op for call in under_autocast.walk()}  # its casts


def test_trace_runs_the_backward_of_a_sample_that_requires_grad() -> None:
    model = ExplorerModel("aten::mul.Tensor")
    assert not model.trace().nodes()  # nothing requires grad: forward only
    model.slots[0].tensor.requires_grad = True
    traced = model.trace()
    (node,) = [n for n in traced.nodes() if n.name == "MulBackward0"]
    assert node.forward.op == "aten::mul.Tensor" and node.forward.depth == 0
    assert [c.op for c in node.children] == ["aten::mul.Tensor"]  # grad * other
    model.set_context(no_grad=True)
    assert not model.trace().nodes()  # under no_grad the output needs no backward


def test_trace_under_vmap_maps_over_the_batch() -> None:
    model = ExplorerModel("aten::mul.Tensor")
    model.set_context(vmap=True)
    traced = model.trace()
    assert traced.result.shape[0] == BATCH
    assert any("FuncTorchBatched" in key for call in traced.walk() for key in call.path)


def test_trace_of_a_bad_selection_says_why() -> None:
    model = ExplorerModel("aten::no_such_op")
    with pytest.raises(opmagic.OpmagicError, match="no_such_op"):
        model.trace()


# ------------------------------------------------------------------ widgets


def _tensor_control(explorer: Explorer, description: str, row: int = 0):
    controls = explorer.inputs.children[row].children
    return next(c for c in controls if getattr(c, "description", "") == description)


def test_widget_redraws_the_path_when_an_input_changes() -> None:
    explorer = opmagic.explore(scale)
    assert svg_facts(explorer.path_view.value).path_nodes() == {"AutogradCPU", "CPU"}
    # the answer in one line: the path and what its last kernel does
    assert "AutogradCPU → CPU  ·  CPU: runs custom_op impl scale (" in unescape(
        explorer.summary.value
    )
    assert explorer.path_view.value.startswith('<svg style="max-width:100%;height:auto"')
    device = explorer.inputs.children[0].children[1]
    device.value = "meta"
    assert svg_facts(explorer.path_view.value).path_nodes() == {"AutogradMeta", "Meta"}
    explorer.toggles["inference_mode"].value = True
    assert svg_facts(explorer.path_view.value).path_nodes() == {"Meta"}
    assert explorer.message.value == ""
    assert svg_facts(explorer.table_view.value).nodes
    assert "custom_op fake impl" in explorer.kernels_view.value
    assert "<ol>" in explorer.steps_view.value


def test_the_kernels_tab_groups_keys_as_the_diagram_does() -> None:
    """One row per kernel of the op's own, not one per key (18 identical Autograd rows)."""
    explorer = Explorer("aten::add.Tensor")
    rows = explorer.kernels_view.value.split("<tr>")[2:]
    autograd = [row for row in rows if "via Autograd" in row]
    assert len(autograd) == 1 and "AutogradCPU, AutogradCUDA + 16 more keys" in autograd[0]
    assert "AutogradNestedTensor" in autograd[0]  # every key, in the tooltip
    table = opmagic.dispatch_table("aten::add.Tensor")
    kernels = sum(entry.kind == "kernel" for entry in table.entries)  # more in CUDA builds
    aliases = {entry.alias for entry in table.entries if entry.kind in ("alias", "autograd")}
    assert len(rows) == kernels + len(aliases) + 1  # and the row on keys with only a fallback
    assert "more keys have only a backend fallback" in explorer.kernels_view.value
    explorer.show_all.value = True
    assert "PythonDispatcher" in explorer.kernels_view.value


def test_enter_in_the_search_selects_the_first_match() -> None:
    explorer = Explorer(scale)
    explorer.search.value = "addm"
    explorer.search._handle_string_msg(None, {"event": "submit"}, None)  # what Enter sends
    assert explorer.model.qualname == "aten::addmm"
    assert explorer.matches.value == "aten::addmm"
    assert "aten::addmm.default" in explorer.summary.value


def test_in_a_terminal_the_explorer_says_what_it_is() -> None:
    explorer = Explorer(scale)
    text = explorer._repr_mimebundle_()["text/plain"]
    assert text.startswith("opmagic explorer of opmagic_explorer::explorer_scale.default")
    assert "opmagic.resolve(op, *args)" in text and "VBox" not in text


def test_widget_shows_bad_input_as_a_message_and_recovers() -> None:
    explorer = Explorer(scale)
    drawn = explorer.path_view.value
    _tensor_control(explorer, "view").value = "conj"
    assert "conjugate view needs a complex dtype" in explorer.message.value
    assert explorer.summary.value == ""
    # the last diagram stays, dimmed: the page keeps its height
    assert (
        explorer.path_view.value == f"<div class='opmagic-stale' style='opacity:0.35'>{drawn}</div>"
    )
    _tensor_control(explorer, "view").value = "none"
    assert explorer.message.value == ""
    assert explorer.path_view.value == drawn


def test_widget_shows_a_wrong_argument_type_as_a_message() -> None:
    explorer = Explorer(scale)
    drawn = explorer.path_view.value
    factor = explorer.inputs.children[1].children[-1]
    factor.value = "'abc'"
    assert "must be a float" in explorer.message.value
    assert explorer.path_view.value.startswith("<div class='opmagic-stale'")  # no new path
    factor.value = "2.0"
    assert explorer.message.value == "" and explorer.path_view.value == drawn


def test_widget_searches_and_switches_operators() -> None:
    explorer = Explorer(scale)
    explorer.search.value = "addmm"
    assert explorer.matches.options[0] == "aten::addmm"
    explorer.matches.value = "aten::addmm"
    assert explorer.model.qualname == "aten::addmm"
    assert [o[0] for o in explorer.overload.options][:2] == ["default", "dtype"]
    assert len(explorer.inputs.children) == 3
    explorer.overload.value = "out"
    assert "out" in [s.name for s in explorer.model.slots]
    assert "aten::addmm.out" in explorer.summary.value
    explorer.namespace.value = "opmagic_explorer"
    assert explorer.matches.options == ()


def test_the_namespace_list_follows_operators_defined_after_opening() -> None:
    explorer = Explorer(scale)
    explorer.namespace.value = "opmagic_explorer"
    lib = torch.library.Library("opmagic_explorer_later", "DEF")
    try:
        lib.define("later(Tensor x) -> Tensor")
        explorer.search.value = "later"
        assert "opmagic_explorer_later" in explorer.namespace.options
        assert explorer.namespace.value == "opmagic_explorer"  # the choice stays
        explorer.namespace.value = "opmagic_explorer_later"
        assert explorer.matches.options == ("opmagic_explorer_later::later",)
    finally:
        lib._destroy()
    explorer.search.value = "late"
    assert "opmagic_explorer_later" not in explorer.namespace.options
    assert explorer.namespace.value == "(all namespaces)"


def test_widget_for_an_unknown_operator_explains_and_suggests() -> None:
    explorer = Explorer("opmagic_explorer::explorer_sacle")
    assert "Unknown operator 'opmagic_explorer::explorer_sacle'" in explorer.message.value
    assert "opmagic_explorer::explorer_scale" in explorer.message.value
    assert explorer.matches.options[0] == "opmagic_explorer::explorer_scale"
    explorer.matches.value = "opmagic_explorer::explorer_scale"
    assert explorer.message.value == ""


def test_a_failure_inside_a_handler_is_shown_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    explorer = Explorer(scale)

    def broken() -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(explorer.model, "outcome", broken)
    explorer.toggles["no_grad"].value = True
    assert "RuntimeError: boom" in explorer.message.value


def test_widget_trace_button_fills_the_tab() -> None:
    explorer = Explorer("aten::linear")
    explorer.autocast.value = "cpu"
    explorer.trace_button.click()
    text = unescape(explorer.trace_view.value)
    assert "trace: " in text and "aten::linear" in text and "autocast cast" in text
    explorer.model.slots[0].tensor.requires_grad = True  # the input's grad checkbox
    explorer.trace_button.click()
    text = unescape(explorer.trace_view.value)
    assert "backward: " in text and "autograd node" in text
    explorer.search.value = "aten::no_such_op"
    explorer.model.select("aten::no_such_op")
    explorer.trace_button.click()  # a refusal is shown in the tab, never raised
    assert "no_such_op" in unescape(explorer.trace_view.value)


def test_widget_opcheck_button_fills_the_tab() -> None:
    explorer = Explorer(scale)
    explorer.opcheck_button.click()
    assert "test_schema" in explorer.opcheck_view.value
    assert "SUCCESS" in explorer.opcheck_view.value


def test_the_show_all_toggle_draws_every_key() -> None:
    explorer = Explorer(scale)
    before = len(svg_facts(explorer.path_view.value).nodes)
    explorer.show_all.value = True
    assert len(svg_facts(explorer.path_view.value).nodes) > before
    assert "PythonDispatcher" in svg_facts(explorer.table_view.value).all_text
