"""One JupyterLab server and one Chromium for the browser tests, and notebooks run in them.

JupyterLab listens on 127.0.0.1 with a token, serving a temporary directory that holds a copy
of every notebook in notebooks/; its kernels inherit this checkout on ``PYTHONPATH`` and the
run's build cache (``XDG_CACHE_HOME``, so a build the notebook tests made is not made again).
Debian's Chromium (never a browser Playwright downloads) drives it. Notebooks open in one page,
in turn, each in a fresh kernel that is shut down after its test (the quickstart's stays up for
the explorer test). The page exposes JupyterLab's application (``window.jupyterapp``), through
which a test runs "Run All" as the menu does, waits for it to end, and reads each cell's model.

Without Chromium or Playwright the tests skip, except in CI (CI=true), where both are
installed by .ci/run and a missing one must fail. Screenshots land in build/browser/.
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

from ..notebooks.lab_runs import RAN_IN_LAB

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
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
SIZES = [(1280, 900), (1024, 768)]  # a laptop; a small screen with the file browser open
SERVER_START_S = 90
PAGE_S = 120  # JupyterLab loading, a kernel starting
RUN_ALL_S = 900  # a notebook's every cell on a loaded 2-core machine (C++ builds, Inductor)


def required(available: bool, what: str) -> None:
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


@pytest.fixture(scope="session")
def lab(build_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """JupyterLab on 127.0.0.1 serving copies of the notebooks; stopped with its kernels."""
    base = tmp_path_factory.mktemp("jupyterlab")
    root = base / "lab"
    settings = root / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(
        '{"fetchNews": "false", "checkForUpdates": false}'  # no news prompt over the page
    )
    notebook_settings = root / "settings" / "@jupyterlab" / "notebook-extension"
    notebook_settings.mkdir(parents=True)
    (notebook_settings / "tracker.jupyterlab-settings").write_text(
        '{"windowingMode": "none"}'  # every cell laid out, so that outputs can be measured
    )
    for notebook in NOTEBOOKS:
        shutil.copy(notebook, root)
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
        "--LabApp.expose_app_in_browser=True",  # window.jupyterapp: commands and models
        f"--LabApp.user_settings_dir={root / 'settings'}",
        f"--LabApp.workspaces_dir={root / 'workspaces'}",
    ]
    log_path = base / "jupyterlab.log"
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


@pytest.fixture(scope="session")
def playwright() -> Iterator[Any]:
    """Playwright, started once for the run, once Chromium and Playwright are known to be
    there (its sync API runs one instance per thread)."""
    required(os.path.exists(CHROMIUM), f"Debian's Chromium ({CHROMIUM})")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        required(False, "The playwright Python package")
    with sync_playwright() as started:
        yield started


@pytest.fixture(scope="session")
def page(playwright: Any, lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """JupyterLab loaded in Debian's Chromium at 1280x900, its file browser open."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser = playwright.chromium.launch_persistent_context(
        user_data_dir=str(tmp_path_factory.mktemp("chromium-profile")),
        executable_path=CHROMIUM,
        headless=True,
        args=CHROMIUM_ARGS,
        viewport={"width": SIZES[0][0], "height": SIZES[0][1]},
    )
    try:
        page = browser.new_page()
        page.goto(f"{lab.url}/lab?token={lab.token}")
        page.wait_for_function("() => window.jupyterapp?.shell", timeout=PAGE_S * 1000)
        page.wait_for_selector(".jp-LabShell", timeout=PAGE_S * 1000)
        open_file_browser(page)
        yield page
    finally:
        browser.close()


def open_file_browser(page: Any) -> None:
    """JupyterLab's side panel with the file browser, open (it takes ~250 px of width)."""
    if not page.locator("#filebrowser").is_visible():
        page.locator('.jp-SideBar [data-id="filebrowser"]').first.click()
    page.wait_for_selector("#filebrowser", state="visible")


def set_size(page: Any, size: tuple[int, int]) -> None:
    """The window at ``size``, the file browser open, JupyterLab laid out again."""
    page.set_viewport_size({"width": size[0], "height": size[1]})
    open_file_browser(page)
    page.wait_for_timeout(500)


@dataclass(frozen=True)
class CodeCell:
    """A code cell of a notebook JupyterLab ran, as its model holds it."""

    index: int  # among the notebook's code cells
    source: str
    tags: tuple[str, ...]
    execution_count: int | None
    outputs: tuple[str, ...]  # "display_data", "stream", "error: Name: message", ...

    @property
    def errors(self) -> list[str]:
        """The error outputs the cell shows."""
        return [output for output in self.outputs if output.startswith("error")]


# the code cells of the notebook in the main area, from its model
_CODE_CELLS = """() => {
  const panel = window.jupyterapp.shell.currentWidget;
  return panel.content.widgets.filter(cell => cell.model.type === 'code').map(cell => ({
    source: cell.model.sharedModel.getSource(),
    tags: cell.model.getMetadata('tags') || [],
    execution_count: cell.model.executionCount,
    outputs: cell.model.outputs.toJSON().map(output => output.output_type === 'error'
      ? `error: ${output.ename}: ${output.evalue}` : output.output_type),
  }));
}"""

# waits for the kernel of the notebook in the main area to be idle, failing after `ms`
_IDLE = """async function idle(panel, ms, what) {
  const deadline = Date.now() + ms;
  while (panel.sessionContext.session?.kernel?.status !== 'idle') {
    if (Date.now() > deadline) throw new Error(`${what}: not done after ${ms / 1000} s`);
    await new Promise(resolve => setTimeout(resolve, 100));
  }
}"""

# opens a notebook with a kernel of its own, waits until the kernel is idle
_OPEN = f"""async ([path, ms]) => {{
  {_IDLE}
  const app = window.jupyterapp;
  const panel = await app.commands.execute('docmanager:open', {{path, factory: 'Notebook'}});
  await panel.context.ready;
  await panel.sessionContext.ready;
  await idle(panel, ms, `starting the kernel of ${{path}}`);
  app.shell.activateById(panel.id);
}}"""

# "Run All" as the Run menu runs it; resolves once every cell has run (or the run stopped).
# JupyterLab's run ends at the first error reply, while the kernel goes on with the cells
# queued after a cell tagged raises-exception: every cell's request is awaited instead.
_RUN_ALL = f"""async ms => {{
  {_IDLE}
  const app = window.jupyterapp;
  const panel = app.shell.currentWidget;
  const what = `Run All of ${{panel.context.path}}`;
  const late = new Promise((_, fail) => setTimeout(
    () => fail(new Error(`${{what}}: not done after ${{ms / 1000}} s`)), ms));
  const ran = app.commands.execute('notebook:run-all-cells');
  await Promise.race([ran, late]);
  const requests = panel.content.widgets
    .filter(cell => cell.model.type === 'code' && cell.outputArea.future)
    .map(cell => cell.outputArea.future.done);
  await Promise.race([Promise.allSettled(requests), late]);
  await idle(panel, 60000, what);
}}"""

# sets a cell's source (a new cell at the end for index null), runs it as Shift+Enter does
# (its id sent along), and returns its execution count and what each output shows as text
_RUN_CELL = f"""async ([index, source, ms]) => {{
  {_IDLE}
  const app = window.jupyterapp;
  const panel = app.shell.currentWidget;
  const notebook = panel.content;
  if (index === null) {{
    notebook.model.sharedModel.insertCell(notebook.widgets.length, {{cell_type: 'code', source}});
    index = notebook.widgets.length - 1;
  }} else {{
    notebook.widgets[index].model.sharedModel.setSource(source);
  }}
  notebook.activeCellIndex = index;
  await app.commands.execute('notebook:run-cell');
  const cell = notebook.widgets[index];
  if (cell.outputArea.future) await cell.outputArea.future.done.catch(() => null);
  await idle(panel, ms, `running cell ${{index}}`);
  return {{
    index,
    execution_count: cell.model.executionCount,
    outputs: cell.model.outputs.toJSON().map(output =>
      output.output_type === 'error' ? `error: ${{output.ename}}: ${{output.evalue}}`
      : output.output_type === 'stream' ? output.text
      : (output.data || {{}})['text/plain'] || ''),
  }};
}}"""

# the notebook in the main area as JupyterLab would save it (nbformat JSON, outputs included)
_CONTENT = "() => window.jupyterapp.shell.currentWidget.context.model.toJSON()"

# closes the notebook in the main area and shuts its kernel down
_CLOSE = """async () => {
  const panel = window.jupyterapp.shell.currentWidget;
  await panel.sessionContext.shutdown();
  panel.dispose();
}"""


@dataclass
class RanNotebook:
    """A notebook JupyterLab has opened in a fresh kernel and run with "Run All"."""

    name: str
    page: Any
    seconds: float  # how long "Run All" took

    def cells(self) -> list[CodeCell]:
        """Its code cells, from JupyterLab's model of it."""
        self.activate()
        return [
            CodeCell(
                index, c["source"], tuple(c["tags"]), c["execution_count"], tuple(c["outputs"])
            )
            for index, c in enumerate(self.page.evaluate(_CODE_CELLS))
        ]

    def activate(self) -> None:
        """Make it the notebook in the main area again."""
        self.page.evaluate(
            "name => { const app = window.jupyterapp; const panel = [...app.shell.widgets('main')]"
            ".find(w => w.context?.path === name); app.shell.activateById(panel.id); }",
            f"{self.name}.ipynb",
        )

    def run_cell(self, source: str, index: int | None = None) -> dict[str, Any]:
        """Run ``source`` as the cell at ``index`` (among all of its cells; a new cell at the
        end when None), as Shift+Enter runs it: ``{"index", "execution_count", "outputs"}``,
        the outputs as text."""
        self.activate()
        return self.page.evaluate(_RUN_CELL, [index, source, PAGE_S * 1000])

    def close(self) -> None:
        """Shut its kernel down and close it."""
        self.activate()
        self.page.evaluate(_CLOSE)


def run_all(page: Any, name: str) -> RanNotebook:
    """Open ``notebooks/<name>.ipynb`` in a fresh kernel and run every cell as "Run All"
    does; returns once the run has ended, its outputs recorded for the notebook tests
    (:data:`~tests.notebooks.lab_runs.RAN_IN_LAB`)."""
    page.evaluate(_OPEN, [f"{name}.ipynb", PAGE_S * 1000])
    started = time.monotonic()
    page.evaluate(_RUN_ALL, RUN_ALL_S * 1000)
    seconds = time.monotonic() - started
    RAN_IN_LAB[name] = page.evaluate(_CONTENT)  # what the notebook tests read
    return RanNotebook(name, page, seconds)


@pytest.fixture(scope="session")
def quickstart(page: Any) -> Iterator[RanNotebook]:
    """The quickstart, run once in JupyterLab; its kernel stays up for the explorer."""
    notebook = run_all(page, "quickstart")
    yield notebook
    notebook.close()
