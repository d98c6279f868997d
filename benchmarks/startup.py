"""What opmagic adds to a session's start: ``import opmagic`` and ``%load_ext opmagic``,
against ``import torch`` measured in the same processes.

    python benchmarks/startup.py [--repeat N] [--short]

Targets (issue 26), on a quiet machine:

- ``import opmagic`` after ``import torch`` adds <= 0.3 s;
- ``%load_ext opmagic`` (opmagic imported already, as a notebook's first cell does) takes
  <= 0.3 s.

That ``import opmagic`` imports none of pandas, matplotlib, torch.utils.benchmark, graphviz,
ipywidgets, IPython or setuptools (they load when first used) is a test's:
``tests/test_imports.py``.

Each figure is the CPU time (user + system of the process and of the processes it waited
for) of the step alone, measured in a fresh Python process; the baseline, ``import torch``,
is measured in the same processes. Runs are repeated and the medians printed: on a machine
shared with other work, wall times follow the others' load, CPU times much less. The
bytecode caches (``__pycache__``) are written first, as every installed package has them;
``%load_ext``'s warm-ups (precompiled headers, trace's observer) run once in this cache
before the figures are taken, so that they find their work done, as in every session after
a user's first. Exit status 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_SECONDS = 0.3

CPU_TIME = textwrap.dedent(
    """
    import resource
    def cpu():
        used = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
        return sum(u.ru_utime + u.ru_stime for u in used)
    """
)
IMPORT_CHILD = CPU_TIME + textwrap.dedent(
    """
    import json
    started = cpu()
    import torch
    torch_done = cpu()
    import opmagic
    print(json.dumps({"torch": torch_done - started, "opmagic": cpu() - torch_done}))
    """
)
LOAD_EXT_CHILD = CPU_TIME + textwrap.dedent(
    """
    import json
    started = cpu()
    import torch
    torch_done = cpu()
    import opmagic
    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance()
    before = cpu()
    shell.run_line_magic("load_ext", "opmagic")
    print(json.dumps({"torch": torch_done - started, "load_ext": cpu() - before}))
    """
)
# what %load_ext starts in the background, done and waited for (once, before the figures)
WARM_CHILD = textwrap.dedent(
    """
    from IPython.core.interactiveshell import InteractiveShell
    from opmagic import precompile_headers
    from opmagic._torch import op_observer
    InteractiveShell.instance().run_line_magic("load_ext", "opmagic")
    precompile_headers()
    op_observer.enum_tables()  # loads it, built first where missing
    """
)


def child(code: str, *, write_bytecode: bool = False) -> dict:
    """Run ``code`` in a fresh Python (this checkout's opmagic first); its JSON report."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    if write_bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    if result.returncode != 0:
        raise SystemExit(f"benchmark child failed:\n{result.stderr}")
    lines = result.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else {}


def main() -> int:
    """Measure, print each figure against ``import torch``, and return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=9, help="fresh processes per figure")
    parser.add_argument("--short", action="store_true", help="3 processes per figure")
    options = parser.parse_args()
    repeat = 3 if options.short else options.repeat
    child(IMPORT_CHILD, write_bytecode=True)  # writes the bytecode caches
    child(WARM_CHILD, write_bytecode=True)
    imports = [child(IMPORT_CHILD) for _ in range(repeat)]
    loads = [child(LOAD_EXT_CHILD) for _ in range(repeat)]
    torch_seconds = statistics.median([r["torch"] for r in imports + loads])
    added = statistics.median(r["opmagic"] for r in imports)
    load_ext = statistics.median(r["load_ext"] for r in loads)
    print(
        f"CPU seconds (process + waited-for children), medians of {repeat} fresh processes; "
        f"{len(os.sched_getaffinity(0))} CPUs"
    )
    print(f"  {'import torch (BASELINE)':<44} {torch_seconds:6.3f} s  1.00x")
    rows = [
        ("import opmagic, after import torch", added, added <= TARGET_SECONDS),
        ("%load_ext opmagic, after import opmagic", load_ext, load_ext <= TARGET_SECONDS),
    ]
    for name, seconds, ok in rows:
        print(
            f"  {name:<44} {seconds:6.3f} s  {seconds / torch_seconds:4.2f}x  "
            f"target <= {TARGET_SECONDS} s: {'PASS' if ok else 'FAIL'}"
        )
    return 0 if all(ok for *_, ok in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
