"""A real browser: JupyterLab runs the quickstart, the explorer draws, fits the window and
follows its inputs.

JupyterLab listens on 127.0.0.1 with a token, in a temporary directory holding a copy of
the quickstart; Debian's Chromium (never a browser Playwright downloads) drives it, at
1280x900 and at 1024x768 with the file browser open. The screenshots (the explorer at each
step, every quickstart output with a diagram or a table, the page when a check fails) land
in build/browser/: look at them after changing a view. Without Chromium or Playwright the
test skips, except in CI (CI=true), where both are installed by .ci/run and a missing one
must fail.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # starts JupyterLab and a browser

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "build" / "browser"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
SERVER_START_S = 90
PAGE_S = 90  # JupyterLab loading, the kernel starting
RUN_ALL_S = 240  # every quickstart cell (torch import, diagrams, kernels of aten)
REDRAW_S = 60
TRACE_S = 180  # the first trace may wait for its observer to finish compiling
PATH_TITLES = "els => els.map(e => e.textContent)"
PATH_NODES = ".opmagic-explorer .opmagic-path svg g.node.path > title"


def _required(available: bool, what: str) -> None:
    """Skip without ``what`` on a developer machine; in CI it is installed, so fail."""
    if available:
        return
    message = f"{what} is not installed (bash .ci/run installs it)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@dataclass(frozen=True)
class Lab:
    """A running JupyterLab: where it serves, with which token, from which directory."""

    url: str
    token: str
    root: Path


def _free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _api(lab: Lab, path: str, method: str = "GET") -> int:
    """Call JupyterLab's REST API; returns the HTTP status."""
    request = urllib.request.Request(f"{lab.url}{path}?token={lab.token}", method=method)
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    """JupyterLab on 127.0.0.1 serving a copy of the quickstart; stopped with its kernels."""
    root = tmp_path / "lab"
    settings = root / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(
        '{"fetchNews": "false", "checkForUpdates": false}'  # no news prompt over the page
    )
    shutil.copy(ROOT / "notebooks" / "quickstart.ipynb", root)
    port, token = _free_port(), os.urandom(16).hex()
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        JUPYTER_CONFIG_DIR=str(root / "config"),
        JUPYTER_RUNTIME_DIR=str(root / "runtime"),
    )
    command = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--allow-root",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.extension_manager=readonly",
        f"--LabApp.user_settings_dir={root / 'settings'}",
        f"--LabApp.workspaces_dir={root / 'workspaces'}",
    ]
    log_path = tmp_path / "jupyterlab.log"
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    lab = Lab(f"http://127.0.0.1:{port}", token, root)
    try:
        _wait_until_serving(lab, server, log_path)
        yield lab
    finally:
        _stop(lab, server)


def _wait_until_serving(lab: Lab, server: subprocess.Popen, log_path: Path) -> None:
    """Poll /api/status until it answers; fail with the server's log if it dies or hangs."""
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"JupyterLab exited ({server.returncode}):\n{log_path.read_text()}")
        try:
            if _api(lab, "/api/status") == 200:
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.2)
    pytest.fail(f"JupyterLab did not serve within {SERVER_START_S} s:\n{log_path.read_text()}")


def _stop(lab: Lab, server: subprocess.Popen) -> None:
    """Ask JupyterLab to shut down (it stops its kernels); end its process group if it hangs."""
    if server.poll() is None:
        try:
            _api(lab, "/api/shutdown", method="POST")
            server.wait(timeout=30)
        except (urllib.error.URLError, ConnectionError, TimeoutError, subprocess.TimeoutExpired):
            os.killpg(server.pid, signal.SIGTERM)  # the group this fixture started: server, kernels
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()


@pytest.fixture
def sync_playwright() -> Any:
    """Playwright's entry point, once Chromium and Playwright are known to be there."""
    _required(os.path.exists(CHROMIUM), f"Debian's Chromium ({CHROMIUM})")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _required(False, "The playwright Python package")
    return sync_playwright


EXPLORER = ".opmagic-explorer"
SIZES = [(1280, 900), (1024, 768)]  # a laptop; a small screen with the file browser open


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


def _open_file_browser(page: Any) -> None:
    """JupyterLab's side panel with the file browser, open (it takes ~250 px of width)."""
    if not page.locator("#filebrowser").is_visible():
        page.locator('.jp-SideBar [data-id="filebrowser"]').first.click()
    page.wait_for_selector("#filebrowser", state="visible")


def test_quickstart_explorer_shows_the_answer_at_two_window_sizes(
    sync_playwright: Any, lab: Lab, tmp_path: Path
) -> None:
    """Run the quickstart in JupyterLab; the explorer fits 1280x900 and 1024x768 with the
    side panel open, keeps its answer in view, follows input changes, takes Enter in the
    search, shows bad input in place, and groups its kernels tab."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "failure.png").unlink(missing_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch_persistent_context(
            user_data_dir=str(tmp_path / "chromium-profile"),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": SIZES[0][0], "height": SIZES[0][1]},
        )
        try:
            page = browser.new_page()
            page.goto(f"{lab.url}/lab/tree/quickstart.ipynb?token={lab.token}")
            page.wait_for_selector(".jp-NotebookPanel", timeout=PAGE_S * 1000)
            page.wait_for_selector("#jp-main-statusbar >> text=Idle", timeout=PAGE_S * 1000)
            _open_file_browser(page)

            page.locator(".lm-MenuBar-item", has_text="Run").first.click()
            page.locator('li[data-command="runmenu:run-all"]').click()
            page.wait_for_selector(PATH_NODES, state="attached", timeout=RUN_ALL_S * 1000)
            page.wait_for_selector("#jp-main-statusbar >> text=Idle", timeout=RUN_ALL_S * 1000)
            assert page.locator(".jp-OutputArea-output", has_text="Traceback").count() == 0
            _screenshot_outputs(page)

            explorer = page.locator(EXPLORER)
            explorer.evaluate("element => element.scrollIntoView()")
            assert sorted(page.eval_on_selector_all(PATH_NODES, PATH_TITLES)) == [
                "AutogradCPU",
                "CPU",
            ]
            summary = explorer.locator(".opmagic-summary")
            assert "AutogradCPU → CPU · CPU: runs custom_op impl scale" in " ".join(
                summary.inner_text().split()
            )
            for width, height in SIZES:
                page.set_viewport_size({"width": width, "height": height})
                _open_file_browser(page)
                page.wait_for_timeout(500)  # JupyterLab lays the panels out again
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
            assert "AutogradMeta → Meta" in summary.inner_text()
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
            page.screenshot(path=str(ARTIFACTS / "explorer-kernels-1024x768.png"))

            # the trace tab: the sample call run and traced, its tree and surprises
            explorer.locator(".lm-TabBar-tab", has_text="trace").click()
            explorer.get_by_role("button", name="trace this call").click()
            trace = explorer.locator(".opmagic-trace")
            trace.get_by_text("operator call").first.wait_for(timeout=TRACE_S * 1000)
            assert "scale" in trace.inner_text()
            tab = explorer.locator(".widget-tab-contents").first
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
        finally:
            browser.close()


def _screenshot_outputs(page: Any) -> None:
    """Each quickstart output that shows a diagram or a table, as it looks in the notebook."""
    outputs = page.locator(".jp-OutputArea-output:has(svg), .jp-OutputArea-output:has(table)")
    for number in range(outputs.count()):
        output = outputs.nth(number)
        output.scroll_into_view_if_needed()
        output.screenshot(path=str(ARTIFACTS / f"quickstart-output-{number}.png"))
