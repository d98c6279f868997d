"""The notebooks JupyterLab ran in this test process, as it holds them after "Run All".

The browser tests (tests/browser/) run every notebook with "Run All" in JupyterLab and record
its model here (what saving it would write: ``nbformat`` JSON with every output); the notebook
tests then read those outputs instead of running each notebook a second time, in nbclient.
Under pytest-xdist both directories are one group (tests/conftest.py), and the browser's tests
are collected first.
"""

from __future__ import annotations

from typing import Any

RAN_IN_LAB: dict[str, dict[str, Any]] = {}  # notebook name -> its model's JSON after Run All
