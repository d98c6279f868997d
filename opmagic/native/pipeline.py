"""The build pipeline: a :class:`BuildOptions` in, the published build of its cache key out.

Steps: the cache key (source, flags, compiler, torch, preamble, the environment variables
that steer the compiler; for CUDA the toolkit and architectures); the build already
published for it, unless a file the compiler read for it (every one its dependency output
names: headers found by any path, ``-include`` files) changed since, its library is not the
one recorded (size and SHA-256), or ``force``; else, under the key's lock, a new one:
compile the unit after the precompiled torch prefix header, link, record ``build.json``,
and publish the directory atomically.
A :class:`BuildVariant` (the CUDA full path, :mod:`opmagic.native.cuda.library`) adds to the
key and builds with its own steps from the pieces here (:func:`compile_unit`, :func:`link`,
:func:`publish`, :func:`compile_error`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..cachedir import (
    NO_SPACE,
    NO_SPACE_ERRORS,
    READ_ONLY_ERRORS,
    BuildCache,
    ProgressCallback,
    Stopwatch,
    artifact_problem,
    artifact_record,
    digest,
    disk_full,
    read_record,
    write_atomic,
)
from ..errors import BuildOptionError, CompileError, MissingHeadersError
from .compiler import StepResult, run_step
from .diagnostics import (
    failure_text,
    first_error,
    locate_link_errors,
    parse_diagnostics,
    renumber_log,
)
from .headers import PREAMBLE, Prefix, macro_name, prepare_prefix, record_macro
from .inputs import (
    LINK_DEPENDENCIES,
    STARTED_MARKER,
    build_inputs,
    changed_input,
    include_misses,
    include_search,
    linker_dependency_flags,
    mark_started,
    record_files,
    started_ns,
    valid_file_record,
)
from .narrowing import narrow_include_dir, narrowable
from .options import BuildOptions
from .toolchain import INSTALL_PYTHON_HEADERS, Toolchain, find_toolchain

_MISSING_PYTHON_H = re.compile(r"\bPython\.h: No such file or directory")
_PCH_REJECTED = re.compile(r"\.gch: not used because (.*?) \[-Winvalid-pch\]")
_QUOTED_NAME = re.compile(r"`(\w+)'")


@dataclass(frozen=True)
class BuildInfo:
    """How a library was obtained: from the cache, or built now and what that took."""

    cached: bool
    directory: Path  # the published build: lib<name>.so, <name>.cpp, build.json
    header_set: str | None  # the precompiled torch header set used ("core", "all", ...)
    precompiled: bool  # whether a precompiled header was used
    headers_seconds: float  # spent precompiling headers in this call (0 when reused)
    compile_seconds: float
    link_seconds: float
    seconds: float  # the whole build step of this call: waiting, headers, compile, link
    commands: tuple[str, ...]  # compile and link commands
    log: str  # compiler and linker output (warnings)
    note: str = ""  # why precompiled headers were not used, when they were not
    source_name: str = ""  # the source as written, in ``directory``: the registration site
    cuda_mode: str = ""  # CUDA builds: "split" (nvcc and g++) or "whole" (nvcc alone)
    archs: tuple[str, ...] = ()  # CUDA builds: the GPU architectures compiled for
    device_seconds: float = 0.0  # CUDA builds: what nvcc took
    library_sha256: str = ""  # of lib<name>.so as published: the loader checks what it maps
    repaired: str = ""  # what was found damaged in the cache and rebuilt, if anything


class BuildVariant(Protocol):
    """A build with steps of its own (the CUDA full path's ``CudaBuild``): what it adds to
    the cache key, and how it builds a request in a scratch directory."""

    def identity(self) -> dict[str, Any]:
        """What about the variant changes the build (part of its cache key)."""
        ...

    @property
    def build(self) -> BuildSteps:
        """How it builds a request in a scratch directory."""
        ...


@dataclass(frozen=True)
class BuildRequest:
    """Everything that decides what a build produces (all of it is in ``key``)."""

    options: BuildOptions
    key: str
    flags: list[str]  # the toolchain's compile flags and the user's, but the user's -D/-U
    link_flags: list[str]
    variant: BuildVariant | None = None  # a build with its own steps (the CUDA full path)

    @classmethod
    def create(
        cls, options: BuildOptions, toolchain: Toolchain, variant: BuildVariant | None
    ) -> BuildRequest:
        """The request to build ``options`` with ``toolchain`` (and ``variant``), and its key."""
        flags = toolchain.compile_flags(options.opt_level, options.cflags)
        link_flags = toolchain.link_flags(options.ldflags)
        key = digest(
            {
                "source": options.source,
                "name": options.name,
                "flags": flags,
                "defines": options.defines,
                "include_dirs": options.include_dirs,
                "link_flags": link_flags,
                "preamble": PREAMBLE,
                "precompiled_headers": options.precompiled_headers,
                **toolchain.identity(),
                **(variant.identity() if variant is not None else {}),
            }
        )
        return cls(options, key, flags, link_flags, variant)


# How a request is built in a scratch directory: (request, toolchain, cache, scratch, stopwatch)
BuildSteps = Callable[[BuildRequest, Toolchain, BuildCache, Path, Stopwatch], BuildInfo]


def published_build(
    options: BuildOptions, variant: BuildVariant | None, progress: ProgressCallback | None
) -> tuple[BuildRequest, BuildInfo]:
    """The published build of ``options`` (with ``variant``: by its steps, e.g. the CUDA full
    path's): from the cache, or built and published now under its key's lock."""
    toolchain = find_toolchain()
    cache = BuildCache()
    request = BuildRequest.create(options, toolchain, variant)
    try:
        return request, _cached_or_built(request, toolchain, cache, progress)
    except OSError as error:
        if error.errno in (*NO_SPACE_ERRORS, *READ_ONLY_ERRORS):
            raise cache.unwritable(error, f"build lib{options.name}.so") from None
        raise


def _cached_or_built(
    request: BuildRequest,
    toolchain: Toolchain,
    cache: BuildCache,
    progress: ProgressCallback | None,
) -> BuildInfo:
    """The published build of ``request.key``: from the cache, or built and published now.

    A published directory is complete (it appears by one rename), so it is read without the
    lock: a read-only cache serves the builds it holds.
    """
    force, verbose = request.options.force, request.options.verbose
    stopwatch = Stopwatch(f"lib{request.options.name}.so", progress)
    directory = cache.lib_dir(request.key)
    name = f"lib{request.options.name}.so"
    recorded, damage = (None, "") if force else _recorded_build(directory, name)
    if recorded is not None:
        if verbose:
            _print_verbose(f"opmagic: cached build {directory}", recorded.commands, "")
        return recorded

    def on_wait(pid: str) -> None:
        """Report waiting for the process that builds the same key."""
        stopwatch.report(f"waiting for pid {pid}, which builds the same source")

    with cache.locked(request.key, on_wait) as waited:
        if waited and not force:  # the process we waited for may have published it
            recorded, damage = _recorded_build(directory, name)
            if recorded is not None:
                stopwatch.finish()
                return recorded
        if damage:
            stopwatch.report(f"the cached build was damaged ({damage}); rebuilding")
        try:
            with cache.publishing(request.key, directory) as scratch:
                mark_started(scratch)
                steps: BuildSteps = request.variant.build if request.variant else _build
                built = steps(request, toolchain, cache, scratch, stopwatch)
        except BaseException:
            stopwatch.finish(failed=True)
            raise
    stopwatch.finish()
    if verbose:
        _print_verbose(f"opmagic: built {directory}", built.commands, built.log)
    repaired = "; ".join(part for part in (damage, built.repaired) if part)
    return dataclasses.replace(built, directory=directory, repaired=repaired)


def _recorded_build(directory: Path, library: str) -> tuple[BuildInfo | None, str]:
    """``(the published build in directory, "")``, or ``(None, why it cannot be used)``: the
    reason is "" when there is simply none, or something the build read changed since (a
    file's content, a file the include search would now find first)."""
    record, damage = read_record(directory, "build.json")
    if record is None:
        return None, damage
    problem = _record_problem(record)
    if problem is not None:
        return None, f"its record build.json {problem}"
    problem = artifact_problem(directory / library, record["library"], rehash=True)
    if problem is not None:
        return None, problem
    if any(changed_input(entry) for entry in record["inputs"]) or any(
        os.path.lexists(path) for path in record["absent"]
    ):
        return None, ""
    return (
        BuildInfo(
            cached=True,
            directory=directory,
            header_set=record["header_set"],
            precompiled=record["precompiled"],
            headers_seconds=0.0,
            compile_seconds=0.0,
            link_seconds=0.0,
            seconds=0.0,
            commands=tuple(record["commands"]),
            log=record["log"],
            note=record["note"],
            source_name=record["source_name"],
            cuda_mode=record["cuda_mode"],
            archs=tuple(record["archs"]),
            library_sha256=record["library"]["sha256"],
        ),
        "",
    )


# what every build.json holds: key -> the types its value may have
_RECORD_FIELDS: dict[str, tuple[type, ...]] = {
    "header_set": (str, type(None)),
    "precompiled": (bool,),
    "commands": (list,),
    "log": (str,),
    "note": (str,),
    "source_name": (str,),
    "cuda_mode": (str,),
    "archs": (list,),
    "inputs": (list,),
    "absent": (list,),
    "library": (dict,),
}


def _record_problem(record: dict) -> str | None:
    """What is wrong with the shape of a build record (a key missing, a value of another
    type), or None: a record of the wrong shape is treated as damaged, never trusted."""
    for key, types in _RECORD_FIELDS.items():
        if not isinstance(record.get(key, ...), types):
            return f"has no valid {key!r}"
    if not all(isinstance(s, str) for s in [*record["commands"], *record["archs"]]):
        return "has commands or architectures that are not text"
    if not all(isinstance(p, str) for p in record["absent"]):
        return "has an include search record that is not a list of paths"
    if not all(valid_file_record(entry) for entry in record["inputs"]):
        return "has an input record of the wrong shape"
    return None


def _build(
    request: BuildRequest,
    toolchain: Toolchain,
    cache: BuildCache,
    scratch: Path,
    stopwatch: Stopwatch,
) -> BuildInfo:
    """Compile and link ``request`` in ``scratch`` (which becomes the published directory)."""
    name = request.options.name
    source_name = f"{name}.cpp"
    unit = compile_unit(
        request,
        toolchain,
        cache,
        scratch,
        stopwatch,
        source_text=request.options.source,
        source_name=source_name,
    )
    if unit.step.returncode != 0:
        raise compile_error(request, toolchain, unit.step, source_name)
    if not (scratch / unit.object_name).is_file():
        raise BuildOptionError(
            f"The compiler finished without error but wrote no object file for {source_name}: "
            f"a flag stops it early or sends its output elsewhere ({unit.step.command_line})."
        )
    linked = link(request, toolchain, scratch, stopwatch, [unit.object_name])
    if linked.returncode != 0:
        raise compile_error(request, toolchain, linked, source_name)
    return publish(
        request, toolchain, cache, scratch, stopwatch, unit, [unit.step, linked], source_name
    )


@dataclass(frozen=True)
class CompiledUnit:
    """One C++ translation unit compiled with the torch prefix header."""

    step: StepResult
    prefix: Prefix
    object_name: str
    deps_name: str


def compile_unit(
    request: BuildRequest,
    toolchain: Toolchain,
    cache: BuildCache,
    scratch: Path,
    stopwatch: Stopwatch,
    *,
    source_text: str,
    source_name: str,
    extra_flags: Sequence[str] = (),
    extra_includes: Sequence[str] = (),
    step: str = "compiling",
) -> CompiledUnit:
    """Write ``source_text`` to ``source_name`` and compile it after the prefix header.

    ``extra_includes`` are force-included after the prefix (the precompiled header must come
    first); ``extra_flags`` are added to the compile only (not to the precompiled header).
    A source that :func:`~opmagic.native.narrowing.narrowable` allows is compiled with its
    umbrella headers narrowed first, and again in full should that fail.
    The result's step may have failed: the caller raises.
    """
    stem = source_name.rsplit(".", 1)[0]
    (scratch / source_name).write_text(source_text)
    attempts = (True, False) if narrowable(source_text) else (False,)
    for narrow in attempts:
        prefix = prepare_prefix(
            source_text,
            toolchain,
            request.flags,
            request.options.defines,
            cache,
            stopwatch,
            precompile=request.options.precompiled_headers,
            force=request.options.force,  # retries a failed precompile, re-hashes a precompiled one
            search_flags=extra_flags,
            narrow=narrow,
        )
        stopwatch.report(step if narrow == attempts[0] else f"{step} with the full torch headers")
        narrowed = ("-I", str(narrow_include_dir(cache))) if narrow else ()
        command = [
            *((toolchain.ccache,) if toolchain.ccache else ()),
            *toolchain.compiler,
            *request.flags,
            *(f"-I{d}" for d in request.options.include_dirs),
            *extra_flags,
            *narrowed,  # after the user's directories: a torch/extension.h of theirs comes first
            *request.options.defines,
            f"-DTORCH_EXTENSION_NAME={request.options.name}",
            "-Winvalid-pch",
            "-include",
            str(prefix.header),
            *(flag for header in extra_includes for flag in ("-include", header)),
            *output_flags(source_name, f"{stem}.o", f"{stem}.d"),
        ]
        compiled = run_step(
            command, cwd=scratch, stopwatch=stopwatch, env=compile_env(toolchain, cache)
        )
        if compiled.returncode == 0 or narrow == attempts[-1] or NO_SPACE.search(compiled.output):
            break
    prefix.start_pending(cache)
    return CompiledUnit(compiled, prefix, f"{stem}.o", f"{stem}.d")


def output_flags(source_name: str, object_name: str, deps_name: str) -> list[str]:
    """The flags that compile ``source_name`` into ``object_name``, listing every file the
    compiler read in ``deps_name`` (``-MD``: what the cache checks before reusing a build)."""
    return ["-MD", "-MF", deps_name, "-c", source_name, "-o", object_name]


def link(
    request: BuildRequest,
    toolchain: Toolchain,
    scratch: Path,
    stopwatch: Stopwatch,
    objects: Sequence[str],
    extra_flags: Sequence[str] = (),
) -> StepResult:
    """Link ``objects`` into ``lib<name>.so`` against libtorch."""
    stopwatch.report("linking")
    return run_step(
        [
            *toolchain.compiler,
            *objects,
            "-o",
            f"lib{request.options.name}.so",
            *extra_flags,
            *request.link_flags,
            *linker_dependency_flags(toolchain),
        ],
        cwd=scratch,
        stopwatch=stopwatch,
        env={**os.environ, "LC_ALL": "C"},
    )


def publish(
    request: BuildRequest,
    toolchain: Toolchain,
    cache: BuildCache,
    scratch: Path,
    stopwatch: Stopwatch,
    unit: CompiledUnit | None,
    steps: Sequence[StepResult],
    source_name: str,
    *,
    deps_files: Sequence[str] = (),
    leftovers: Sequence[str] = (),
    cuda_mode: str = "",
    archs: Sequence[str] = (),
    device_seconds: float = 0.0,
    note: str = "",
) -> BuildInfo:
    """Record a finished build in ``scratch/build.json`` (intermediate files removed), with
    what it read (:mod:`.inputs`).

    ``unit``: the translation unit compiled with the torch prefix header, if any (its
    precompiled header may have been refused: a macro of the user's is then recorded so
    that the next build precompiles it in).
    """
    precompiled, header_set, headers_seconds = False, None, 0.0
    if unit is not None:
        prefix = unit.prefix
        header_set, headers_seconds = prefix.header_set, prefix.seconds
        rejected = _PCH_REJECTED.search(unit.step.output) if prefix.precompiled else None
        note = note or prefix.note
        if rejected is not None:
            note = f"GCC did not use the precompiled header ({rejected[1]})"
            macro = _QUOTED_NAME.search(rejected[1])
            if prefix.macros_file is not None and macro and macro[1] in _macro_names(request):
                record_macro(prefix.macros_file, macro[1])
                note += f"; the next build precompiles the headers with your {macro[1]}"
        precompiled = prefix.precompiled and rejected is None
        deps_files = [unit.deps_name, *deps_files]
        leftovers = [unit.object_name, *leftovers]
    log = "\n".join(step.output for step in steps if step.output.strip())
    compile_seconds = sum(s.seconds for s in steps[:-1]) - device_seconds
    options = request.options
    read = build_inputs(
        scratch, deps_files, [*options.cflags, *options.ldflags, *options.defines], cache.home
    )
    search_flags = (*request.flags, *(f"-I{d}" for d in options.include_dirs))
    environment = tuple(sorted(compile_env(toolchain, cache).items()))
    search = include_search(toolchain.compiler, search_flags, environment)
    record: dict[str, Any] = {
        "header_set": header_set.name if header_set else None,
        "precompiled": precompiled,
        "commands": [step.command_line for step in steps],
        "log": log,
        "note": note,
        "source_name": source_name,
        "cuda_mode": cuda_mode,
        "archs": list(archs),
        "inputs": record_files(read, started_ns(scratch)),
        "absent": include_misses(options.source, read, search),
        "library": artifact_record(scratch / f"lib{request.options.name}.so"),
        "compile_seconds": compile_seconds,
        "link_seconds": steps[-1].seconds,
    }
    for leftover in [*leftovers, *deps_files, LINK_DEPENDENCIES, STARTED_MARKER]:
        (scratch / leftover).unlink(missing_ok=True)
    write_atomic(scratch / "build.json", json.dumps(record, indent=1))
    return BuildInfo(
        cached=False,
        directory=scratch,
        header_set=record["header_set"],
        precompiled=precompiled,
        headers_seconds=headers_seconds,
        compile_seconds=compile_seconds,
        link_seconds=steps[-1].seconds,
        seconds=stopwatch.elapsed,
        commands=tuple(record["commands"]),
        log=log,
        note=note,
        source_name=source_name,
        cuda_mode=cuda_mode,
        archs=tuple(archs),
        device_seconds=device_seconds,
        library_sha256=record["library"]["sha256"],
        repaired=unit.prefix.repaired if unit is not None else "",
    )


def _macro_names(request: BuildRequest) -> set[str]:
    """Names of the macros the user set with -D/-U."""
    return {macro_name(d) for d in request.options.defines}


def compile_env(toolchain: Toolchain, cache: BuildCache) -> dict[str, str]:
    """The compile's environment: English messages with plain quotes (they are parsed), and
    for ccache paths relative to the cache (hits across scratch dirs) and PCH-safe settings."""
    env = {**os.environ, "LC_ALL": "C"}
    if toolchain.ccache:
        env["CCACHE_BASEDIR"] = str(cache.home)
        env["CCACHE_SLOPPINESS"] = "pch_defines,time_macros,include_file_mtime,include_file_ctime"
    return env


def compile_error(
    request: BuildRequest, toolchain: Toolchain, step: StepResult, source_name: str
) -> Exception:
    """The exception for a failed compile or link: its errors at their source lines, and the
    compiler's output with the source's lines numbered as the user sees them."""
    options = request.options
    diagnostics = locate_link_errors(parse_diagnostics(step.output, source_name), options.source)
    error = first_error(diagnostics)
    if error is not None and _MISSING_PYTHON_H.search(error.message):
        return MissingHeadersError(
            f"Python.h is missing ({toolchain.python_include}); the source includes it "
            f"(directly or through torch/extension.h): {INSTALL_PYTHON_HEADERS}."
        )
    library = f"lib{options.name}.so"
    no_space = NO_SPACE.search(step.output)
    if no_space is not None:
        line = step.output[: no_space.end()].rsplit("\n", 1)[-1]
        return disk_full(f"building {library}, {line}")
    return CompileError(
        failure_text(library, diagnostics, options.source, options.label, options.first_line),
        diagnostics=diagnostics,
        log=renumber_log(step.output, source_name, options.first_line),
        command=step.command_line,
        source=options.source,
        label=options.label,
        first_line=options.first_line,
    )


def _print_verbose(title: str, commands: Iterable[str], log: str) -> None:
    """``verbose=True``: the build's commands and compiler output, on stderr."""
    lines = [title, *(f"  $ {c}" for c in commands)]
    if log.strip():
        lines.append(log.rstrip())
    print("\n".join(lines), file=sys.stderr)
