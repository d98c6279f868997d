"""``compile_library``: C++ source with ``TORCH_LIBRARY`` blocks in, registered operators out.

Steps: check the options (:mod:`.options`); pick the cached build of the source or build it
under the key's lock (:mod:`.pipeline`); try a new build in a child process first, so that
C++ which crashes or registers outside its blocks cannot end this one (:mod:`.probe`); map a
private copy of it (:mod:`.loader`); then register its blocks, replacing the library it
supersedes, and compare the dispatcher before and after to say what it added
(:mod:`.registration`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..cachedir import ProgressCallback, stderr_progress
from ..display import Displayable
from ..errors import BuildOptionError
from .blocks import Block
from .diagnostics import where
from .loader import NativeLibrary
from .options import DEFAULT_OPT_LEVEL, BuildOptions
from .pipeline import BuildInfo, BuildVariant, published_build
from .probe import mark_loaded, probe
from .registration import Registration, SourceSite, register
from .snapshots import NewKernel, NewOperator

if TYPE_CHECKING:
    from ..dispatch.table import DispatchTable, OverloadTables


@dataclass(eq=False)
class LoadedLibrary(Displayable):
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
    _registration: Registration = field(repr=False)
    notes: tuple[str, ...] = ()  # what loading it replaced or found, for its display
    _tables: tuple[DispatchTable | OverloadTables, ...] = field(default=(), repr=False)
    options: BuildOptions | None = field(default=None, repr=False)  # what it was built with

    @property
    def closed(self) -> bool:
        """Whether the library's registrations are gone (closed, or replaced by a newer one)."""
        return not self._registration.active

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

    def tables(self) -> list[DispatchTable | OverloadTables]:
        """The dispatch table of each operator the library defined, as it was when the library
        was loaded (what its display shows, whatever registrations came since); none once
        the library is closed. ``opmagic.dispatch_table(name)`` reads one as it is now."""
        return list(self._tables) if not self.closed else []

    def close(self) -> None:
        """Remove every operator and kernel the library registered (idempotent).

        The code stays mapped (tensors or autograd graphs may still point into it); only
        the registrations go, and ``torch.ops`` forgets the operators it defined.
        """
        self._registration.close()


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
    options = BuildOptions.create(
        source,
        cuda=False,
        name=name,
        extra_cflags=extra_cflags,
        extra_ldflags=extra_ldflags,
        include_dirs=include_dirs,
        opt_level=opt_level,
        precompiled_headers=precompiled_headers,
        force=force,
        verbose=verbose,
        label=label,
        first_line=first_line,
    )
    return load_library(options, replace=replace, progress=progress)


def load_library(
    options: BuildOptions,
    *,
    replace: LoadedLibrary | None,
    progress: ProgressCallback | None,
    variant: BuildVariant | None = None,
) -> LoadedLibrary:
    """Build ``options`` (or take the cached build), load it and register its blocks in place
    of ``replace``: the pipeline of :func:`compile_library`; with ``variant``, of the CUDA
    full path (:func:`~opmagic.native.compile_cuda_library`)."""
    if replace is not None and not isinstance(replace, LoadedLibrary):
        raise BuildOptionError(
            f"replace must be the LoadedLibrary this one supersedes, or None; got {replace!r:.60}."
        )
    if progress is not None and not callable(progress):
        raise BuildOptionError(f"progress must be a callable or None, got {progress!r:.60}.")
    request, built = published_build(options, variant, progress)
    started = time.perf_counter()
    path = built.directory / f"lib{options.name}.so"
    site = SourceSite(built.directory / built.source_name, options.label, options.first_line)
    previous = (
        replace._registration if replace is not None and replace._registration.active else None
    )
    notes = probe(path, site, previous, options.source)
    mark_loaded(built.directory)
    native = NativeLibrary(path, built.library_sha256 or None)
    registration = register(native, site, previous)
    try:
        tables = _tables_of(registration.operators)
    except BaseException:  # Ctrl-C, say: nobody would hold the registration to undo it
        registration.close()
        raise
    return LoadedLibrary(
        name=options.name,
        key=request.key,
        path=path,
        source_file=site.file,
        source=options.source,
        label=options.label,
        first_line=options.first_line,
        blocks=native.blocks,
        operators=registration.operators,
        kernels=registration.kernels,
        build=built,
        load_seconds=time.perf_counter() - started,
        _registration=registration,
        notes=notes,
        _tables=tables,
        options=options,
    )


def _tables_of(operators: tuple[NewOperator, ...]) -> tuple[DispatchTable | OverloadTables, ...]:
    """The dispatch table of each operator a library defined, read as it loads."""
    from ..dispatch.table import dispatch_table

    return tuple(dispatch_table(op.name) for op in operators)
