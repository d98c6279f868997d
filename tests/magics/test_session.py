"""The session's cell hooks under Ctrl-C: a real SIGINT delivered inside ``pre_run_cell`` or
``post_run_cell`` (at the worst moment of each: after the previous run's kernels were taken
off, before the cell's run was recorded) lets the hook finish, then reaches the user. Each
case runs in a child process (a real signal, a real IPython shell), with its own time limit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ..native.sources import op_source

ROOT = Path(__file__).resolve().parents[2]

# runs the cells on stdin (JSON: [[cell, interrupt], ...]); interrupt: "pre", "post" or ""
# sends SIGINT to the process at that point of the hook; prints one JSON line per cell
_CHILD = textwrap.dedent(
    """
    import json, os, signal, sys, time
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output
    from opmagic._torch import custom_op_state

    hooks = {"pre": "custom_op_states", "post": "custom_op_changes"}  # begin's, commit's
    originals = {name: getattr(custom_op_state, name) for name in hooks.values()}

    def interrupting(name):
        def call(*args, **kwargs):
            setattr(custom_op_state, name, originals[name])  # once
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # the handler runs here, in the middle of the hook
            return originals[name](*args, **kwargs)
        return call

    shell = InteractiveShell.instance()
    for cell, interrupt in json.loads(sys.stdin.read()):
        if interrupt:
            setattr(custom_op_state, hooks[interrupt], interrupting(hooks[interrupt]))
        with capture_output() as captured:
            result = shell.run_cell(cell, store_history=True)
        error = result.error_before_exec or result.error_in_exec
        shown = captured.stdout + captured.stderr
        print(json.dumps({"error": f"{type(error).__name__}: {error}" if error else None,
                          "interrupted": "KeyboardInterrupt" in shown,
                          "value": repr(result.result)}), flush=True)
    """
)


def _run_cells(cells: list[tuple[str, str]]) -> list[dict]:
    """What each cell did in a fresh IPython shell (see :data:`_CHILD`)."""
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-c", _CHILD],
        input=json.dumps(cells),
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": pythonpath},
        check=False,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


_LOAD = ("%load_ext opmagic\nimport torch\nfrom torch import Tensor", "")
_UNLOAD = ("%unload_ext opmagic", "")
_CUSTOM_OP = "%%custom_op hk::f\ndef f(x: Tensor) -> Tensor:\n    return x + 1\n"
_GONE = ("torch._C._dispatch_find_schema_or_throw('hk::f', '')", "")


@pytest.mark.slow
@pytest.mark.parametrize("hook", ["pre", "post"])
def test_ctrl_c_in_a_hook_leaves_a_torch_library_cell_that_runs_again(build_cache, hook):
    cell = f"%%torch_library\n{op_source('hk_lib')}"
    check = ("torch.ops.hk_lib.scale(torch.ones(1)).item()", "")
    reports = _run_cells([_LOAD, (cell, hook), (cell, ""), check, (cell, ""), _UNLOAD])
    _, interrupted, again, value, third, _ = reports
    assert interrupted["interrupted"], interrupted  # Ctrl-C reached the user, after the hook
    assert again["error"] is None and third["error"] is None, reports
    assert value["value"] == "2.0"


@pytest.mark.slow
@pytest.mark.parametrize("hook", ["pre", "post"])
def test_ctrl_c_in_a_hook_leaves_no_custom_op_after_unload_ext(build_cache, hook):
    reports = _run_cells([_LOAD, (_CUSTOM_OP, ""), (_CUSTOM_OP, hook), _UNLOAD, _GONE])
    assert reports[2]["interrupted"] and reports[2]["error"] is None, reports
    assert reports[-1]["error"].startswith("RuntimeError: Could not find schema for hk::f")
