"""The trace's HTML views in a real browser at 592 px, the width a notebook's output gets in a
1024x768 JupyterLab window with the file browser open: every row of the tree keeps its time
in view (long rows are cut with an ellipsis, their text in the tooltip), nothing scrolls
sideways, the surprises and a comparison wrap to the width, an empty trace says so.

Debian's Chromium draws the views on a page of their own (the notebooks in JupyterLab are the
lab test's); the screenshot lands in build/browser/trace-592.png.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import opmagic
from opmagic.view.trace import EMPTY

from .test_explorer_in_jupyterlab import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, sync_playwright

__all__ = ["sync_playwright"]  # the fixture, shared with the JupyterLab test

pytestmark = pytest.mark.slow

WIDTH = 592


def _views() -> str:
    """A training step's trace (forward, backward, modules, long rows, surprises), a
    comparison that diverges, and an empty trace, as a notebook shows them one under the
    other."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    x = torch.randn(2, 8, 32)

    @torch.library.custom_op("opmagic_browser::clip", mutates_args=())
    def clip(v: torch.Tensor) -> torch.Tensor:  # no fake impl: a surprise to show
        return v.clamp(-1, 1)

    clip.register_autograd(lambda ctx, grad: grad)

    def step(scale: float) -> torch.Tensor:
        loss = clip(layer(x) * scale).square().mean()
        loss.backward()
        return loss

    traced = opmagic.trace(step, 1.0, values=True)
    other = opmagic.trace(step, 1.5, values=True)
    views = [
        traced._repr_html_(),
        opmagic.compare_traces(traced, other)._repr_html_(),
        opmagic.trace(lambda: None)._repr_html_(),
    ]
    return "".join(f'<div class="output">{view}</div>' for view in views)


def test_trace_views_fit_592_pixels(sync_playwright: Any, tmp_path: Path) -> None:
    page_file = tmp_path / "trace.html"
    page_file.write_text(
        '<html><head><meta charset="utf-8"></head><body style="margin:0">'
        f'<div id="out" style="width:{WIDTH}px">{_views()}</div></body></html>',
        encoding="utf-8",
    )
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            page = browser.new_page(viewport={"width": 800, "height": 900})
            page.goto(page_file.as_uri())
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "trace-592.png"))
            right = page.evaluate("document.getElementById('out').getBoundingClientRect().right")
            rows = page.evaluate(
                """() => [...document.querySelectorAll('.row')].map(row => {
                    const time = row.querySelector('.time').getBoundingClientRect();
                    return {right: time.right, width: time.width, text: row.textContent};
                })"""
            )
            assert len(rows) > 100
            cut = [row["text"] for row in rows if row["right"] > right + 0.5 or row["width"] == 0]
            assert not cut, f"{len(cut)} rows have their time out of view: {cut[:3]}"
            panes = page.evaluate(
                """() => [...document.querySelectorAll('.calls-pane')].map(
                    pane => pane.scrollWidth - pane.clientWidth)"""
            )
            assert panes and max(panes) <= 0  # nothing to scroll sideways
            tables = page.evaluate(
                """() => [...document.querySelectorAll('table.wraps')].map(
                    table => table.getBoundingClientRect().right)"""
            )
            assert len(tables) == 2 and max(tables) <= right + 0.5  # surprises, comparison
            assert page.get_by_text(EMPTY).count() == 1
        finally:
            browser.close()
