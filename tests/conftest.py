"""Fixtures shared by the test packages."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def build_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private opmagic build cache for the whole run (``XDG_CACHE_HOME`` points at it).

    Shared by every test that compiles, and inherited by the processes and notebook kernels
    they start, so each precompiled header set is built once per run, never in the user's
    own cache.
    """
    root = tmp_path_factory.mktemp("xdg-cache")
    previous = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(root)
    yield root
    if previous is None:
        del os.environ["XDG_CACHE_HOME"]
    else:
        os.environ["XDG_CACHE_HOME"] = previous
