"""What keying builds on content costs, on a torch/extension.h cell (~5,400 headers).

    python benchmarks/build_inputs.py

Builds (or takes from a private cache) the tutorial's myadd written with
``#include <torch/extension.h>``, then, each in a fresh process (so no digest is remembered
yet), times what a build does after it compiled and what a cached build's check does:

- recording the inputs: hashing every file the build read (``record_files``), against the
  baseline of opmagic before builds were keyed on content, a stat of each file (size and mtime);
- checking a cached build (``_recorded_build``: every input's stat, the include search's
  misses), against that same stat of each file;
- hashing them again in the same process (remembered per file identity: nothing to do).

The figures are CPU time (user + system) of the timed step; the hashing is also put against
the build's own compile time (wall: CPU time of the compiler is not reported by the build).
Exit status 1 when recording costs more than 5% of the compile.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = textwrap.dedent(
    """\
    #include <torch/extension.h>

    torch::Tensor myadd(const torch::Tensor& a, const torch::Tensor& b) { return a + b; }

    TORCH_LIBRARY(bi_bench, m) { m.def("myadd(Tensor a, Tensor b) -> Tensor"); }
    TORCH_LIBRARY_IMPL(bi_bench, CPU, m) { m.impl("myadd", myadd); }
    """
)
BUILD = textwrap.dedent(
    """
    import json, sys
    from opmagic import compile_library
    library = compile_library(sys.stdin.read(), progress=None)
    print(json.dumps({"directory": str(library.build.directory),
                      "compile_seconds": library.build.compile_seconds}))
    """
)
TIMED = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    from opmagic.native.inputs import record_files
    from opmagic.native.pipeline import _recorded_build
    directory = Path(sys.argv[1])
    record = json.loads((directory / "build.json").read_text())
    paths = [entry["path"] for entry in record["inputs"]]
    name = next(p.name for p in directory.glob("lib*.so"))

    def cpu(step):
        started = os.times()
        step()
        ended = os.times()
        return ended.user + ended.system - started.user - started.system

    figures = {"files": len(paths), "megabytes": sum(os.path.getsize(p) for p in paths) / 1e6}
    figures["stat"] = cpu(lambda: [os.stat(p) for p in paths])
    figures["record"] = cpu(lambda: record_files(paths, time.time_ns() + 10**12))
    figures["record again"] = cpu(lambda: record_files(paths, time.time_ns() + 10**12))
    figures["check"] = cpu(lambda: _recorded_build(directory, name))
    print(json.dumps(figures))
    """
)


def _run(script: str, *args: str, stdin: str = "", env: dict[str, str]) -> dict:
    """Run ``script`` in a fresh Python; its last line of output, as JSON."""
    result = subprocess.run(
        [sys.executable, "-c", script, *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return json.loads(result.stdout.splitlines()[-1])


def main() -> int:
    """Build once, time in three fresh processes, print the medians; 1 when over budget."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "XDG_CACHE_HOME": cache, "PYTHONPATH": str(ROOT)}
        built = _run(BUILD, stdin=SOURCE, env=env)
        runs = [_run(TIMED, built["directory"], env=env) for _ in range(3)]
    median = {key: sorted(run[key] for run in runs)[1] for key in runs[0]}
    compile_seconds = built["compile_seconds"]
    print(f"inputs of a torch/extension.h cell: {median['files']:.0f} files, "
          f"{median['megabytes']:.1f} MB (CPU seconds, median of 3 fresh processes)")
    print(f"  stat of each (opmagic keyed on mtimes): {median['stat']:.3f} s")
    share = median["record"] / compile_seconds
    print(f"  recording them by content, once per process: {median['record']:.3f} s "
          f"({median['record'] / max(median['stat'], 1e-9):.1f}x the stat; "
          f"{share:.1%} of the compile's {compile_seconds:.1f} s wall)")
    print(f"  recording them again in the same process: {median['record again']:.3f} s")
    print(f"  checking the cached build: {median['check']:.3f} s "
          f"({median['check'] / max(median['stat'], 1e-9):.1f}x the stat)")
    return 0 if median["record"] <= 0.05 * compile_seconds else 1


if __name__ == "__main__":
    raise SystemExit(main())
