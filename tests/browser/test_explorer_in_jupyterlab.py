"""A real browser: JupyterLab runs the quickstart, the explorer draws, an input changes the path.

JupyterLab listens on 127.0.0.1 with a token, in a temporary directory holding a copy of
the quickstart; Debian's Chromium (never a browser Playwright downloads) drives it. The
screenshots land in build/browser/. Without Chromium or Playwright the test skips, except
in CI (CI=true), where both are installed by .ci/run and a missing one must fail.
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


def test_quickstart_explorer_draws_and_redraws_the_path(
    sync_playwright: Any, lab: Lab, tmp_path: Path
) -> None:
    """Run the quickstart in JupyterLab; the explorer's path SVG follows an input change."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch_persistent_context(
            user_data_dir=str(tmp_path / "chromium-profile"),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1800},
        )
        try:
            page = browser.new_page()
            page.goto(f"{lab.url}/lab/tree/quickstart.ipynb?token={lab.token}")
            page.wait_for_selector(".jp-NotebookPanel", timeout=PAGE_S * 1000)
            page.wait_for_selector("#jp-main-statusbar >> text=Idle", timeout=PAGE_S * 1000)

            page.locator(".lm-MenuBar-item", has_text="Run").first.click()
            page.locator('li[data-command="runmenu:run-all"]').click()
            page.wait_for_selector(PATH_NODES, state="attached", timeout=RUN_ALL_S * 1000)
            page.wait_for_selector("#jp-main-statusbar >> text=Idle", timeout=RUN_ALL_S * 1000)
            assert page.locator(".jp-OutputArea-output", has_text="Traceback").count() == 0

            explorer = page.locator(".opmagic-explorer")
            explorer.evaluate("element => element.scrollIntoView()")
            assert sorted(page.eval_on_selector_all(PATH_NODES, PATH_TITLES)) == [
                "AutogradCPU",
                "CPU",
            ]
            page.screenshot(path=str(ARTIFACTS / "explorer-cpu.png"))

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
            assert (
                "AutogradMeta → Meta"
                in explorer.locator(".widget-html").all_inner_texts()[-0:].__str__()
            )
            page.screenshot(path=str(ARTIFACTS / "explorer-meta.png"))
        finally:
            browser.close()
