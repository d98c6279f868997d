"""The prefix header every build force-includes, and its precompiled form.

The prefix is one of a few torch header sets followed by the registration preamble of the
blocks the source has (classic ``TORCH_LIBRARY*``, stable-ABI ``STABLE_TORCH_LIBRARY*``, or
both). Its precompiled form (a GCC ``.gch``, built once per prefix, compiler, torch and
flags, and shared by every source that uses it) saves parsing torch's headers on each build:
about 13 s of a 20 s ``torch/extension.h`` compile.

Precompiling a big set takes longer than compiling one source without it (~45 s of CPU for
the extension set against ~27 s), so a build never waits for it: a missing precompiled
header is built in the background (by a process that outlives this one and runs only on
CPU time nothing else wants), and builds parse the headers themselves until it is there.
:func:`precompile_headers` starts (or waits for) that work ahead of the first build;
``%load_ext opmagic`` calls it.

A source gets the smallest set whose headers (with everything they include) cover (nearly)
everything the source's torch includes pull in; those ``#include`` lines then cost nothing.
A stable-ABI source gets the stable set: its prefix holds no classic torch header. A source
compiled with ``torch/extension.h`` narrowed (:mod:`opmagic.native.narrowing`) counts as
including the narrow headers in its place.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..cachedir import (
    NO_SPACE,
    TICK_SECONDS,
    BuildCache,
    Stopwatch,
    artifact_problem,
    artifact_record,
    digest,
    disk_full,
    fingerprint,
    private_problem,
    read_json_file,
    read_record,
    remove_path,
    write_atomic,
)
from ..errors import BuildOptionError, OpmagicError, is_list_of_values
from .blocks import scan_blocks
from .compiler import run_step
from .narrowing import NARROW_HEADERS, UMBRELLA_HEADERS, narrowable
from .options import (
    DEFAULT_OPT_LEVEL,
    BuildOptions,
    check_source_text,
    normalise_opt_level,
    split_flags,
)
from .toolchain import Toolchain, find_toolchain

_HERE = Path(__file__).parent
# the registration preamble: the common part, then one part per flavour of blocks
PREAMBLE_PARTS = {
    "common": (_HERE / "preamble.h").read_text(),
    "classic": (_HERE / "preamble_classic.h").read_text(),
    "stable": (_HERE / "preamble_stable.h").read_text(),
}
PREAMBLE = "".join(PREAMBLE_PARTS.values())  # what every cache key includes
# Headers a set may leave to be parsed per build before a bigger set is cheaper (~5 ms each).
MAX_UNCOVERED_FILES = 100
PRECOMPILED_RECORD = "precompiled.json"  # size, SHA-256 and stat of prefix.h.gch when built
_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)
# what GCC's driver says of a compiler that a signal killed (the OOM killer sends SIGKILL)
_KILLED = re.compile(r"Killed signal terminated program \S+|internal compiler error: Killed[^\n]*")
_RETRIED: set[Path] = set()  # failed precompiles of killed compilers this process retried


@dataclass(frozen=True)
class HeaderSet:
    """torch headers precompiled together, for sources that include (some of) them."""

    name: str
    headers: tuple[str, ...]


HEADER_SETS = (
    # the LibTorch stable ABI, as PyTorch's custom C++ operator tutorial includes it
    HeaderSet(
        "stable",
        (
            "torch/csrc/stable/library.h",
            "torch/csrc/stable/ops.h",
            "torch/csrc/stable/tensor.h",
            "torch/headeronly/core/ScalarType.h",
            "torch/headeronly/macros/Macros.h",
        ),
    ),
    # what an operator library needs: registration, Tensor, a factory function
    HeaderSet("core", ("torch/library.h", "ATen/core/Tensor.h", "ATen/ops/empty.h")),
    # every ATen function and torch::'s factories: torch/extension.h narrowed (narrowing.py)
    HeaderSet("types", NARROW_HEADERS),
    # the C++ frontend: autograd functions, every ATen op, nn, optim
    HeaderSet("all", ("torch/all.h", "torch/library.h", "ATen/Operators.h")),
    # the setup.py extension header: torch/all.h plus Python and pybind11
    HeaderSet("extension", ("torch/extension.h", "torch/library.h")),
)
_SETS = {header_set.name: header_set for header_set in HEADER_SETS}


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
    repaired: str = ""  # a damaged precompiled header this call found (and what became of it)
    # the precompiling to start in the background once this build is compiled (beside it,
    # it slowed the compile by ~1.6 s of 1.9 s on the 2-core machine, at no cost in CPU time)
    pending: tuple[_Precompile, ...] = ()

    def start_pending(self, cache: BuildCache) -> None:
        """Start the background precompiling this build left for after its compile."""
        if self.pending:
            start_in_background(self.pending, cache)


def preamble_flavours(source: str) -> tuple[str, ...]:
    """The preamble parts ``source``'s blocks need: ``("classic",)``, ``("stable",)`` or both.

    A source without blocks gets the classic part (its registrations, if any, are made
    otherwise: the loader finds them).
    """
    blocks = scan_blocks(source)
    flavours = {"stable" if block.stable else "classic" for block in blocks} or {"classic"}
    return tuple(flavour for flavour in ("classic", "stable") if flavour in flavours)


def prefix_text(header_set: HeaderSet | None, flavours: Sequence[str] = ("classic",)) -> str:
    """The prefix header: the set's ``#include`` lines, then the registration preamble."""
    includes = "".join(f"#include <{h}>\n" for h in header_set.headers) if header_set else ""
    name = header_set.name if header_set else "preamble only"
    preamble = "".join(PREAMBLE_PARTS[part] for part in ("common", *flavours))
    title = f"// opmagic prefix header ({name}, {' and '.join(flavours)} blocks)\n"
    return f"{title}{includes}{preamble}"


def prefix_includes(source: str, header_set: str | None) -> tuple[str, ...]:
    """The headers the prefix of ``source``'s build included before it, in order: the set
    ``header_set`` names (a build's :attr:`BuildInfo.header_set`; ``None``: none), then the
    registration preamble's. A build of the source without opmagic includes them to see what
    the cell saw (the preamble's macros aside: torch's own do the same, at load time)."""
    headers = _SETS[header_set].headers if header_set in _SETS else ()
    preamble = "".join(PREAMBLE_PARTS[part] for part in ("common", *preamble_flavours(source)))
    return tuple(dict.fromkeys([*headers, *_INCLUDE.findall(preamble)]))


def included_headers(source: str) -> tuple[str, ...]:
    """Every header ``source``'s ``#include`` lines name, as written."""
    return tuple(_INCLUDE.findall(source))


def refuses_target_version(header: str, toolchain: Toolchain) -> bool:
    """Whether a torch header refuses ``-DTORCH_TARGET_VERSION`` (a build for the stable ABI):
    torch guards every header but the stable ABI's and the header-only ones so."""
    for directory in toolchain.torch_includes:
        path = os.path.join(directory, header)
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as header_file:
                return "!defined(TORCH_TARGET_VERSION)" in header_file.read(4096)
    return False


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
    narrow: bool = False,
) -> HeaderSet:
    """The smallest header set that leaves at most :data:`MAX_UNCOVERED_FILES` of the files
    ``source``'s torch includes pull in to be parsed on each build.

    A bigger set costs more per build even when precompiled (its templates are instantiated
    in every compile: about 1.4 s for core, 2.7 s for types, 5.7 s for all, 7.5 s for
    extension), so a few uncovered headers are cheaper than the next set. When no set is
    close enough, the one leaving the fewest files uncovered. ``search_flags`` (e.g. CUDA's
    include directories) let the source's own includes be found. A source whose includes are
    all among a set's own headers gets that set at once (no include closure to compute: the
    first build on an empty cache does not pay for it). Only stable-ABI sources get the
    stable set. ``narrow``: the source's umbrella headers stand for the narrow headers.
    """
    stable_only = preamble_flavours(source) == ("stable",)
    candidates = [s for s in HEADER_SETS if stable_only or s.name != "stable"]
    wanted = included_torch_headers(source, toolchain)
    if narrow:
        others = tuple(h for h in wanted if h not in UMBRELLA_HEADERS)
        wanted = tuple(sorted({*others, *NARROW_HEADERS}))
    if not wanted:
        return candidates[0]
    for header_set in candidates:
        if set(wanted) <= set(header_set.headers):
            return header_set
    needed = header_closure(wanted, toolchain, [*flags, *search_flags], cache)
    best: tuple[int, HeaderSet] | None = None
    for header_set in candidates:
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
    recorded = read_json_file(path, list)  # None: none yet, or damaged: done again
    if recorded is not None and all(isinstance(name, str) for name in recorded):
        return frozenset(recorded)
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
    wait: bool = False,
    narrow: bool = False,
) -> Prefix:
    """The prefix header for ``source``, precompiled when its precompiled form is there
    (``narrow``: for the source compiled with its umbrella headers narrowed).

    A missing precompiled header is built in the background for later builds, started by
    :meth:`Prefix.start_pending` once this build is compiled (``wait``: built now, or waited
    for when another process builds it), and this build parses the headers itself. The
    user's ``-D``/``-U`` flags (``defines``) are left out of the
    precompiled header, so that macros the torch headers never look at do not cost a header
    build each. GCC refuses a precompiled header whose macros differ where it matters; such
    macros are recorded (:func:`record_macro`) and precompiled in from then on. A header set
    that failed to precompile is compiled as plain text from then on, unless ``force``. A
    precompiled header that is not the one recorded when it was built (size, SHA-256: see
    :func:`_precompiled_problem`; ``force`` hashes it again whatever its stat says) is removed
    before this build (GCC would read it) and built again like a missing one.
    ``search_flags`` are include flags the source's compile adds (they do not change the
    precompiled header, so it is shared with sources that do not need them).
    """
    flavours = preamble_flavours(source)
    header_set = (
        choose_header_set(source, toolchain, flags, cache, search_flags, narrow)
        if precompile and toolchain.is_gcc
        else None
    )
    text = prefix_text(header_set, flavours)
    directory = cache.prefix_dir(digest({"prefix": text, "flags": flags, **toolchain.identity()}))
    macros_file = directory / "macros.json" if header_set is not None and defines else None
    known = _recorded_macros(macros_file) if macros_file is not None else set()
    relevant = [d for d in defines if macro_name(d) in known]
    # with user macros that change torch's headers, a header of its own
    header = _prefix_header(text, [*flags, *relevant], toolchain, cache)
    if header_set is None:
        note = "precompiled headers need GCC" if precompile else "precompiled headers disabled"
        return Prefix(header, None, False, note=note)
    _remember_use(cache, header_set, flavours)
    job = _Precompile(toolchain, [*flags, *relevant], header)
    damage = job.problem(rehash=force)
    if damage is None:
        return Prefix(header, header_set, True, macros_file=macros_file)
    if damage:
        damage = job.remove_damaged(cache, damage)
    if damage is None:  # another process replaced it meanwhile
        return Prefix(header, header_set, True, macros_file=macros_file)
    if damage:
        stopwatch.report(f"the precompiled headers were damaged ({damage}); rebuilding them")
    repaired = f"precompiled {header_set.name} headers damaged ({damage})" if damage else ""
    if force:
        job.failed.unlink(missing_ok=True)
    retried = job.retry_if_killed()
    if job.failed.is_file():
        return Prefix(header, header_set, False, note=f"precompiling failed: {job.failed}")
    if wait:
        seconds = job.run_now(cache, stopwatch, header_set.name)
        if job.done():
            repaired = f"{repaired}: rebuilt" if repaired else ""
            return Prefix(
                header, header_set, True, seconds, macros_file=macros_file, repaired=repaired
            )
        note = (
            f"precompiling failed: {job.failed}"
            if job.failed.is_file()
            else "precompiling stopped without an error message (the next build tries again)"
        )
        return Prefix(header, header_set, False, note=note, repaired=repaired)
    return Prefix(
        header,
        header_set,
        False,
        note=f"the {header_set.name} headers are being precompiled in the background for the "
        f"next builds{retried}",
        macros_file=macros_file,
        repaired=f"{repaired}: rebuilding in the background" if repaired else "",
        pending=(job,),
    )


def _prefix_header(text: str, flags: list[str], toolchain: Toolchain, cache: BuildCache) -> Path:
    """The prefix header with ``text`` in the directory of its precompiled forms (written now
    if missing): one directory per text, flags and toolchain."""
    directory = cache.prefix_dir(digest({"prefix": text, "flags": flags, **toolchain.identity()}))
    header = directory / "prefix.h"
    if private_problem(directory) not in (None, "it does not exist"):
        remove_path(directory)  # not ours alone: nothing in it can be trusted
    if _text_of(header) != text:  # none yet, or damaged
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomic(header, text)
    return header


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
    record, problem = read_record(directory, PRECOMPILED_RECORD)
    if record is None:
        return problem or f"{PRECOMPILED_RECORD}, the record of its size and SHA-256, is missing"
    damage = artifact_problem(precompiled, record, rehash=rehash)
    if damage is None and record.get("stat") != fingerprint(precompiled):
        with contextlib.suppress(OSError):  # hashed as recorded: next time the stat will do
            write_atomic(
                directory / PRECOMPILED_RECORD,
                json.dumps({**record, "stat": fingerprint(precompiled)}),
            )
    return damage


def _used_file(cache: BuildCache) -> Path:
    """Where the header sets (and preamble flavours) builds in this cache used are listed."""
    return cache.home / "prefix" / "used.json"


def _used(cache: BuildCache) -> list[tuple[str, tuple[str, ...]]]:
    """``(set name, flavours)`` of every prefix builds in this cache used, oldest first."""
    used = []
    for entry in read_json_file(_used_file(cache), list) or []:  # damaged: none used
        if not (isinstance(entry, list) and len(entry) == 2 and entry[0] in _SETS):
            continue  # an entry of another shape: left out
        name, flavours = entry
        if isinstance(flavours, list) and flavours and set(flavours) <= {"classic", "stable"}:
            used.append((name, tuple(flavours)))
    return used


def _remember_use(cache: BuildCache, header_set: HeaderSet, flavours: tuple[str, ...]) -> None:
    """Record that a build used this prefix (:func:`precompile_headers` warms it up later,
    e.g. for a new torch or compiler)."""
    used = _used(cache)
    if (header_set.name, flavours) not in used:
        write_atomic(_used_file(cache), json.dumps([*used, (header_set.name, flavours)]))


# what precompile_headers warms in a cache no build has used yet (the types set: what
# torch/extension.h sources are compiled with first)
FIRST_WARM_UP: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("stable", ("stable",)),
    ("core", ("classic",)),
    ("types", ("classic",)),
)


def precompile_headers(
    sources: Sequence[str] | None = None,
    *,
    opt_level: int | str = DEFAULT_OPT_LEVEL,
    extra_cflags: Sequence[str] | str = (),
    wait: bool = True,
) -> None:
    """Precompile the torch headers that builds of ``sources`` use, ahead of those builds.

    ``opt_level`` and ``extra_cflags`` as the builds will have them (they select the
    precompiled header). Without ``sources``: every header set builds in this cache have
    used (on a new cache, the stable-ABI, core and types sets), with the default flags.
    ``wait=False`` does it in a background process of low priority (``%load_ext opmagic``
    starts it so: the first cell then finds the headers precompiled, or compiles without
    them while they are), ``wait=True`` before returning. Headers already precompiled cost
    nothing.
    """
    sources = _checked_sources(sources)
    if not isinstance(wait, bool):
        raise BuildOptionError(f"wait must be True or False, got {wait!r:.60}.")
    split_flags(extra_cflags, "extra_cflags")  # checked whether or not sources are given
    toolchain = find_toolchain()
    if not toolchain.is_gcc:
        return
    cache = BuildCache()
    if sources is not None:
        for source in sources:
            options = BuildOptions.create(
                source,
                cuda=False,
                name=None,
                extra_cflags=extra_cflags,
                extra_ldflags=(),
                include_dirs=(),
                opt_level=opt_level,
                precompiled_headers=True,
                force=False,
                verbose=False,
                label=None,
                first_line=1,
            )
            flags = toolchain.compile_flags(options.opt_level, options.cflags)
            stopwatch = Stopwatch("headers", None)
            prefix = prepare_prefix(
                options.source,
                toolchain,
                flags,
                options.defines,
                cache,
                stopwatch,
                precompile=True,
                force=False,
                wait=wait,
                narrow=narrowable(options.source),
            )
            prefix.start_pending(cache)
        return
    flags = toolchain.compile_flags(normalise_opt_level(opt_level), ())
    jobs = []
    for name, flavours in dict.fromkeys(_used(cache) or FIRST_WARM_UP):
        header = _prefix_header(prefix_text(_SETS[name], flavours), flags, toolchain, cache)
        jobs.append((name, _Precompile(toolchain, flags, header)))
        jobs[-1][1].retry_if_killed()
    if not wait:
        start_in_background([job for _, job in jobs], cache)
        return
    for name, job in jobs:
        if not job.done():
            job.run_now(cache, Stopwatch("headers", None), name)


def _checked_sources(sources: object) -> tuple[str, ...] | None:
    """``precompile_headers``'s sources as a tuple of texts (one text alone is one source)."""
    if sources is None:
        return None
    if isinstance(sources, str):
        return (sources,)
    if not is_list_of_values(sources):
        raise BuildOptionError(
            f"sources must be a list of C++ sources (str), or None; got {sources!r:.60}."
        )
    sources = tuple(sources)
    for source in sources:
        check_source_text(source, "C++ source text")
    return sources


def precompile_headers_in_background() -> None:
    """Start precompiling the torch headers the first cells will use, in a background process
    (a warm-up of ``%load_ext opmagic``): returns at once and never raises (no compiler or an
    unusable cache: the first cell says so, with what to do)."""
    with contextlib.suppress(OpmagicError, OSError):
        precompile_headers(wait=False)


@dataclass(frozen=True)
class _Precompile:
    """Precompiling one prefix header: the command and the files it leaves in its directory."""

    toolchain: Toolchain
    flags: list[str]
    header: Path

    @property
    def precompiled(self) -> Path:
        """The precompiled header, once it is done."""
        return self.header.with_name("prefix.h.gch")

    @property
    def failed(self) -> Path:
        """The compiler's output when precompiling failed (then the text is used)."""
        return self.header.with_name("failed.log")

    @property
    def marker(self) -> Path:
        """The pid of the background process that precompiles it, while it does."""
        return self.header.with_name("precompiling.pid")

    @property
    def record(self) -> Path:
        """The size and SHA-256 the precompiled header had when it was built."""
        return self.header.with_name(PRECOMPILED_RECORD)

    @property
    def lock(self) -> str:
        """The cache lock of this header's directory."""
        return f"prefix-{self.header.parent.name}"

    def command(self, output: Path) -> list[str]:
        """The compiler command that precompiles the header into ``output``."""
        header = ["-x", "c++-header", str(self.header), "-o", str(output)]
        return [*self.toolchain.compiler, *self.flags, *header]

    def problem(self, *, rehash: bool = False) -> str | None:
        """None when the precompiled header is there as built; "" when there is none yet;
        else what is wrong with it (:func:`_precompiled_problem`)."""
        return _precompiled_problem(self.header.parent, rehash=rehash)

    def done(self) -> bool:
        """Whether the precompiled header is there, as it was built."""
        return self.problem() is None

    def remove_damaged(self, cache: BuildCache, damage: str) -> str | None:
        """Remove a damaged precompiled header (GCC would read it and fail or crash): returns
        ``damage``, or None when another process that held the lock had rebuilt it."""
        with cache.locked(self.lock) as waited:
            if waited and self.problem() is None:
                return None
            self.precompiled.unlink(missing_ok=True)
            self.record.unlink(missing_ok=True)
        return damage

    def retry_if_killed(self) -> str:
        """Forget a failure of a compiler that was killed (the OOM killer's SIGKILL, say), once
        per process: returns the note that says so, or "" (a real error is kept for good)."""
        if self.failed in _RETRIED:
            return ""
        try:
            log = self.failed.read_text(errors="replace")
        except OSError:
            return ""
        killed = _KILLED.search(log)
        if killed is None:
            return ""
        _RETRIED.add(self.failed)
        self.failed.unlink(missing_ok=True)
        return (
            f" (the last precompile was killed: {killed[0]!r}, e.g. by the out-of-memory "
            "killer; it is tried again, once per process)"
        )

    def builder(self) -> int | None:
        """The pid of a live background process precompiling it, if any."""
        try:
            pid = int(self.marker.read_text())
            os.kill(pid, 0)
        except (OSError, ValueError):
            return None
        return pid

    def run_now(self, cache: BuildCache, stopwatch: Stopwatch, name: str) -> float:
        """Precompile in this process (or wait for the background process that does); the
        seconds it took here."""
        on_wait = lambda pid: stopwatch.report(f"waiting for pid {pid} (headers)")  # noqa: E731
        with cache.locked(self.lock, on_wait):
            while (pid := self.builder()) is not None and not self.done():
                stopwatch.report(f"waiting for pid {pid}, which precompiles the {name} headers")
                time.sleep(TICK_SECONDS)
            if self.done() or self.failed.is_file():
                return 0.0
            for stale in self.header.parent.glob("prefix.h.gch*"):  # damaged, or a killed build's
                stale.unlink()
            partial = self.header.with_name(f"prefix.h.gch.{os.getpid()}")
            stopwatch.report(f"precompiling the {name} torch headers (once)")
            result = run_step(self.command(partial), cwd=self.header.parent, stopwatch=stopwatch)
            if result.returncode != 0:
                partial.unlink(missing_ok=True)
                if NO_SPACE.search(result.output):  # not a failure to remember
                    raise disk_full(f"precompiling the {name} torch headers")
                if "error" in result.output:  # killed or out of memory: the next build retries
                    write_atomic(self.failed, f"{result.command_line}\n{result.output}")
                return result.seconds
            os.replace(partial, self.precompiled)
            write_atomic(self.record, json.dumps(artifact_record(self.precompiled)))
            return result.seconds


# The background process's shell function: precompile, then publish the header after the
# record of its size and SHA-256 (the stat is added by the first build that checks it), or
# remember a failure; a full disk and a compiler killed without an error are not remembered.
# Every file it writes is made by mktemp (O_EXCL: never through a symlink planted in the
# cache) and renamed into place (rename replaces a symlink, never its target).
_BACKGROUND_PRECOMPILE = """
precompile() {
  partial=$1 precompiled=$2 record=$3 failed=$4 marker=$5; shift 5
  directory=$(dirname "$precompiled")
  log=$(mktemp "$directory/.precompiling.XXXXXX") || return
  if "$@" >>"$log" 2>&1; then
    written=$(mktemp "$directory/.record.XXXXXX") &&
      printf '{"size": %s, "sha256": "%s"}' "$(wc -c <"$partial")" \\
        "$(sha256sum "$partial" | cut -d ' ' -f 1)" >>"$written" &&
      mv -f "$written" "$record" && mv -f "$partial" "$precompiled"
  elif grep -q error "$log" && ! grep -qE NO_SPACE "$log"; then
    written=$(mktemp "$directory/.failed.XXXXXX") &&
      { echo "$*"; cat "$log"; } >>"$written" && mv -f "$written" "$failed"
  fi
  rm -f "$partial" "$log" "$marker" "${written:-}"
}
"""


def start_in_background(jobs: Sequence[_Precompile], cache: BuildCache) -> None:
    """Precompile ``jobs`` one after another in a background process of low priority.

    The process outlives this one (a script that ends, a kernel that restarts) and publishes
    each header as it is done; jobs that are done, failed or being built by another
    process are skipped.
    """
    pending = []
    for job in jobs:
        with cache.locked(job.lock):
            if job.done() or job.failed.is_file() or job.builder() is not None:
                continue
            pending.append(job)
    if not pending:
        return
    steps = [_BACKGROUND_PRECOMPILE.replace("NO_SPACE", shlex.quote(NO_SPACE.pattern))]
    for job in pending:
        # what the compiler writes: a file of ours, made now (never a symlink planted there)
        fd, name = tempfile.mkstemp(prefix="prefix.h.gch.bg", dir=job.header.parent)
        os.close(fd)
        partial = Path(name)
        files = (partial, job.precompiled, job.record, job.failed, job.marker)
        steps.append(shlex.join(["precompile", *map(str, files), *job.command(partial)]))
    process = subprocess.Popen(
        ["sh", "-c", "\n".join(steps)],
        cwd=cache.home,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "LC_ALL": "C"},
        start_new_session=True,  # not interrupted with the build that started it
        preexec_fn=_idle_priority,
    )
    for job in pending:
        write_atomic(job.marker, str(process.pid))
    threading.Thread(target=process.wait, name="opmagic-precompile", daemon=True).start()


def _idle_priority() -> None:
    """Give the calling (background) process only CPU time nothing else wants: at nice 10 a
    background precompile still took enough of a 2-core machine to make the first cell, which
    it runs beside, slower than load_inline of the same source."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):  # not Linux
        os.nice(19)


def macro_name(define: str) -> str:
    """``FOO`` of ``-DFOO=1``, ``-DFOO`` or ``-UFOO``."""
    return define[2:].split("=", 1)[0]


def _recorded_macros(path: Path) -> set[str]:
    """Macros recorded by :func:`record_macro` (none when the file is missing)."""
    recorded = read_json_file(path, list) or []  # missing or damaged: none recorded
    return {name for name in recorded if isinstance(name, str)}


def record_macro(path: Path, name: str) -> None:
    """Remember that the user macro ``name`` changes the headers of this prefix."""
    write_atomic(path, json.dumps(sorted(_recorded_macros(path) | {name})))
