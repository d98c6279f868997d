"""Build times of compile_library (%%torch_library) against torch's load_inline, same run.

    python benchmarks/compile.py [--repeat N] [--short]

Baselines: ``torch.utils.cpp_extension.load_inline`` (``is_python_module=False``, default
flags, its own build directory), cold, building the same source as the opmagic figure it is
compared with: the tutorial's myadd written with ``#include <torch/extension.h>``; the same
op with minimal includes and ``no_implicit_headers=True``; PyTorch's current tutorial
mymuladd on the LibTorch stable ABI, ``no_implicit_headers=True``.

Targets, as ratios to the baseline of the same source:

- the first cell on an empty cache (no precompiled headers yet: the build starts them in
  the background once it is compiled): <= 0.5x for torch/extension.h, never
  slower than load_inline for the others: <= 1.0x;
- a cold cell after the one-time precompiled headers: <= 0.25x for torch/extension.h, the
  minimal one <= 0.12x of the torch/extension.h baseline, a stable-ABI cell
  <= 1.0x;
- editing one line and re-running: about the cold build of that source or better;
- re-running an unchanged source in a fresh process: <= 0.3 s (load_inline's own hit shown).

Every figure is the wall time of the call alone (compile_library or load_inline, which both
build, load and register), measured in a fresh Python process with private caches and build
directories; opmagic's figures include trying a new build in a child process first. Runs of
a figure and of its baseline alternate, so that a change of load weighs on both alike. Each
figure is printed twice: wall time and CPU time (user + system of the process and of the
processes it waited for: compilers, linker, probe; not the background precompile, which runs
under SCHED_IDLE and outlives the call). Targets are held to the CPU-time ratio: on a
machine shared with other work, wall times follow the others' load, while on an idle one a
build's wall time is its CPU time. Exit status 1 when a target is missed.

``--short``: the torch/extension.h figures alone (first cell, cold cell, their baseline),
one run each.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple

import torch

from opmagic.native.toolchain import find_toolchain

ROOT = Path(__file__).resolve().parents[1]

KERNEL = """
TORCH_LIBRARY(myops, m) {
  m.def("myadd(Tensor self, Tensor other) -> Tensor");
}

Tensor myadd_cpu(const Tensor& self_, const Tensor& other_) {
  TORCH_CHECK(self_.sizes() == other_.sizes());
  TORCH_INTERNAL_ASSERT(self_.device().type() == DeviceType::CPU);
  TORCH_INTERNAL_ASSERT(other_.device().type() == DeviceType::CPU);
  Tensor self = self_.contiguous();
  Tensor other = other_.contiguous();
  Tensor result = EMPTY(self.sizes(), self.options());
  const float* self_ptr = self.data_ptr<float>();
  const float* other_ptr = other.data_ptr<float>();
  float* result_ptr = result.data_ptr<float>();
  for (int64_t i = 0; i < result.numel(); i++) {
    result_ptr[i] = self_ptr[i] + other_ptr[i];
  }
  return result;
}

TORCH_LIBRARY_IMPL(myops, CPU, m) {
  m.impl("myadd", myadd_cpu);
}
"""
EXTENSION_SOURCE = (
    "#include <torch/extension.h>\n\nusing torch::Tensor;\nusing c10::DeviceType;\n"
    + KERNEL.replace("EMPTY", "torch::empty")
)
MINIMAL_SOURCE = (
    "#include <torch/library.h>\n#include <ATen/core/Tensor.h>\n#include <ATen/ops/empty.h>\n\n"
    "using at::Tensor;\nusing c10::DeviceType;\n" + KERNEL.replace("EMPTY", "at::empty")
)
# PyTorch's "Custom C++ and CUDA Operators" tutorial, ABI-stable tab (CPU)
STABLE_SOURCE = """
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/macros/Macros.h>

torch::stable::Tensor mymuladd_cpu(
    const torch::stable::Tensor& a, const torch::stable::Tensor& b, double c) {
  STD_TORCH_CHECK(a.sizes().equals(b.sizes()));
  STD_TORCH_CHECK(a.scalar_type() == torch::headeronly::ScalarType::Float);
  STD_TORCH_CHECK(b.scalar_type() == torch::headeronly::ScalarType::Float);
  STD_TORCH_CHECK(a.device().type() == torch::headeronly::DeviceType::CPU);
  STD_TORCH_CHECK(b.device().type() == torch::headeronly::DeviceType::CPU);
  torch::stable::Tensor a_contig = torch::stable::contiguous(a);
  torch::stable::Tensor b_contig = torch::stable::contiguous(b);
  torch::stable::Tensor result = torch::stable::empty_like(a_contig);
  const float* a_ptr = a_contig.const_data_ptr<float>();
  const float* b_ptr = b_contig.const_data_ptr<float>();
  float* result_ptr = result.mutable_data_ptr<float>();
  for (int64_t i = 0; i < result.numel(); i++) {
    result_ptr[i] = a_ptr[i] * b_ptr[i] + c;
  }
  return result;
}

STABLE_TORCH_LIBRARY(extension_cpp, m) {
  m.def("mymuladd(Tensor a, Tensor b, float c) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(extension_cpp, CPU, m) {
  m.impl("mymuladd", TORCH_BOX(&mymuladd_cpu));
}
"""

# Each child reads its source on stdin and prints {"seconds": ..., "cpu": ..., ...} as its
# last line: the wall time of the call and the CPU time (user + system) it took in the child
# and the processes it waited for (compilers, linkers, the probe; not the background
# precompile, which outlives the call).
CPU_TIME = textwrap.dedent(
    """
    import resource
    def cpu():
        used = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
        return sum(u.ru_utime + u.ru_stime for u in used)
    """
)
# The background precompile a first build starts is left unreaped in the child (a thread
# waits for it otherwise; its Popen is kept, so that subprocess does not reap it either), so
# that its CPU time is not counted as the build's.
OPMAGIC_CHILD = CPU_TIME + textwrap.dedent(
    """
    import json, sys, time, types
    from opmagic import compile_library
    from opmagic.native import headers
    unreaped = []
    headers.threading = types.SimpleNamespace(Thread=lambda target, **_: types.SimpleNamespace(
        start=lambda: unreaped.append(target)))
    source = sys.stdin.read()
    started, cpu_started = time.perf_counter(), cpu()
    library = compile_library(source, progress=None)
    seconds, cpu_seconds = time.perf_counter() - started, cpu() - cpu_started
    build = library.build
    print(json.dumps({"seconds": seconds, "cpu": cpu_seconds, "cached": build.cached,
                      "precompiled": build.precompiled, "load": library.load_seconds}))
    """
)
# Waits for (or does) the precompiling a build of the source started in the background.
PRECOMPILE_CHILD = CPU_TIME + textwrap.dedent(
    """
    import json, sys, time
    from opmagic import precompile_headers
    source = sys.stdin.read()
    started, cpu_started = time.perf_counter(), cpu()
    precompile_headers([source])
    print(json.dumps({"seconds": time.perf_counter() - started, "cpu": cpu() - cpu_started}))
    """
)
# The notebook flow: the cell as it was is loaded; its edited version replaces it.
EDIT_CHILD = CPU_TIME + textwrap.dedent(
    """
    import json, sys, time
    from opmagic import compile_library
    sources = json.loads(sys.stdin.read())
    library = compile_library(sources["before"], progress=None)
    started, cpu_started = time.perf_counter(), cpu()
    compile_library(sources["after"], replace=library, progress=None)
    print(json.dumps({"seconds": time.perf_counter() - started, "cpu": cpu() - cpu_started}))
    """
)
# A new build's trial in a child process, alone: the probe of a build that has not passed one.
PROBE_CHILD = textwrap.dedent(
    """
    import json, sys, time
    from opmagic import compile_library
    from opmagic.native.probe import PROBE_FILE, probe
    from opmagic.native.registration import SourceSite
    library = compile_library(sys.stdin.read(), progress=None)
    library.close()
    seconds = []
    for _ in range(5):
        (library.path.parent / PROBE_FILE).unlink()
        started = time.perf_counter()
        probe(library.path, SourceSite(library.source_file, "cell", 1), None, library.source)
        seconds.append(time.perf_counter() - started)
    print(json.dumps({"seconds": sorted(seconds)[2]}))
    """
)
# argv: name, build directory, and "minimal" to stop load_inline from prepending
# torch/extension.h (no_implicit_headers, where this torch has it)
LOAD_INLINE_CHILD = CPU_TIME + textwrap.dedent(
    """
    import inspect, json, sys, time
    from torch.utils.cpp_extension import load_inline
    source = sys.stdin.read()
    options = {}
    parameters = inspect.signature(load_inline).parameters
    if sys.argv[3] == "minimal" and "no_implicit_headers" in parameters:
        options["no_implicit_headers"] = True
    started, cpu_started = time.perf_counter(), cpu()
    load_inline(name=sys.argv[1], cpp_sources=[source], is_python_module=False,
                build_directory=sys.argv[2], **options)
    print(json.dumps({"seconds": time.perf_counter() - started, "cpu": cpu() - cpu_started}))
    """
)


class Runner:
    """Runs each measurement in a fresh process with private caches."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.runs = 0

    def env(self, cache: str) -> dict[str, str]:
        """The environment of a child using the opmagic cache ``cache`` (under scratch)."""
        return {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "XDG_CACHE_HOME": str(self.scratch / cache),
            "TORCH_EXTENSIONS_DIR": str(self.scratch / "torch_extensions"),
        }

    def child(self, code: str, source: str, *args: str, cache: str = "xdg") -> dict:
        """Run ``code`` in a fresh Python with ``source`` on stdin; its JSON report."""
        result = subprocess.run(
            [sys.executable, "-c", code, *args],
            input=source,
            capture_output=True,
            text=True,
            env=self.env(cache),
            check=False,
        )
        if result.returncode != 0:
            raise SystemExit(f"benchmark child failed:\n{result.stderr}")
        return json.loads(result.stdout.strip().splitlines()[-1])

    def fresh(self, source: str) -> str:
        """``source`` made unique, so that no cache has built it yet."""
        self.runs += 1
        return f"// benchmark run {self.runs}\n{source}"

    def opmagic(self, source: str, cache: str = "xdg") -> dict:
        """compile_library(source) in a fresh process."""
        return self.child(OPMAGIC_CHILD, source, cache=cache)

    def first_cell(self, source: str) -> Timing:
        """compile_library(source) on an empty cache; then waits for the headers it started
        precompiling in the background (so that they weigh on no other figure)."""
        self.runs += 1
        cache = f"empty{self.runs}"
        timing = Timing.of(self.opmagic(source, cache))
        self.child(PRECOMPILE_CHILD, source, cache=cache)
        return timing

    def precompile(self, source: str) -> Timing:
        """Precompiling the headers ``source`` uses (0 when done before)."""
        return Timing.of(self.child(PRECOMPILE_CHILD, source))

    def cold(self, source: str) -> Timing:
        """compile_library building a never-built variant of ``source``."""
        return Timing.of(self.opmagic(self.fresh(source)))

    def edit(self, before: str, after: str) -> Timing:
        """Rebuilding and swapping in ``after`` where ``before`` is loaded."""
        sources = json.dumps({"before": before, "after": after})
        return Timing.of(self.child(EDIT_CHILD, sources))

    def load_inline(self, source: str, build_dir: str, headers: str = "implicit") -> Timing:
        """load_inline(source) in a fresh process, building in ``build_dir``."""
        directory = self.scratch / build_dir
        directory.mkdir(exist_ok=True)
        return Timing.of(self.child(LOAD_INLINE_CHILD, source, build_dir, str(directory), headers))

    def load_inline_cold(self, source: str, headers: str = "implicit") -> Timing:
        """load_inline building ``source`` in a new build directory."""
        self.runs += 1
        return self.load_inline(source, f"li{self.runs}", headers)


class Timing(NamedTuple):
    """A figure: wall seconds, and CPU seconds of the process and the ones it waited for."""

    wall: float
    cpu: float

    @classmethod
    def of(cls, report: dict) -> Timing:
        """The timing a child reported."""
        return cls(report["seconds"], report["cpu"])

    @classmethod
    def median(cls, timings: Iterable[Timing]) -> Timing:
        """The median wall and the median CPU time of ``timings``."""
        walls, cpus = zip(*timings, strict=True)
        return cls(statistics.median(walls), statistics.median(cpus))


def line(
    name: str,
    seconds: float | Timing,
    baseline: float | Timing | None = None,
    target: str = "",
) -> None:
    """Print one figure: wall seconds and their ratio to the baseline, CPU seconds and theirs
    (for a Timing), and the target it is held to."""
    wall = seconds.wall if isinstance(seconds, Timing) else seconds
    base = baseline.wall if isinstance(baseline, Timing) else baseline
    text = f"  {name:<58} {wall:7.2f} s {f'{wall / base:5.2f}x' if base else '      '}"
    if isinstance(seconds, Timing):
        cpu_ratio = (
            f"{seconds.cpu / baseline.cpu:5.2f}x" if isinstance(baseline, Timing) else "      "
        )
        text += f"  cpu {seconds.cpu:6.2f} s {cpu_ratio}"
    print(f"{text}  {target}")


def target(text: str, ok: bool) -> str:
    """``target <= 0.35x: PASS``."""
    return f"target {text}: {'PASS' if ok else 'FAIL'}"


def alternate(runs: int, *measures: Callable[[], Timing]) -> list[Timing]:
    """Medians of the measures, run in turn ``runs`` times."""
    results: list[list[Timing]] = [[] for _ in measures]
    for _ in range(runs):
        for result, measure in zip(results, measures, strict=True):
            result.append(measure())
    return [Timing.median(r) for r in results]


def main() -> int:
    """Measure everything, print it, and return 1 when a target is missed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs of each cheap figure")
    parser.add_argument("--short", action="store_true", help="torch/extension.h alone, once")
    options = parser.parse_args()
    short = options.short
    repeat = 1 if short else options.repeat
    toolchain = find_toolchain()
    print(
        f"torch {torch.__version__}, {toolchain.version.splitlines()[0]}, linker "
        f"{toolchain.linker or 'bfd'}, {len(os.sched_getaffinity(0))} CPUs; medians of "
        f"{repeat} runs ({max(1, repeat - 1)} for figures over 10 s)"
    )
    expensive = max(1, repeat - 1)  # runs of the figures over 10 s
    failures: list[str] = []

    def check(name: str, seconds: Timing, baseline: Timing, limit: float, label: str) -> None:
        """Held to the CPU-time ratio: on a shared machine, wall times follow others' load."""
        ok = seconds.cpu <= limit * baseline.cpu
        line(name, seconds, baseline, target(f"{label} (cpu)", ok))
        failures.extend([] if ok else [name])

    with tempfile.TemporaryDirectory(prefix="opmagic-bench-") as scratch:
        run = Runner(Path(scratch))

        print("first cell on an empty cache (it starts precompiling the headers once compiled):")
        first_ext, li_ext = alternate(
            expensive,
            lambda: run.first_cell(run.fresh(EXTENSION_SOURCE)),
            lambda: run.load_inline_cold(EXTENSION_SOURCE),
        )
        line("load_inline, torch/extension.h myadd (BASELINE)", li_ext, li_ext)
        check("opmagic, torch/extension.h myadd", first_ext, li_ext, 0.5, "<= 0.5x")
        if short:
            line("one-time precompiled headers, extension source", run.precompile(EXTENSION_SOURCE))
            print("a cold cell after that (a new source, precompiled headers ready):")
            cold_ext = run.cold(EXTENSION_SOURCE)
            check("opmagic, torch/extension.h myadd", cold_ext, li_ext, 0.25, "<= 0.25x")
            print(f"missed: {', '.join(failures)}" if failures else "every target met")
            return 1 if failures else 0
        first_min, li_min = alternate(
            repeat,
            lambda: run.first_cell(run.fresh(MINIMAL_SOURCE)),
            lambda: run.load_inline_cold(MINIMAL_SOURCE, "minimal"),
        )
        line("load_inline, minimal-headers myadd (no_implicit_headers)", li_min, li_min)
        check("opmagic, minimal-headers myadd", first_min, li_min, 1.0, "<= 1.0x")
        first_stable, li_stable = alternate(
            repeat,
            lambda: run.first_cell(run.fresh(STABLE_SOURCE)),
            lambda: run.load_inline_cold(STABLE_SOURCE, "minimal"),
        )
        line("load_inline, stable-ABI mymuladd (no_implicit_headers)", li_stable, li_stable)
        check("opmagic, stable-ABI mymuladd", first_stable, li_stable, 1.0, "<= 1.0x")

        print("one-time precompiled headers (SCHED_IDLE, in the background, after the first cell):")
        for name, source in (
            ("torch/extension.h", EXTENSION_SOURCE),  # the types set, narrowed
            ("minimal-headers", MINIMAL_SOURCE),
            ("stable-ABI", STABLE_SOURCE),
        ):
            line(f"the set of the {name} source", run.precompile(source))

        print("a cold cell after that (a new source, precompiled headers ready):")
        cold_ext, li_ext2 = alternate(
            expensive,
            lambda: run.cold(EXTENSION_SOURCE),
            lambda: run.load_inline_cold(EXTENSION_SOURCE),
        )
        baseline = Timing.median([li_ext, li_ext2])
        line("load_inline, torch/extension.h myadd (BASELINE, all runs)", baseline, baseline)
        check("opmagic, torch/extension.h myadd", cold_ext, baseline, 0.25, "<= 0.25x")
        cold_min = Timing.median(run.cold(MINIMAL_SOURCE) for _ in range(repeat))
        check("opmagic, minimal-headers myadd", cold_min, baseline, 0.12, "<= 0.12x")
        line("  the same, against load_inline of the same source", cold_min, li_min)
        cold_stable = Timing.median(run.cold(STABLE_SOURCE) for _ in range(repeat))
        check("opmagic, stable-ABI mymuladd", cold_stable, li_stable, 1.0, "<= 1.0x")

        print("edit one kernel line and re-run (replacing the loaded version):")
        edit_min = Timing.median(
            run.edit(
                MINIMAL_SOURCE, MINIMAL_SOURCE.replace("self_ptr[i] +", f"{n} + self_ptr[i] +")
            )
            for n in range(repeat)
        )
        check("opmagic, minimal-headers myadd", edit_min, cold_min, 1.15, "about the cold build")
        edit_stable = Timing.median(
            run.edit(STABLE_SOURCE, STABLE_SOURCE.replace("+ c;", f"+ c + {n};"))
            for n in range(repeat)
        )
        check(
            "opmagic, stable-ABI mymuladd", edit_stable, cold_stable, 1.15, "about the cold build"
        )

        print("re-run unchanged in a fresh process (cache hit, load, register):")
        run.load_inline(MINIMAL_SOURCE, "li_hit", "minimal")  # builds it once
        li_hit = Timing.median(
            run.load_inline(MINIMAL_SOURCE, "li_hit", "minimal") for _ in range(repeat)
        )
        line("load_inline, minimal-headers myadd (its cache hit)", li_hit, li_hit)
        hits = [run.opmagic(MINIMAL_SOURCE) for _ in range(repeat)]
        unchanged = Timing.median(Timing.of(h) for h in hits)
        ok = unchanged.wall <= 0.3
        line(
            "opmagic, minimal-headers myadd",
            unchanged,
            li_hit,
            target("<= 0.3 s", ok),
        )
        failures += [] if ok else ["unchanged"]

        print("the probe: a new build tried in a child process before it is loaded (once):")
        line(
            "fork, load and register in the child (stable-ABI mymuladd)",
            run.child(PROBE_CHILD, STABLE_SOURCE)["seconds"],
        )
    if failures:
        print(f"missed: {', '.join(failures)}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
