"""The prefix header every build force-includes, and its precompiled form.

The prefix is one of a few torch header sets followed by the registration preamble. Its
precompiled form (a GCC ``.gch``, built once per header set, compiler, torch and flags, and
shared by every source that uses the set) saves parsing torch's headers on each build:
about 13 s of a 20 s ``torch/extension.h`` compile.

A source gets the smallest set whose headers (with everything they include) cover (nearly)
everything the source's torch includes pull in; those ``#include`` lines then cost nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .cache import (
    NO_SPACE,
    BuildCache,
    artifact_problem,
    artifact_record,
    digest,
    disk_full,
    fingerprint,
    private_problem,
    remove_path,
    write_atomic,
)
from .compiler import run_step
from .progress import Stopwatch
from .toolchain import Toolchain

PREAMBLE = (Path(__file__).parent / "preamble.h").read_text()
# Headers a set may leave to be parsed per build before a bigger set is cheaper (~5 ms each).
MAX_UNCOVERED_FILES = 100
PRECOMPILED_RECORD = "precompiled.json"  # size, SHA-256 and stat of prefix.h.gch when built
_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)


@dataclass(frozen=True)
class HeaderSet:
    """torch headers precompiled together, for sources that include (some of) them."""

    name: str
    headers: tuple[str, ...]


HEADER_SETS = (
    # what an operator library needs: registration, Tensor, a factory function
    HeaderSet("core", ("torch/library.h", "ATen/core/Tensor.h", "ATen/ops/empty.h")),
    # the C++ frontend: autograd functions, every ATen op, nn, optim
    HeaderSet("all", ("torch/all.h",)),
    # the setup.py extension header: torch/all.h plus Python and pybind11
    HeaderSet("extension", ("torch/extension.h",)),
)


@dataclass(frozen=True)
class Prefix:
    """The header force-included before a source, and whether a precompiled form is used."""

    header: Path
    header_set: HeaderSet | None  # None: the preamble alone, nothing precompiled
    precompiled: bool
    seconds: float = 0.0  # time spent here building the precompiled header (0 when reused)
    note: str = ""  # why no precompiled header is used, when there is none
    # where macros are recorded that the user set with -D/-U and that turned out to change
    # these headers (GCC skips the precompiled header then): later builds precompile them in
    macros_file: Path | None = None
    repaired: str = ""  # a damaged precompiled header this call found and rebuilt


def prefix_text(header_set: HeaderSet | None) -> str:
    """The prefix header: the set's ``#include`` lines, then the registration preamble."""
    includes = "".join(f"#include <{h}>\n" for h in header_set.headers) if header_set else ""
    name = header_set.name if header_set else "preamble only"
    return f"// opmagic prefix header ({name})\n{includes}{PREAMBLE}"


def included_torch_headers(source: str, toolchain: Toolchain) -> tuple[str, ...]:
    """The torch headers ``source`` includes, as written in its ``#include`` lines."""
    return tuple(
        sorted(
            {
                name
                for name in _INCLUDE.findall(source)
                if any(os.path.isfile(os.path.join(d, name)) for d in toolchain.torch_includes)
            }
        )
    )


def choose_header_set(
    source: str,
    toolchain: Toolchain,
    flags: list[str],
    cache: BuildCache,
    search_flags: Sequence[str] = (),
) -> HeaderSet:
    """The smallest header set that leaves at most :data:`MAX_UNCOVERED_FILES` of the files
    ``source``'s torch includes pull in to be parsed on each build.

    A bigger set costs more per build even when precompiled (its templates are instantiated
    in every compile: about 1.4 s for core, 5.7 s for all, 7.5 s for extension), so a few
    uncovered headers are cheaper than the next set. When no set is close enough, the one
    leaving the fewest files uncovered. ``search_flags`` (e.g. CUDA's include directories)
    let the source's own includes be found.
    """
    wanted = included_torch_headers(source, toolchain)
    if not wanted:
        return HEADER_SETS[0]
    needed = header_closure(wanted, toolchain, [*flags, *search_flags], cache)
    best: tuple[int, HeaderSet] | None = None
    for header_set in HEADER_SETS:
        uncovered = len(needed - header_closure(header_set.headers, toolchain, flags, cache))
        if uncovered <= MAX_UNCOVERED_FILES:
            return header_set
        if best is None or uncovered < best[0]:
            best = (uncovered, header_set)
    assert best is not None
    return best[1]


def header_closure(
    headers: tuple[str, ...], toolchain: Toolchain, flags: list[str], cache: BuildCache
) -> frozenset[str]:
    """Every file ``headers`` include, transitively (``-M``; cached on disk)."""
    key = digest({"closure": headers, "flags": flags, **toolchain.identity()})
    path = cache.home / "prefix" / f"closure-{key}.json"
    with contextlib.suppress(OSError, ValueError, TypeError):  # none yet, or damaged: redo
        return frozenset(json.loads(path.read_text()))
    text = "".join(f"#include <{h}>\n" for h in headers)
    result = run_step(
        [*toolchain.compiler, *flags, "-M", "-x", "c++", "-"], cwd=cache.home, stdin=text
    )
    if result.returncode != 0:
        return frozenset()
    files = [
        os.path.realpath(token)
        for token in result.output.replace("\\\n", " ").split()[1:]
        if token != "\\"
    ]
    write_atomic(path, json.dumps(sorted(files)))
    return frozenset(files)


def prepare_prefix(
    source: str,
    toolchain: Toolchain,
    flags: list[str],
    defines: tuple[str, ...],
    cache: BuildCache,
    stopwatch: Stopwatch,
    *,
    precompile: bool,
    force: bool,
    search_flags: Sequence[str] = (),
) -> Prefix:
    """The prefix header for ``source``, precompiled (built now if missing) when possible.

    The user's ``-D``/``-U`` flags (``defines``) are left out of the precompiled header, so
    that macros the torch headers never look at do not cost a header build each. GCC
    refuses a precompiled header whose macros differ where it matters; such macros are
    recorded (:func:`record_macro`) and precompiled in from then on. A header set that
    failed to precompile is compiled as plain text from then on, unless ``force``. A
    precompiled header that is not the one recorded when it was built (size, SHA-256: see
    :func:`_precompiled_problem`; ``force`` hashes it again whatever its stat says) is rebuilt.
    ``search_flags`` are include flags the source's compile adds (they do not change the
    precompiled header, so it is shared with sources that do not need them).
    """
    header_set = (
        choose_header_set(source, toolchain, flags, cache, search_flags)
        if precompile and toolchain.is_gcc
        else None
    )
    text = prefix_text(header_set)
    directory = cache.prefix_dir(digest({"prefix": text, "flags": flags, **toolchain.identity()}))
    macros_file = directory / "macros.json" if header_set is not None and defines else None
    known = _recorded_macros(macros_file) if macros_file is not None else set()
    relevant = [d for d in defines if macro_name(d) in known]
    if relevant:  # a header of its own, with the macros that change torch's headers
        flags = [*flags, *relevant]
        directory = cache.prefix_dir(
            digest({"prefix": text, "flags": flags, **toolchain.identity()})
        )
    header = directory / "prefix.h"
    if header_set is None:
        if _text_of(header) != text:  # none yet, or damaged
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_atomic(header, text)
        note = "precompiled headers need GCC" if precompile else "precompiled headers disabled"
        return Prefix(header, None, False, note=note)
    precompiled = directory / "prefix.h.gch"
    failed = directory / "failed.log"
    damage = _precompiled_problem(directory, rehash=force)
    if damage is None:
        return Prefix(header, header_set, True, macros_file=macros_file)
    waited = False

    def on_wait(pid: str) -> None:
        """Report waiting for the process that precompiles the same headers."""
        nonlocal waited
        waited = True
        stopwatch.report(f"waiting for pid {pid} (headers)")

    with cache.locked(f"prefix-{directory.name}", on_wait):
        if (waited or not damage) and _precompiled_problem(directory, rehash=False) is None:
            return Prefix(header, header_set, True, macros_file=macros_file)  # built meanwhile
        if force:
            failed.unlink(missing_ok=True)
        if failed.is_file():
            return Prefix(header, header_set, False, note=f"precompiling failed: {failed}")
        if private_problem(directory) not in (None, "it does not exist"):
            remove_path(directory)
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomic(header, text)
        for stale in directory.glob("prefix.h.gch*"):  # damaged, or left by a killed build
            stale.unlink()
        partial = directory / f"prefix.h.gch.{os.getpid()}"
        if damage:
            stopwatch.report(f"the precompiled headers were damaged ({damage}); rebuilding")
        stopwatch.report(f"precompiling the {header_set.name} torch headers (once)")
        result = run_step(
            [*toolchain.compiler, *flags, "-x", "c++-header", str(header), "-o", str(partial)],
            cwd=directory,
            stopwatch=stopwatch,
        )
        if result.returncode != 0:
            partial.unlink(missing_ok=True)
            if NO_SPACE.search(result.output):  # not a failure to remember: the next build retries
                raise disk_full(f"precompiling the {header_set.name} torch headers")
            if "error" not in result.output:  # killed, out of memory: the next build retries
                note = f"precompiling stopped without an error message (exit {result.returncode})"
                return Prefix(header, header_set, False, note=note)
            write_atomic(failed, f"{result.command_line}\n{result.output}")
            return Prefix(header, header_set, False, note=f"precompiling failed: {failed}")
        os.replace(partial, precompiled)
        write_atomic(directory / PRECOMPILED_RECORD, json.dumps(artifact_record(precompiled)))
        repaired = f"precompiled {header_set.name} headers rebuilt: {damage}" if damage else ""
        return Prefix(
            header, header_set, True, result.seconds, macros_file=macros_file, repaired=repaired
        )


def _text_of(path: Path) -> str | None:
    """A file's text, or None when it cannot be read as text."""
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _precompiled_problem(directory: Path, *, rehash: bool) -> str | None:
    """Why the precompiled header in ``directory`` cannot be used: "" when there is none yet,
    else what is wrong with it; None when it is the one recorded when it was built."""
    precompiled = directory / "prefix.h.gch"
    if not os.path.lexists(precompiled):
        return ""
    problem = private_problem(directory)
    if problem is not None:
        return f"its directory {directory} is not private: {problem}"
    record_file = directory / PRECOMPILED_RECORD
    try:
        record = json.loads(record_file.read_text())
    except (OSError, ValueError):
        return f"{record_file.name}, the record of its size and SHA-256, is missing or damaged"
    problem = artifact_problem(precompiled, record, rehash=rehash)
    if problem is None and record.get("stat") != fingerprint(precompiled):
        with contextlib.suppress(OSError):  # hashed as recorded: next time the stat will do
            write_atomic(record_file, json.dumps({**record, "stat": fingerprint(precompiled)}))
    return problem


def macro_name(define: str) -> str:
    """``FOO`` of ``-DFOO=1``, ``-DFOO`` or ``-UFOO``."""
    return define[2:].split("=", 1)[0]


def _recorded_macros(path: Path) -> set[str]:
    """Macros recorded by :func:`record_macro` (none when the file is missing)."""
    try:
        return set(json.loads(path.read_text()))
    except (OSError, ValueError):
        return set()


def record_macro(path: Path, name: str) -> None:
    """Remember that the user macro ``name`` changes the headers of this prefix."""
    write_atomic(path, json.dumps(sorted(_recorded_macros(path) | {name})))
