"""What a build read, recorded so that a cached build is used only while all of it is the same.

- Every file the compiler and the linker read (their dependency files: headers found by any
  path, ``-include`` files, objects and static libraries the linker took, linker scripts) and
  every response file of the flags (``@file``), by content: size, stat and SHA-256, hashed
  right after the build. A file whose stat shows a change since the build started (a header
  saved while the compiler ran) is recorded as unknown, so the next build is a new one. A
  later same-size edit with the modification time put back (``cp -p``, ``rsync -a``) still
  changes the file's ctime, so its content is hashed again and compared.
- The include search: for each ``#include`` and ``__has_include`` of the source and of the
  user's own headers (not those of installed software: torch, Python, the compiler, under
  ``/usr`` or the Python prefix), every path searched before the file that was found (or
  every path, for a miss), which must still not exist: a header added to an earlier ``-I``
  directory shadows the one the build read, and a file created for ``__has_include``
  changes what the source compiles to.

Shared libraries the linker read are not recorded: they are loaded at run time, not copied
into the build. Files of opmagic's own cache (the prefix header, its precompiled form) are
checked by the cache itself.

Hashing costs little once per process: a ``torch/extension.h`` cell reads ~5,400 headers
(~23 MB), hashed in ~0.1 s of CPU once per process and file identity (see
``benchmarks/build_inputs.py``); a cached build's check is a stat per file, and a hash only
for a file whose stat changed.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..cachedir import content_digest, stat_fingerprint
from .flag_rules import response_files

if TYPE_CHECKING:
    from .toolchain import Toolchain

STARTED_MARKER = ".build-started"  # in a build's scratch directory: its ctime is the start
LINK_DEPENDENCIES = "link.d"  # the linker's dependency file, in the scratch directory
_MAKE_WORD = re.compile(r"(?:\\[ #]|[^\s])+")  # a word of a make rule: "\ " is a space in it
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\n]+)[>"]', re.M)
_HAS_INCLUDE = re.compile(r'__has_include\s*\(\s*([<"])([^>"\n]+)[>"]\s*\)')
_INSTALLED = tuple(
    os.path.join(os.path.realpath(p), "") for p in {"/usr", sys.prefix, sys.base_prefix}
)
_ELF_SHARED = 3  # e_type of a shared object


def mark_started(scratch: Path) -> None:
    """Note, in the scratch directory, the time a build starts (by the file system's clock,
    the one every file's ctime is stamped with)."""
    (scratch / STARTED_MARKER).touch()


def started_ns(scratch: Path) -> int:
    """When the build in ``scratch`` started (:func:`mark_started`; now when it did not)."""
    try:
        return os.stat(scratch / STARTED_MARKER).st_ctime_ns
    except FileNotFoundError:
        return 0  # every input then counts as changed during the build: nothing is trusted


def record_files(paths: Iterable[str], started: int) -> list[dict[str, Any]]:
    """What :func:`changed_input` checks each file against: size, stat identity and SHA-256;
    the SHA-256 is None (the next build is a new one) for a file changed since ``started``
    or while it was hashed, or gone."""
    records = []
    for path in sorted(set(paths)):
        try:
            before = os.stat(path)
            sha256 = content_digest(path, before)
            after = os.stat(path)
        except OSError:
            records.append({"path": path, "size": -1, "stat": [0, 0, 0, 0], "sha256": None})
            continue
        changed = (after.st_size, *stat_fingerprint(after)) != (
            before.st_size,
            *stat_fingerprint(before),
        ) or max(after.st_ctime_ns, after.st_mtime_ns) >= started
        records.append(
            {
                "path": path,
                "size": after.st_size,
                "stat": stat_fingerprint(after),
                "sha256": None if changed else sha256,
            }
        )
    return records


def changed_input(record: dict[str, Any]) -> bool:
    """Whether the file a :func:`record_files` entry describes is not what the build read."""
    try:
        info = os.stat(record["path"])
    except OSError:
        return True
    if record["sha256"] is None or info.st_size != record["size"]:
        return True
    if stat_fingerprint(info) == record["stat"]:
        return False
    try:
        return content_digest(record["path"], info) != record["sha256"]
    except OSError:
        return True


def valid_file_record(record: Any) -> bool:
    """Whether ``record`` has the shape of a :func:`record_files` entry."""
    return (
        isinstance(record, dict)
        and isinstance(record.get("path"), str)
        and type(record.get("size")) is int
        and isinstance(record.get("stat"), list)
        and len(record["stat"]) == 4
        and all(type(part) is int for part in record["stat"])
        and (record.get("sha256") is None or isinstance(record.get("sha256"), str))
    )


def build_inputs(
    scratch: Path,
    deps_files: Sequence[str],
    flags: Sequence[str],
    cache_home: Path,
) -> list[str]:
    """Every file outside ``scratch`` and the cache that the build's dependency files name
    (the compiler's and the linker's: shared objects left out), and the response files of
    ``flags``."""
    paths: set[str] = set(response_files(flags))
    own = (os.path.join(scratch, ""), os.path.join(cache_home, ""))
    for deps in [*deps_files, LINK_DEPENDENCIES]:
        for name in dependency_names(scratch / deps):
            path = os.path.normpath(os.path.join(scratch, name))  # relative: to the build
            if path.startswith(own) or (deps == LINK_DEPENDENCIES and _shared_object(path)):
                continue
            paths.add(path)
    return sorted(paths)


def dependency_names(deps_file: Path) -> list[str]:
    """The prerequisites a compiler's make-style dependency file lists (targets left out)."""
    if not deps_file.is_file():
        return []
    text = deps_file.read_text(errors="surrogateescape").replace("\\\n", " ")
    names: list[str] = []
    for line in text.splitlines():
        words = [
            re.sub(r"\\([ #])", r"\1", word).replace("$$", "$")
            for word in _MAKE_WORD.findall(line)
        ]
        if ":" in words:  # nvcc writes "target : prerequisites"
            names += words[words.index(":") + 1 :]
        elif words and words[0].endswith(":"):
            names += words[1:]
        else:
            names += [word for word in words if not word.endswith(":")]
    return names


def linker_dependency_flags(toolchain: Toolchain) -> list[str]:
    """The flag that makes the linker write its dependency file (:data:`LINK_DEPENDENCIES`):
    GNU ld 2.35 and later, gold, lld and mold do; with an older linker, none (its inputs are
    then not recorded)."""
    if not _writes_dependencies(toolchain.compiler, toolchain.linker):
        return []
    return [f"-Wl,--dependency-file={LINK_DEPENDENCIES}"]


@functools.lru_cache(maxsize=8)
def _writes_dependencies(compiler: tuple[str, ...], linker: str | None) -> bool:
    """Whether the linker ``compiler`` runs (``-fuse-ld=linker``) has ``--dependency-file``."""
    chosen = [f"-fuse-ld={linker}"] if linker else []
    try:
        result = subprocess.run(
            [*compiler, *chosen, "-Wl,--help"],
            capture_output=True,
            text=True,
            env={**os.environ, "LC_ALL": "C"},
            check=False,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return "--dependency-file" in result.stdout


def _shared_object(path: str) -> bool:
    """Whether ``path`` is an ELF shared object (loaded at run time, not linked in)."""
    try:
        with open(path, "rb") as file:
            header = file.read(18)
    except OSError:
        return False
    return header[:4] == b"\x7fELF" and int.from_bytes(header[16:18], "little") == _ELF_SHARED


@dataclass(frozen=True)
class IncludeSearch:
    """Where the compiler looks for ``#include "..."`` (``quote``, then ``angle``) and for
    ``#include <...>`` (``angle``), in order."""

    quote: tuple[str, ...]
    angle: tuple[str, ...]


@functools.lru_cache(maxsize=64)
def include_search(compiler: tuple[str, ...], flags: tuple[str, ...], env: tuple) -> IncludeSearch:
    """The include search of ``compiler`` with ``flags`` in ``env`` (items, for the
    variables that steer it: ``CPATH``...), as ``-E -v`` prints it (once per process)."""
    result = subprocess.run(
        [*compiler, *flags, "-E", "-v", "-x", "c++", os.devnull],
        capture_output=True,
        text=True,
        env=dict(env),
        check=False,
        timeout=120,
    )
    quote: list[str] = []
    angle: list[str] = []
    current: list[str] | None = None
    for line in result.stderr.splitlines():
        if line.startswith('#include "..." search starts here'):
            current = quote
        elif line.startswith("#include <...> search starts here"):
            current = angle
        elif line.startswith("End of search list"):
            break
        elif current is not None and line.startswith(" "):
            current.append(os.path.normpath(line.strip().removesuffix(" (framework directory)")))
    return IncludeSearch(tuple(quote), tuple(angle))


def include_misses(source: str, inputs: Sequence[str], search: IncludeSearch) -> list[str]:
    """Paths that must still not exist for the build to stand: for each ``#include`` and
    ``__has_include`` of ``source`` and of the user's own files among ``inputs``, the paths
    searched before the file found (all of them when none was)."""
    texts: list[tuple[str, str | None]] = [(source, None)]  # (text, its directory)
    for path in inputs:
        if not path.startswith(_INSTALLED) and not os.path.realpath(path).startswith(_INSTALLED):
            try:
                texts.append((Path(path).read_text(errors="replace"), os.path.dirname(path)))
            except OSError:
                continue
    misses: set[str] = set()
    for text, directory in texts:
        for pattern in (_INCLUDE, _HAS_INCLUDE):
            for delimiter, name in pattern.findall(text):
                misses.update(_searched_before(name, delimiter == '"', directory, search))
    return sorted(misses)


def _searched_before(
    name: str, quoted: bool, directory: str | None, search: IncludeSearch
) -> list[str]:
    """The candidates of ``#include`` ``name`` the compiler looks at before the one it finds
    (every candidate when it finds none)."""
    if os.path.isabs(name):
        return [] if os.path.exists(name) else [name]
    directories = [*([directory] if quoted and directory else []), *search.quote] if quoted else []
    missing = []
    for candidate_directory in [*directories, *search.angle]:
        candidate = os.path.normpath(os.path.join(candidate_directory, name))
        if os.path.isfile(candidate):
            break
        missing.append(candidate)
    return missing
