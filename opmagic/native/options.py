"""What to build and how: the arguments of ``compile_library`` (and of the CUDA full path),
checked and normalised once, before anything is built.

:class:`BuildOptions` is the one place the options are spelled out below the public
functions: they keep their keyword signatures for users, make a :class:`BuildOptions`, and
pass it down the pipeline.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..dispatch.ops import is_identifier
from ..errors import BuildOptionError, is_list_of_values
from .blocks import scan_blocks
from .flag_rules import refuse_writing_flags

OPT_LEVELS = ("0", "1", "2", "3", "s", "g")
DEFAULT_OPT_LEVEL = "1"  # builds ~25% faster than -O2; ask for 2 or 3 to time kernels
DEFAULT_NAME = "opmagic_library"
MAX_NAME_LENGTH = 100  # the name is part of file names (lib<name>.so, <name>.cpp, memfd names)
# flags whose next argument is a path (made absolute: compiles run in a scratch directory)
PATH_FLAGS = ("-I", "-L", "-include", "-imacros", "-isystem", "-iquote", "-idirafter")
# flags with the path joined to them: -I., -L../lib, response files @flags.txt, -Wl,@link.txt
JOINED_PATH_FLAGS = ("-I", "-L", "@", "-Wl,@")


@dataclass(frozen=True)
class BuildOptions:
    """A source and the options it is built with, checked (see :meth:`create`)."""

    source: str  # trailing blank lines dropped: they do not make another build
    name: str  # the library is lib<name>.so
    label: str  # how messages name the source: "cell [3]", "myops.cpp"
    first_line: int  # the number the source's first line has where the user sees it
    cflags: tuple[str, ...]  # the user's compiler flags but -D/-U
    defines: tuple[str, ...]  # the user's -D/-U flags ("-D X" as "-DX")
    ldflags: tuple[str, ...]
    include_dirs: tuple[str, ...]  # absolute paths of existing directories
    opt_level: str  # one of OPT_LEVELS
    precompiled_headers: bool
    force: bool  # rebuild even if the cache has a build
    verbose: bool  # print the commands and the compiler's output

    @classmethod
    def create(
        cls,
        source: str,
        *,
        cuda: bool,
        name: str | None,
        extra_cflags: Sequence[str] | str,
        extra_ldflags: Sequence[str] | str,
        include_dirs: Sequence[str | os.PathLike],
        opt_level: int | str,
        precompiled_headers: bool,
        force: bool,
        verbose: bool,
        label: str | None,
        first_line: int,
    ) -> BuildOptions:
        """The options of ``compile_library`` (``cuda``: of ``compile_cuda_library``), checked.

        Raises :class:`~opmagic.errors.BuildOptionError` for the first bad one.
        """
        language = "CUDA C++" if cuda else "C++"
        check_source_text(source, f"{language} source text")
        if not source.strip():
            raise BuildOptionError(
                f"The source is empty: write {language} with TORCH_LIBRARY / "
                "TORCH_LIBRARY_IMPL blocks."
            )
        source = source.rstrip() + "\n"
        name = _library_name(name, source)
        cflags, defines = _split_defines(_absolute_paths(split_flags(extra_cflags, "extra_cflags")))
        ldflags = _absolute_paths(split_flags(extra_ldflags, "extra_ldflags"))
        refuse_writing_flags(cflags, "extra_cflags")
        refuse_writing_flags(ldflags, "extra_ldflags")
        includes = tuple(str(Path(d).expanduser().absolute()) for d in include_paths(include_dirs))
        missing = [d for d in includes if not os.path.isdir(d)]
        if missing:
            raise BuildOptionError(f"Include directory not found: {', '.join(missing)}.")
        opt = normalise_opt_level(opt_level)
        check_source_position(label, first_line)
        for what, value in (
            ("precompiled_headers", precompiled_headers),
            ("force", force),
            ("verbose", verbose),
        ):
            if not isinstance(value, bool):
                raise BuildOptionError(f"{what} must be True or False, got {value!r}.")
        return cls(
            source=source,
            name=name,
            label=label or f"{name}.{'cu' if cuda else 'cpp'}",
            first_line=first_line,
            cflags=cflags,
            defines=defines,
            ldflags=ldflags,
            include_dirs=includes,
            opt_level=opt,
            precompiled_headers=precompiled_headers,
            force=force,
            verbose=verbose,
        )


def _library_name(name: str | None, source: str) -> str:
    """``name`` checked, or the first namespace of the source's blocks."""
    if name is None:
        first = next((b.namespace for b in scan_blocks(source) if is_identifier(b.namespace)), "_")
        return first if first != "_" and len(first) <= MAX_NAME_LENGTH else DEFAULT_NAME
    if not is_identifier(name):
        raise BuildOptionError(
            f"The library name must be a C identifier (letters, digits, _), got {name!r}."
        )
    if len(name) > MAX_NAME_LENGTH:
        raise BuildOptionError(
            f"The library name is {len(name)} characters long; it names files (lib<NAME>.so), "
            f"so use at most {MAX_NAME_LENGTH}."
        )
    return name


def check_source_text(source: object, what: str) -> None:
    """``source`` is text the compiler can read: a str that encodes as UTF-8 (a notebook's
    JSON can hold a lone surrogate, ``\udcff``, which no file can)."""
    if not isinstance(source, str):
        raise BuildOptionError(f"The source must be {what} (a str), got {type(source).__name__}.")
    try:
        source.encode("utf-8")
    except UnicodeEncodeError as error:
        line = source.count("\n", 0, error.start) + 1
        raise BuildOptionError(
            f"The source is not UTF-8 text: line {line} holds {source[error.start]!r}, a lone "
            "surrogate that no file can hold (text decoded with errors='surrogateescape'?). "
            "Remove it, or decode the text with its real encoding."
        ) from None


def check_source_position(label: object, first_line: object) -> None:
    """``label``/``first_line`` (how messages name the source) of the right types."""
    if type(first_line) is not int or first_line < 1:
        raise BuildOptionError(f"first_line must be a positive line number, got {first_line!r}.")
    if label is not None and not isinstance(label, str):
        raise BuildOptionError(f"label must be a string or None, got {label!r}.")


def split_flags(flags: Sequence[str] | str, what: str) -> tuple[str, ...]:
    """Flags as a tuple; one string is split as a shell would (quotes group, and go)."""
    if isinstance(flags, str):
        try:
            return tuple(shlex.split(flags))
        except ValueError as error:
            raise BuildOptionError(
                f"{what} cannot be split into flags ({error}): {flags!r}. Close the quote, or "
                "pass a list of flags."
            ) from None
    if not is_list_of_values(flags):
        raise BuildOptionError(
            f"{what} must be a string of flags or a list of strings, got {flags!r}."
        )
    flags = tuple(flags)
    if not all(isinstance(f, str) for f in flags):
        raise BuildOptionError(f"{what} must be strings (compiler flags), got {flags!r}.")
    return flags


def include_paths(directories: Sequence[str | os.PathLike] | str | os.PathLike) -> list[str]:
    """Include directories as strings; one path on its own is a list of one."""
    if isinstance(directories, (str, os.PathLike)):
        directories = [directories]
    if not is_list_of_values(directories):
        raise BuildOptionError(f"include_dirs must be a list of directories, got {directories!r}.")
    paths = []
    for directory in directories:
        if not isinstance(directory, (str, os.PathLike)) or isinstance(directory, bytes):
            raise BuildOptionError(
                f"include_dirs must be directory paths (str or pathlib.Path), got {directory!r}."
            )
        paths.append(os.fspath(directory))
    return paths


def _absolute_paths(flags: tuple[str, ...]) -> tuple[str, ...]:
    """Path arguments of flags made absolute: the compiler runs in a scratch directory, so
    ``-I.``, ``-include config.h`` or a response file ``@flags.txt`` (``-Wl,@link.txt``)
    must mean the user's working directory, not that one."""
    absolute: list[str] = []
    pending = False
    for flag in flags:
        if pending:
            absolute.append(_absolute(flag))
            pending = False
        elif flag in PATH_FLAGS:
            absolute.append(flag)
            pending = True
        else:
            joined = next(
                (p for p in JOINED_PATH_FLAGS if flag.startswith(p) and len(flag) > len(p)), None
            )
            absolute.append(joined + _absolute(flag[len(joined) :]) if joined else flag)
    return tuple(absolute)


def _absolute(path: str) -> str:
    """``path`` from the working directory, unless already absolute (or empty)."""
    return os.path.abspath(os.path.expanduser(path)) if path else path


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


def normalise_opt_level(level: int | str) -> str:
    """``"2"`` for ``2``, ``"2"`` or ``"-O2"``; raises for levels GCC does not have."""
    text = str(level).removeprefix("-O")
    if text not in OPT_LEVELS:
        raise BuildOptionError(
            f"Unknown optimisation level {level!r}: use one of {', '.join(OPT_LEVELS)} "
            "(as in -O0 ... -O3, -Os, -Og)."
        )
    return text
