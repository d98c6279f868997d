"""A real browser: JupyterLab runs the quickstart, the explorer draws, fits the window and
follows its inputs.

The quickstart runs once per test run in the shared JupyterLab (see conftest.py), at 1280x900
and at 1024x768 with the file browser open. The screenshots (the explorer at each step, the
page when a check fails) land in build/browser/: look at them after changing a view.
"""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import ARTIFACTS, SIZES, RanNotebook, set_size

pytestmark = pytest.mark.slow  # starts JupyterLab and a browser

REDRAW_S = 60
TRACE_S = 180  # the first trace may wait for its observer to finish compiling
PATH_TITLES = "els => els.map(e => e.textContent)"
PATH_NODES = ".opmagic-explorer .opmagic-path svg g.node.path > title"


EXPLORER = ".opmagic-explorer"


def _rect(locator: Any) -> dict[str, float]:
    """An element's box in the viewport (CSS px)."""
    return locator.evaluate(
        "e => { const r = e.getBoundingClientRect();"
        " return {left: r.left, right: r.right, top: r.top, bottom: r.bottom}; }"
    )


def _overflows(locator: Any) -> dict[str, bool]:
    """Whether an element scrolls inside itself, sideways or down."""
    return locator.evaluate(
        "e => ({x: e.scrollWidth > e.clientWidth + 1, y: e.scrollHeight > e.clientHeight + 1})"
    )


def _assert_fits(page: Any, size: tuple[int, int]) -> None:
    """The explorer at this window size: every control inside it, the answer line and the
    path's final kernel on screen, no inner scrollbars."""
    explorer = page.locator(EXPLORER)
    outer = _rect(explorer)
    for control in (
        ".opmagic-shape input",  # the last control of an input row
        "select >> nth=-1",  # autocast: the last dropdown of the explorer
        "label:has-text('all keys')",
        "label:has-text('FakeTensorMode')",
    ):
        box = _rect(explorer.locator(control).last)
        assert outer["left"] - 1 <= box["left"] and box["right"] <= outer["right"] + 1, (
            size,
            control,
            box,
            outer,
        )
    for part in (EXPLORER, f"{EXPLORER} .opmagic-path", f"{EXPLORER} .widget-tab-contents"):
        assert _overflows(page.locator(part).first) == {"x": False, "y": False}, (
            size,
            part,
            _sticking_out(page.locator(part).first),
        )
    summary = explorer.locator(".opmagic-summary")
    summary.scroll_into_view_if_needed()
    box = _rect(summary)
    assert box["top"] >= 0 and box["bottom"] <= size[1], (size, box)
    final = explorer.locator(".opmagic-path svg g.node.path").last
    final.scroll_into_view_if_needed()
    box, pane = _rect(final), _rect(explorer.locator(".opmagic-path"))
    assert box["top"] >= 0 and box["bottom"] <= size[1], (size, box)
    assert pane["left"] - 1 <= box["left"] and box["right"] <= pane["right"] + 1, (size, box)


def _sticking_out(locator: Any) -> list[str]:
    """The descendants that reach past an element's right edge (for a failure message)."""
    return locator.evaluate(
        "e => { const right = e.getBoundingClientRect().right; return [...e.querySelectorAll('*')]"
        ".filter(d => d.getBoundingClientRect().right > right + 1)"
        ".slice(0, 8).map(d => `${d.tagName}.${d.className} ${d.getBoundingClientRect().right}"
        " > ${right}`); }"
    )


def test_quickstart_explorer_shows_the_answer_at_two_window_sizes(
    page: Any, quickstart: RanNotebook
) -> None:
    """In the quickstart JupyterLab ran, the explorer fits 1280x900 and 1024x768 with the
    side panel open, keeps its answer in view, follows input changes, takes Enter in the
    search, shows bad input in place, and groups its kernels tab."""
    (ARTIFACTS / "failure.png").unlink(missing_ok=True)
    set_size(page, SIZES[0])
    quickstart.activate()
    try:
        explorer = page.locator(EXPLORER)
        explorer.evaluate("element => element.scrollIntoView()")
        # the line shown while it opened is emptied: nothing shows above the explorer
        outputs = page.locator(".jp-CodeCell", has=explorer).locator(".jp-OutputArea-output")
        shown = outputs.evaluate_all("els => els.map(e => [e.innerText, e.offsetHeight])")
        assert all(text == "" and height < 8 for text, height in shown[:-1]), shown
        assert sorted(page.eval_on_selector_all(PATH_NODES, PATH_TITLES)) == [
            "AutogradCPU",
            "CPU",
        ]
        summary = explorer.locator(".opmagic-summary")
        assert "AutogradCPU → CPU · CPU: runs custom_op impl scale" in " ".join(
            summary.inner_text().split()
        )
        for width, height in SIZES:
            set_size(page, (width, height))
            _assert_fits(page, (width, height))
            explorer.evaluate("element => element.scrollIntoView()")
            page.screenshot(path=str(ARTIFACTS / f"explorer-{width}x{height}.png"))

        explorer.locator(".opmagic-arg-x .opmagic-device select").select_option("meta")
        page.wait_for_function(
            f"() => [...document.querySelectorAll('{PATH_NODES}')]"
            ".some(title => title.textContent === 'Meta')",
            timeout=REDRAW_S * 1000,
        )
        assert sorted(page.eval_on_selector_all(PATH_NODES, PATH_TITLES)) == [
            "AutogradMeta",
            "Meta",
        ]
        # the summary line is a widget of its own: its update may land after the path's
        summary.get_by_text("AutogradMeta → Meta").wait_for(timeout=REDRAW_S * 1000)
        _assert_fits(page, SIZES[-1])
        page.screenshot(path=str(ARTIFACTS / "explorer-meta-1024x768.png"))

        # bad input: the message where the answer was, the page where it was
        shape = explorer.locator(".opmagic-arg-x .opmagic-shape input")
        shape.scroll_into_view_if_needed()
        before = _rect(shape)["top"]
        shape.fill("2, x")
        shape.press("Enter")
        message = explorer.locator(".opmagic-message")
        message.get_by_text("shape").wait_for(timeout=REDRAW_S * 1000)
        assert abs(_rect(shape)["top"] - before) < 60, "the page jumped"
        assert explorer.locator(".opmagic-path .opmagic-stale svg").count() == 1
        box = _rect(message)
        assert box["top"] >= 0 and box["bottom"] <= SIZES[-1][1]
        page.screenshot(path=str(ARTIFACTS / "explorer-bad-shape-1024x768.png"))
        shape.fill("3")
        shape.press("Enter")
        explorer.locator(".opmagic-path svg").first.wait_for(timeout=REDRAW_S * 1000)
        page.wait_for_function(
            "() => !document.querySelector('.opmagic-path .opmagic-stale')",
            timeout=REDRAW_S * 1000,
        )

        # the kernels tab: one row per kernel of the op's own, as the diagram groups them
        explorer.locator(".lm-TabBar-tab", has_text="kernels").click()
        kernels = explorer.locator(".opmagic-kernels tr")
        kernels.first.wait_for()
        assert kernels.filter(has_text="via Autograd").count() == 1
        assert kernels.count() <= 6
        tab = explorer.locator(".widget-tab-contents").first
        assert _overflows(tab) == {"x": False, "y": False}, _sticking_out(tab)
        kernels.last.scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / "explorer-kernels-1024x768.png"))

        # the trace tab: the sample call run and traced, its tree and surprises
        explorer.locator(".lm-TabBar-tab", has_text="trace").click()
        explorer.get_by_role("button", name="trace this call").click()
        trace = explorer.locator(".opmagic-trace")
        trace.get_by_text("operator call").first.wait_for(timeout=TRACE_S * 1000)
        assert "scale" in trace.inner_text()
        assert _overflows(tab) == {"x": False, "y": False}, _sticking_out(tab)
        trace.locator(".calls-pane").scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / "explorer-trace-1024x768.png"))
        explorer.locator(".lm-TabBar-tab", has_text="path").click()

        # Enter in the search takes the first match
        search = explorer.locator("input[placeholder^='search operators']")
        search.scroll_into_view_if_needed()
        search.fill("addm")
        search.press("Enter")
        summary.get_by_text("aten::addmm.default").wait_for(timeout=REDRAW_S * 1000)
        _assert_fits(page, SIZES[-1])
        page.screenshot(path=str(ARTIFACTS / "explorer-addmm-1024x768.png"))
    except Exception:
        page.screenshot(path=str(ARTIFACTS / "failure.png"))  # what the page showed
        raise
