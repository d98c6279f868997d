"""``compile_library``: C++ source with ``TORCH_LIBRARY`` blocks in, registered operators out.

Steps: pick the cached build of the source (key: source, flags, compiler, torch, preamble)
or build it under the key's lock (precompiled prefix header, compile, link, atomic
publish); map a private copy of it; then register its blocks, replacing the library it
supersedes, and compare the dispatcher before and after to say what it added.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..dispatch import _torch
from ..dispatch.sites import add_labeler
from ..errors import (
    BuildOptionError,
    CompileError,
    MissingHeadersError,
    RegistrationError,
)
from .cache import BuildCache, digest, write_atomic
from .compiler import StepResult, run_step
from .diagnostics import failure_text, first_error, parse_diagnostics, where
from .headers import PREAMBLE, Prefix, macro_name, prepare_prefix, record_macro
from .loader import Block, NativeLibrary
from .progress import ProgressCallback, Stopwatch, stderr_progress
from .registrations import (
    NewKernel,
    NewOperator,
    kernels_added,
    operators_added,
    snapshot,
)
from .toolchain import INSTALL_PYTHON_HEADERS, Toolchain, find_toolchain

if TYPE_CHECKING:
    from ..dispatch.table import DispatchTable
    from .cuda_library import CudaBuild

OPT_LEVELS = ("0", "1", "2", "3", "s", "g")
DEFAULT_OPT_LEVEL = "1"  # builds ~25% faster than -O2; ask for 2 or 3 to time kernels
DEFAULT_NAME = "opmagic_library"
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_FIRST_NAMESPACE = re.compile(r"\bTORCH_LIBRARY(?:_FRAGMENT|_IMPL)?\s*\(\s*([A-Za-z_]\w*)")
_MISSING_PYTHON_H = re.compile(r"\bPython\.h: No such file or directory")
_SIGNATURE_CHANGED = "Mismatch in kernel C++ signatures"
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


@dataclass(eq=False)
class LoadedLibrary:
    """A compiled library loaded into this process, and what it registered.

    ``operators`` are the operators it defined, ``kernels`` the kernels it registered (per
    operator and dispatch key), both found by comparing the dispatcher before and after its
    registration. :meth:`close` removes all of it.
    """

    name: str
    key: str  # the cache key of the build
    path: Path  # the built shared library in the cache
    source_file: Path  # the source as compiled: the registration site torch records
    source: str
    label: str  # how messages name the source, e.g. "cell [3]" or "myops.cpp"
    first_line: int  # the number the source's first line has where the user sees it
    blocks: tuple[Block, ...]
    operators: tuple[NewOperator, ...]
    kernels: tuple[NewKernel, ...]
    build: BuildInfo
    load_seconds: float  # mapping, registering and comparing the dispatcher
    _native: NativeLibrary = field(repr=False)
    closed: bool = False

    @property
    def namespaces(self) -> tuple[str, ...]:
        """Namespaces of the library's blocks, in source order (``_`` for fallbacks)."""
        return tuple(dict.fromkeys(b.namespace for b in self.blocks))

    @property
    def description(self) -> str:
        """One line for listings: the library, its operators and how many kernels it added."""
        ops = ", ".join(op.name for op in self.operators) or "no new operators"
        kind = "CUDA" if self.build.cuda_mode else "C++"
        return f"{kind} library {self.name}: {ops}; {len(self.kernels)} kernels"

    def where(self, line: int | None) -> str:
        """A source line as the user sees it: ``cell [3], line 6``."""
        return where(self.label, line, self.first_line)

    def tables(self) -> list[DispatchTable]:
        """The dispatch table of each operator the library defined."""
        from ..dispatch.table import dispatch_table

        return [dispatch_table(op.name) for op in self.operators] if not self.closed else []

    def close(self) -> None:
        """Remove every operator and kernel the library registered (idempotent).

        The code stays mapped (tensors or autograd graphs may still point into it); only
        the registrations go, and ``torch.ops`` forgets the operators it defined.
        """
        if self.closed:
            return
        self._native.fini()
        self.closed = True
        _torch.forget_cached_ops([op.name for op in self.operators])
        _SITE_LABELS.pop(str(self.source_file), None)

    def _registered_namespaces(self) -> set[str]:
        """Namespaces whose operators the library may have registered (not ``_``)."""
        return {ns for ns in self.namespaces if ns != "_"}

    def __str__(self) -> str:
        from ..view.library import library_text

        return library_text(self)

    def _repr_html_(self) -> str:
        from ..view.library import library_html

        return library_html(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self) if not cycle else f"LoadedLibrary({self.name})")


def compile_library(
    source: str,
    *,
    name: str | None = None,
    extra_cflags: Sequence[str] | str = (),
    extra_ldflags: Sequence[str] | str = (),
    include_dirs: Sequence[str | os.PathLike] = (),
    opt_level: int | str = DEFAULT_OPT_LEVEL,
    precompiled_headers: bool = True,
    force: bool = False,
    verbose: bool = False,
    replace: LoadedLibrary | None = None,
    label: str | None = None,
    first_line: int = 1,
    progress: ProgressCallback | None = stderr_progress,
) -> LoadedLibrary:
    """Compile C++ ``source`` with TORCH_LIBRARY blocks, load it, and register its operators.

    The source is written as for a real extension (its own ``#include`` lines) and compiled
    unchanged, so compiler line numbers are its line numbers. Builds are cached per user
    (``$XDG_CACHE_HOME/opmagic``); ``force=True`` rebuilds. ``replace``: a library this one
    supersedes (the previous version of the same code): it is unregistered first and
    registered again if this one fails. ``label`` and ``first_line`` say how messages name
    the source (``"cell [3]"``, whose first source line is line 2 of the cell).
    ``progress`` is called while building (default: a line on stderr; ``None``: silent).

    Raises :class:`~opmagic.errors.CompileError` (the first error at its source line),
    :class:`~opmagic.errors.RegistrationError` (torch rejected a registration; the previous
    version stays registered), or a :class:`~opmagic.errors.ToolchainError` naming what to
    install.
    """
    return compile_and_load(
        source,
        name=name,
        extra_cflags=extra_cflags,
        extra_ldflags=extra_ldflags,
        include_dirs=include_dirs,
        opt_level=opt_level,
        precompiled_headers=precompiled_headers,
        force=force,
        verbose=verbose,
        replace=replace,
        label=label,
        first_line=first_line,
        progress=progress,
        cuda=None,
    )


def compile_and_load(
    source: str,
    *,
    name: str | None,
    extra_cflags: Sequence[str] | str,
    extra_ldflags: Sequence[str] | str,
    include_dirs: Sequence[str | os.PathLike],
    opt_level: int | str,
    precompiled_headers: bool,
    force: bool,
    verbose: bool,
    replace: LoadedLibrary | None,
    label: str | None,
    first_line: int,
    progress: ProgressCallback | None,
    cuda: CudaBuild | None,
) -> LoadedLibrary:
    """The pipeline of :func:`compile_library`; with ``cuda``, of the CUDA full path too."""
    if not isinstance(source, str) or not source.strip():
        raise BuildOptionError(
            f"The source is empty: write {'CUDA ' if cuda else ''}C++ with TORCH_LIBRARY / "
            "TORCH_LIBRARY_IMPL blocks."
        )
    source = source.rstrip() + "\n"  # trailing blank lines do not make another build
    name = _library_name(name, source)
    cflags, defines = _split_defines(_flag_list(extra_cflags, "extra_cflags"))
    ldflags = _flag_list(extra_ldflags, "extra_ldflags")
    includes = tuple(str(Path(d).expanduser().absolute()) for d in include_dirs)
    missing = [d for d in includes if not os.path.isdir(d)]
    if missing:
        raise BuildOptionError(f"Include directory not found: {', '.join(missing)}.")
    opt = _opt_level(opt_level)
    if not isinstance(first_line, int) or first_line < 1:
        raise BuildOptionError(f"first_line must be a positive line number, got {first_line!r}.")
    toolchain = find_toolchain()
    cache = BuildCache()
    flags = toolchain.compile_flags(opt, cflags)
    link_flags = toolchain.link_flags(ldflags)
    key = digest(
        {
            "source": source,
            "name": name,
            "flags": flags,
            "defines": defines,
            "include_dirs": includes,
            "link_flags": link_flags,
            "preamble": PREAMBLE,
            "precompiled_headers": precompiled_headers,
            **toolchain.identity(),
            **(cuda.identity() if cuda is not None else {}),
        }
    )
    label = label or f"{name}.{'cu' if cuda is not None else 'cpp'}"
    build = _cached_or_built(
        _BuildRequest(
            source, name, key, flags, defines, link_flags, includes, precompiled_headers, cuda
        ),
        toolchain,
        cache,
        label,
        first_line,
        force=force,
        verbose=verbose,
        progress=progress,
    )
    started = time.perf_counter()
    native = NativeLibrary(build.directory / f"lib{name}.so")
    source_file = build.directory / build.source_name
    if not native.blocks:
        raise RegistrationError(
            f"{label} defines no TORCH_LIBRARY, TORCH_LIBRARY_FRAGMENT or TORCH_LIBRARY_IMPL "
            "block: there is nothing to register."
        )
    operators, kernels = _register(native, source_file, replace, label, first_line)
    return LoadedLibrary(
        name=name,
        key=key,
        path=build.directory / f"lib{name}.so",
        source_file=source_file,
        source=source,
        label=label,
        first_line=first_line,
        blocks=native.blocks,
        operators=operators,
        kernels=kernels,
        build=build,
        load_seconds=time.perf_counter() - started,
        _native=native,
    )


# ---------------------------------------------------------------- options


def _library_name(name: str | None, source: str) -> str:
    """``name`` checked, or the first namespace of the source's blocks."""
    if name is None:
        match = _FIRST_NAMESPACE.search(source)
        return match[1] if match and match[1] != "_" else DEFAULT_NAME
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        raise BuildOptionError(
            f"The library name must be a C identifier (letters, digits, _), got {name!r}."
        )
    return name


def _flag_list(flags: Sequence[str] | str, what: str) -> tuple[str, ...]:
    """Flags as a tuple; one string is split like a shell would."""
    if isinstance(flags, str):
        return tuple(shlex.split(flags))
    flags = tuple(flags)
    if not all(isinstance(f, str) for f in flags):
        raise BuildOptionError(f"{what} must be strings (compiler flags), got {flags!r}.")
    return flags


def _split_defines(flags: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(other flags, -D/-U flags)``; ``-D X`` becomes ``-DX``."""
    others: list[str] = []
    defines: list[str] = []
    pending: str | None = None
    for flag in flags:
        if pending is not None:
            defines.append(pending + flag)
            pending = None
        elif flag in ("-D", "-U"):
            pending = flag
        elif flag.startswith(("-D", "-U")):
            defines.append(flag)
        else:
            others.append(flag)
    if pending is not None:
        raise BuildOptionError(f"extra_cflags ends with {pending} and no macro after it.")
    return tuple(others), tuple(defines)


def _opt_level(level: int | str) -> str:
    """``"2"`` for ``2``, ``"2"`` or ``"-O2"``; raises for levels GCC does not have."""
    text = str(level).removeprefix("-O")
    if text not in OPT_LEVELS:
        raise BuildOptionError(
            f"Unknown optimisation level {level!r}: use one of {', '.join(OPT_LEVELS)} "
            "(as in -O0 ... -O3, -Os, -Og)."
        )
    return text


# ---------------------------------------------------------------- building


@dataclass(frozen=True)
class _BuildRequest:
    """Everything that decides what a build produces (all of it is in ``key``)."""

    source: str
    name: str
    key: str
    flags: list[str]  # everything but the user's -D/-U flags
    defines: tuple[str, ...]  # the user's -D/-U flags
    link_flags: list[str]
    include_dirs: tuple[str, ...]
    precompiled_headers: bool
    cuda: CudaBuild | None = None  # a CUDA full-path build: its own steps (cuda_library.py)


def _cached_or_built(
    request: _BuildRequest,
    toolchain: Toolchain,
    cache: BuildCache,
    label: str,
    first_line: int,
    *,
    force: bool,
    verbose: bool,
    progress: ProgressCallback | None,
) -> BuildInfo:
    """The published build of ``request.key``: from the cache, or built and published now."""
    stopwatch = Stopwatch(f"lib{request.name}.so", progress)
    directory = cache.lib_dir(request.key)
    waited = False

    def on_wait(pid: str) -> None:
        """Report waiting for the process that builds the same key."""
        nonlocal waited
        waited = True
        stopwatch.report(f"waiting for pid {pid}, which builds the same source")

    with cache.locked(request.key, on_wait):
        recorded = None if force else _recorded_build(directory)
        if recorded is not None:
            if waited:
                stopwatch.finish()
            if verbose:
                _print_verbose(f"opmagic: cached build {directory}", recorded.commands, "")
            return recorded
        scratch = cache.scratch_dir(request.key)
        try:
            steps = request.cuda.build if request.cuda is not None else _build
            build = steps(request, toolchain, cache, scratch, stopwatch, label, first_line, force)
            if directory.exists():  # a forced rebuild, or one because a user header changed
                shutil.rmtree(directory)
            os.rename(scratch, directory)  # atomic: readers see no build or a whole one
        except BaseException:
            stopwatch.finish(failed=True)
            raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    stopwatch.finish()
    if verbose:
        _print_verbose(f"opmagic: built {directory}", build.commands, build.log)
    return dataclasses.replace(build, directory=directory)


def _recorded_build(directory: Path) -> BuildInfo | None:
    """The published build in ``directory``, unless missing or a user header changed since."""
    try:
        record = json.loads((directory / "build.json").read_text())
    except (OSError, ValueError):
        return None
    if os.stat(directory).st_uid != os.getuid() or "source_name" not in record:
        return None  # someone else's, or recorded by an opmagic that did not name the source
    for path, size, mtime_ns in record["user_headers"]:
        try:
            info = os.stat(path)
        except OSError:
            return None
        if (info.st_size, info.st_mtime_ns) != (size, mtime_ns):
            return None
    return BuildInfo(
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
        cuda_mode=record.get("cuda_mode", ""),
        archs=tuple(record.get("archs", ())),
    )


def _build(
    request: _BuildRequest,
    toolchain: Toolchain,
    cache: BuildCache,
    scratch: Path,
    stopwatch: Stopwatch,
    label: str,
    first_line: int,
    retry_headers: bool,
) -> BuildInfo:
    """Compile and link ``request`` in ``scratch`` (which becomes the published directory)."""
    name = request.name
    source_name = f"{name}.cpp"
    unit = compile_unit(
        request,
        toolchain,
        cache,
        scratch,
        stopwatch,
        source_text=request.source,
        source_name=source_name,
        retry_headers=retry_headers,
    )
    if unit.step.returncode != 0:
        raise compile_error(request, toolchain, unit.step, source_name, label, first_line)
    linked = link(request, toolchain, scratch, stopwatch, [unit.object_name])
    if linked.returncode != 0:
        raise compile_error(request, toolchain, linked, source_name, label, first_line)
    return publish(request, scratch, stopwatch, unit, [unit.step, linked], source_name)


@dataclass(frozen=True)
class CompiledUnit:
    """One C++ translation unit compiled with the torch prefix header."""

    step: StepResult
    prefix: Prefix
    object_name: str
    deps_name: str


def compile_unit(
    request: _BuildRequest,
    toolchain: Toolchain,
    cache: BuildCache,
    scratch: Path,
    stopwatch: Stopwatch,
    *,
    source_text: str,
    source_name: str,
    retry_headers: bool,
    extra_flags: Sequence[str] = (),
    extra_includes: Sequence[str] = (),
    step: str = "compiling",
) -> CompiledUnit:
    """Write ``source_text`` to ``source_name`` and compile it after the prefix header.

    ``extra_includes`` are force-included after the prefix (the precompiled header must come
    first); ``extra_flags`` are added to the compile only (not to the precompiled header).
    The result's step may have failed: the caller raises.
    """
    stem = source_name.rsplit(".", 1)[0]
    (scratch / source_name).write_text(source_text)
    prefix = prepare_prefix(
        source_text,
        toolchain,
        request.flags,
        request.defines,
        cache,
        stopwatch,
        precompile=request.precompiled_headers,
        retry_failed=retry_headers,
        search_flags=extra_flags,
    )
    stopwatch.report(step)
    command = [
        *((toolchain.ccache,) if toolchain.ccache else ()),
        *toolchain.compiler,
        *request.flags,
        *(f"-I{d}" for d in request.include_dirs),
        *extra_flags,
        *request.defines,
        f"-DTORCH_EXTENSION_NAME={request.name}",
        "-Winvalid-pch",
        "-include",
        str(prefix.header),
        *(flag for header in extra_includes for flag in ("-include", header)),
        "-MD",
        "-MF",
        f"{stem}.d",
        "-c",
        source_name,
        "-o",
        f"{stem}.o",
    ]
    compiled = run_step(
        command, cwd=scratch, stopwatch=stopwatch, env=compile_env(toolchain, cache)
    )
    return CompiledUnit(compiled, prefix, f"{stem}.o", f"{stem}.d")


def link(
    request: _BuildRequest,
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
            f"lib{request.name}.so",
            *extra_flags,
            *request.link_flags,
        ],
        cwd=scratch,
        stopwatch=stopwatch,
        env={**os.environ, "LC_ALL": "C"},
    )


def publish(
    request: _BuildRequest,
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
    """Record a finished build in ``scratch/build.json`` (intermediate files removed).

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
    record = {
        "header_set": header_set.name if header_set else None,
        "precompiled": precompiled,
        "commands": [step.command_line for step in steps],
        "log": log,
        "note": note,
        "source_name": source_name,
        "cuda_mode": cuda_mode,
        "archs": list(archs),
        "user_headers": sorted(
            {h for d in deps_files for h in _user_headers(scratch / d, request.include_dirs)}
        ),
        "compile_seconds": compile_seconds,
        "link_seconds": steps[-1].seconds,
    }
    for leftover in [*leftovers, *deps_files]:
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
    )


def _macro_names(request: _BuildRequest) -> set[str]:
    """Names of the macros the user set with -D/-U."""
    return {macro_name(d) for d in request.defines}


def compile_env(toolchain: Toolchain, cache: BuildCache) -> dict[str, str]:
    """The compile's environment: English messages with plain quotes (they are parsed), and
    for ccache paths relative to the cache (hits across scratch dirs) and PCH-safe settings."""
    env = {**os.environ, "LC_ALL": "C"}
    if toolchain.ccache:
        env["CCACHE_BASEDIR"] = str(cache.home)
        env["CCACHE_SLOPPINESS"] = "pch_defines,time_macros,include_file_mtime,include_file_ctime"
    return env


def _user_headers(deps_file: Path, include_dirs: tuple[str, ...]) -> list[tuple[str, int, int]]:
    """``(path, size, mtime_ns)`` of headers from the user's include dirs the build read."""
    if not include_dirs or not deps_file.is_file():
        return []
    roots = tuple(os.path.join(os.path.realpath(d), "") for d in include_dirs)
    text = deps_file.read_text().replace("\\\n", " ")
    headers = []
    for token in text.split()[1:]:
        path = os.path.realpath(token)
        if path.startswith(roots):
            info = os.stat(path)
            headers.append((path, info.st_size, info.st_mtime_ns))
    return headers


def compile_error(
    request: _BuildRequest,
    toolchain: Toolchain,
    step: StepResult,
    source_name: str,
    label: str,
    first_line: int,
) -> Exception:
    """The exception for a failed compile or link: the first error at its source line."""
    diagnostics = parse_diagnostics(step.output, source_name)
    error = first_error(diagnostics)
    if error is not None and _MISSING_PYTHON_H.search(error.message):
        return MissingHeadersError(
            f"Python.h is missing ({toolchain.python_include}); the source includes it "
            f"(directly or through torch/extension.h): {INSTALL_PYTHON_HEADERS}."
        )
    library = f"lib{request.name}.so"
    return CompileError(
        failure_text(library, diagnostics, request.source, label, first_line),
        diagnostics=diagnostics,
        log=step.output,
        command=step.command_line,
        source=request.source,
        label=label,
        first_line=first_line,
    )


def _print_verbose(title: str, commands: Iterable[str], log: str) -> None:
    """``verbose=True``: the build's commands and compiler output, on stderr."""
    lines = [title, *(f"  $ {c}" for c in commands)]
    if log.strip():
        lines.append(log.rstrip())
    print("\n".join(lines), file=sys.stderr)


# ---------------------------------------------------------------- registering


def _register(
    native: NativeLibrary,
    source_file: Path,
    replace: LoadedLibrary | None,
    label: str,
    first_line: int,
) -> tuple[tuple[NewOperator, ...], tuple[NewKernel, ...]]:
    """Register ``native``'s blocks in place of ``replace``; what they added to the dispatcher.

    The operators of the replaced library are held in the dispatcher meanwhile, so handles
    to them (a ``static`` typed handle in another library) stay valid across the swap,
    unless a kernel's C++ signature changes. If the new registration fails, the replaced
    library is registered again and :class:`RegistrationError` names the failing block.
    """
    previous = replace if replace is not None and not replace.closed else None
    namespaces = {b.namespace for b in native.blocks if b.namespace != "_"}
    if previous is not None:
        namespaces |= previous._registered_namespaces()
    held = native.hold(_names_in(namespaces)) if previous is not None else None
    redefined = [op.name for op in previous.operators] if previous is not None else []
    _SITE_LABELS[str(source_file)] = (label, first_line)
    try:
        if previous is not None:
            previous._native.fini()
        before = snapshot(namespaces)
        failure = native.init(str(source_file))
        if failure is not None and held is not None and _SIGNATURE_CHANGED in failure[0]:
            # a held entry remembers its kernels' old C++ signature: let the entries go
            # (handles to them were typed for the old signature anyway) and register afresh
            native.release(held)
            held = None
            failure = native.init(str(source_file))
        if failure is not None:
            raise _registration_error(failure, previous, label, first_line, source_file)
        after = snapshot(namespaces)
        operators = operators_added(before, after, str(source_file))
        redefined += [op.name for op in operators]
        if previous is not None:
            previous.closed = True
    finally:
        if held is not None:
            native.release(held)
        # torch.ops caches a packet per operator: drop those whose definition changed (only
        # those: torch keys tables by the packets of operators it owns, aten's included)
        _torch.forget_cached_ops(redefined)
    return operators, kernels_added(before, after, str(source_file))


def _registration_error(
    failure: tuple[str, int],
    previous: LoadedLibrary | None,
    label: str,
    first_line: int,
    source_file: Path,
) -> RegistrationError:
    """The error for a failed registration, after putting the previous version back."""
    message, line = failure
    text = f"{where(label, line, first_line)}: {_relabel_sites(message)}"
    _SITE_LABELS.pop(str(source_file), None)
    if previous is not None:
        _SITE_LABELS[str(previous.source_file)] = (previous.label, previous.first_line)
        restored = previous._native.init(str(previous.source_file))
        if restored is None:
            text += f"\nThe previous version ({previous.label}) is registered again."
        else:
            previous.closed = True
            text += f"\nThe previous version could not be registered again: {restored[0]}"
    return RegistrationError(text, line=line)


def _names_in(namespaces: Iterable[str]) -> list[str]:
    """Every operator name (with overload) the dispatcher knows in ``namespaces``."""
    prefixes = tuple(f"{ns}::" for ns in namespaces)
    return [n for n in _torch.all_op_names() if n.startswith(prefixes)] if prefixes else []


# ---------------------------------------------------------------- registration sites

_SITE_LABELS: dict[str, tuple[str, int]] = {}  # source file -> (label, first line)
_SITE_IN_TEXT = re.compile(r"(?P<file>/[^\s:]+):(?P<line>\d+)")


def _label_site(filename: str, line: int) -> str | None:
    """``cell [3], line 6`` for registration sites in a loaded library's source."""
    labelled = _SITE_LABELS.get(filename)
    if labelled is None:
        return None
    return where(labelled[0], line, labelled[1])


def _relabel_sites(text: str) -> str:
    """torch's messages with ``registered at FILE:LINE`` sites of known sources labelled."""
    return _SITE_IN_TEXT.sub(
        lambda m: _label_site(m["file"], int(m["line"])) or m[0],
        text,
    )


add_labeler(_label_site)
