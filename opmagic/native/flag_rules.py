"""Flags a build cannot take: those that make the compiler, the linker, the assembler or nvcc
write a file opmagic did not name (anywhere: ``/x``, the working directory, beside the
object), or that stop them before the library is written. Refused before anything runs.

Derived from the manuals of GCC (Invoking GCC: Overall, Preprocessor, Assembler, Link,
Developer and Instrumentation options), Clang (the driver's options reference), GNU ld, gold,
lld and mold, GNU as and nvcc. Every spelling is taken apart the way the tool reads it:
``-ofoo`` and ``--output=foo``; flags handed on to another tool (``-Wl,``, ``-Wp,``,
``-Wa,``, ``-Xlinker``, ``-Xpreprocessor``, ``-Xassembler``, ``-Xclang``, nvcc's
``-Xcompiler``, ``-Xlinker``, ``-Xptxas``, ``-Xnvlink``); response files (``@file``,
nvcc's ``--options-file``), read as the tools read them (recursively).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable, Iterator

from ..errors import BuildOptionError

_NAMES_OUTPUT = "names its output file (opmagic names every file a build writes)"
_DEPENDENCIES = "writes a dependency file (opmagic writes and reads its own)"
_PRINTS = "prints instead of building"
_STOPS = "stops before the library is built"
_SIDE_FILE = "writes a file of its own beside the output or where it names"
_PROFILE = "writes profile or coverage data files (at compile time or when the library runs)"
_MAX_RESPONSE_DEPTH = 10

# the compiler driver (and cc1, through -Xclang / -Wp,): exact options, then prefixes
_DRIVER_EXACT = {
    "-o": _NAMES_OUTPUT,
    "--output": _NAMES_OUTPUT,
    "-E": "only preprocesses (" + _STOPS + ")",
    "-S": "stops at assembly",
    "-fsyntax-only": "only checks the syntax and writes no object file",
    "-c": "compiles without linking (opmagic compiles and links in separate steps)",
    "--help": _PRINTS,
    "--target-help": _PRINTS,
    "--version": _PRINTS,
    "-###": "prints the commands instead of running them",
    "-dumpversion": _PRINTS,
    "-dumpfullversion": _PRINTS,
    "-dumpmachine": _PRINTS,
    "-dumpspecs": _PRINTS,
    "-dumpdir": "chooses where auxiliary and dump files are written",
    "-dumpbase": "chooses the names of auxiliary and dump files",
    "-dumpbase-ext": "chooses the names of auxiliary and dump files",
    "-aux-info": "writes the source's declarations to a file",
    "--serialize-diagnostics": "writes the diagnostics to a file",
    "-serialize-diagnostic-file": "writes the diagnostics to a file",
    "-dependency-file": _DEPENDENCIES,
    "-dependency-dot": _DEPENDENCIES,
    "-header-include-file": "writes the included headers to a file",
    "-gen-reproducer": "writes a reproducer script",
    "-gsplit-dwarf": "writes the debug information to a .dwo file beside the object",
    "--coverage": _PROFILE,
    "-fprofile-arcs": _PROFILE,
    "-ftest-coverage": _PROFILE,
}
_DRIVER_PREFIXES = (
    ("--output=", _NAMES_OUTPUT),
    ("-o", _NAMES_OUTPUT),  # -ofoo is -o foo (and clang's -objcmt-* write migrated files)
    ("-M", _DEPENDENCIES),  # -M, -MM, -MD, -MMD, -MF, -MFfile, -MT, -MQ, -MP, -MG
    ("--write-dependencies", _DEPENDENCIES),
    ("--write-user-dependencies", _DEPENDENCIES),
    ("--print-", _PRINTS),
    ("-print-", _PRINTS),
    ("-save-temps", "keeps the intermediate files (.ii, .s, .o) where it chooses"),
    ("--save-temps", "keeps the intermediate files (.ii, .s, .o) where it chooses"),
    ("-fdump-", "writes compiler dump files"),
    ("-fcallgraph-info", _SIDE_FILE),
    ("-fstack-usage", _SIDE_FILE),
    ("-fsave-optimization-record", "writes an optimisation record file"),
    ("-foptimization-record-file", "writes an optimisation record file"),
    ("-ftime-trace", "writes a time trace file"),
    ("-fproc-stat-report", "writes a process statistics file"),
    ("-fcrash-diagnostics", "writes crash reports where it chooses"),
    ("-fmodules-cache-path", "writes compiled modules where it names"),
    ("-fmodule-output", "writes a compiled module where it names"),
    ("-fmodule-mapper", "writes compiled modules where its mapper says"),
    (
        "-fdiagnostics-format",
        "changes the form of the messages opmagic reads (or writes them to a file)",
    ),
    ("-fdiagnostics-add-output", "writes the diagnostics to a file"),
    ("-fdiagnostics-set-output", "writes the diagnostics to a file"),
    ("-fprofile-generate", _PROFILE),
    ("-fprofile-dir", _PROFILE),
    ("-fprofile-instr-generate", _PROFILE),
    ("-fcs-profile-generate", _PROFILE),
    ("-fprofile-note", _PROFILE),
)
# linker options by name (dashes and any "=value" taken off; -o is also -oFILE)
_LINKER_NAMES = {
    "o": _NAMES_OUTPUT,
    "output": _NAMES_OUTPUT,
    "map": "writes a link map file",
    "dependency-file": _DEPENDENCIES,
    "out-implib": "writes an import library",
    "output-def": "writes a .def file",
    "reproduce": "writes a reproduction archive",
    "why-extract": "writes an extraction report file",
    "thinlto-cache-dir": "writes a ThinLTO cache where it names",
    "lto-obj-path": "writes the LTO object where it names",
    "separate-debug-file": "writes the debug information to a file of its own",
    "print-archive-stats": "writes archive statistics to a file",
    "print-symbol-order": "writes the symbol order to a file",
    "print-symbol-counts": "writes symbol counts to a file",
    "time-trace-file": "writes a time trace file",
    "save-temps": "keeps the intermediate files where it chooses",
    "lto-emit-asm": "writes assembly in place of the library",
    "help": _PRINTS,
    "version": _PRINTS,
}
# --plugin-opt=VALUE values that write files (lld, gold and GNU ld pass them to the LTO plugin)
_PLUGIN_OPT_WRITES = ("obj-path", "save-temps", "-save-temps", "dwo_dir", "emit-asm", "emit-llvm")
# nvcc's own options by name (dashes and "=value" taken off)
_NVCC_NAMES = {
    "o": _NAMES_OUTPUT,
    "output-file": _NAMES_OUTPUT,
    "odir": "chooses the directory of its output",
    "output-directory": "chooses the directory of its output",
    "keep": "keeps the intermediate files where it chooses",
    "keep-dir": "keeps the intermediate files where it names",
    "save-temps": "keeps the intermediate files where it chooses",
    "MF": _DEPENDENCIES,
    "dependency-output": _DEPENDENCIES,
    "M": _DEPENDENCIES,
    "MM": _DEPENDENCIES,
    "MD": _DEPENDENCIES,
    "MMD": _DEPENDENCIES,
    "MT": _DEPENDENCIES,
    "generate-dependencies": _DEPENDENCIES,
    "generate-nonsystem-dependencies": _DEPENDENCIES,
    "generate-dependencies-with-compile": _DEPENDENCIES,
    "generate-nonsystem-dependencies-with-compile": _DEPENDENCIES,
    "dependency-target-name": _DEPENDENCIES,
    "E": "only preprocesses (" + _STOPS + ")",
    "preprocess": "only preprocesses (" + _STOPS + ")",
    "ptx": _STOPS,
    "cubin": _STOPS,
    "fatbin": _STOPS,
    "optix-ir": _STOPS,
    "cuda": _STOPS,
    "lib": _STOPS,
    "run": "runs the program it builds",
    "dryrun": "prints the commands instead of running them",
    "time": "writes a timing file",
    "fdevice-time-trace": "writes a time trace file",
    "list-gpu-code": _PRINTS,
    "list-gpu-arch": _PRINTS,
    "V": _PRINTS,
    "version": _PRINTS,
    "h": _PRINTS,
    "help": _PRINTS,
}


def refuse_writing_flags(flags: tuple[str, ...], what: str, *, nvcc: bool = False) -> None:
    """Raise :class:`BuildOptionError` for the first flag of ``flags`` (``what``: the option
    that holds them, e.g. ``"extra_ldflags"``) that writes a file opmagic did not name or
    stops the build; ``nvcc``: they are nvcc's own flags (else the compiler driver's)."""
    check = _nvcc_words if nvcc else _driver_words
    for flag, path, reason in check(list(flags), ()):
        via = f" (through {' → '.join(path)})" if path else ""
        raise BuildOptionError(
            f"{what} has {flag}{via}, which a build cannot take: it {reason}. Leave it out: "
            "opmagic compiles, links and loads the library itself, and nothing of a build is "
            "written outside its cache."
        )


# A finding: (the flag, how it was reached: response files and hand-on options, the reason)
_Finding = tuple[str, tuple[str, ...], str]
_Checker = Callable[[list[str], tuple[str, ...]], Iterator[_Finding]]


def _driver_words(words: list[str], path: tuple[str, ...]) -> Iterator[_Finding]:
    """Findings among compiler driver (or cc1) words."""
    index = 0
    while index < len(words):
        word = words[index]
        following = words[index + 1] if index + 1 < len(words) else None
        index += 1
        if word.startswith("@"):
            yield from _response_file(word, path, _driver_words)
        elif word.startswith("-Wl,"):
            yield from _linker_words(word[4:].split(","), (*path, word))
        elif word.startswith(("-Wp,", "-Wa,")):
            checker = _driver_words if word.startswith("-Wp,") else _assembler_words
            yield from checker(word[4:].split(","), (*path, word))
        elif word in ("-Xlinker", "-Xpreprocessor", "-Xassembler", "-Xclang"):
            if following is not None:
                index += 1
                checker = {
                    "-Xlinker": _linker_words,
                    "-Xassembler": _assembler_words,
                }.get(word, _driver_words)
                yield from checker([following], (*path, word))
        else:
            reason = _DRIVER_EXACT.get(word) or next(
                (r for prefix, r in _DRIVER_PREFIXES if word.startswith(prefix)), None
            )
            if reason is not None:
                yield word, path, reason


def _linker_words(words: list[str], path: tuple[str, ...]) -> Iterator[_Finding]:
    """Findings among linker words (ld, gold, lld, mold spell long options with one dash or
    two; ``-oFILE`` is ``-o FILE``)."""
    for word in words:
        if word.startswith("@"):
            yield from _response_file(word, path, _linker_words)
            continue
        if not word.startswith("-"):
            continue
        name, _, value = word.lstrip("-").partition("=")
        if word.startswith("-o") and not word.startswith("--"):
            name = "o"
        reason = _LINKER_NAMES.get(name.lower() if name.lower() == "map" else name)
        if name == "plugin-opt" and value.startswith(_PLUGIN_OPT_WRITES):
            reason = "makes the LTO plugin write files where it names"
        if reason is not None:
            yield word, path, reason


def _assembler_words(words: list[str], path: tuple[str, ...]) -> Iterator[_Finding]:
    """Findings among assembler words: ``-o``, a listing to a file (``-a...=FILE``), ``--MD``."""
    for word in words:
        if word.startswith("@"):
            yield from _response_file(word, path, _assembler_words)
        elif word.startswith("-o") or word == "--MD":
            yield word, path, _NAMES_OUTPUT if word.startswith("-o") else _DEPENDENCIES
        elif word.startswith("-a") and "=" in word:
            yield word, path, "writes an assembler listing to a file"


def _nvcc_words(words: list[str], path: tuple[str, ...]) -> Iterator[_Finding]:
    """Findings among nvcc words, and the words it hands on to the host compiler, the linker,
    ptxas and nvlink."""
    hand_on: dict[str, _Checker] = {
        "Xcompiler": _driver_words,
        "compiler-options": _driver_words,
        "Xlinker": _linker_words,
        "linker-options": _linker_words,
        "Xptxas": _tool_output_words,
        "ptxas-options": _tool_output_words,
        "Xnvlink": _tool_output_words,
        "nvlink-options": _tool_output_words,
    }
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        if not word.startswith("-"):
            continue
        name, equals, value = word.lstrip("-").partition("=")
        takes_next = not equals and index < len(words)
        if name in hand_on or name in ("optf", "options-file"):
            if not equals and not takes_next:
                continue
            if not equals:
                value, index = words[index], index + 1
            if name in hand_on:
                yield from hand_on[name](value.split(","), (*path, word))
            else:
                yield from _response_file("@" + value, (*path, word), _nvcc_words)
        elif name in _NVCC_NAMES:
            yield word, path, _NVCC_NAMES[name]


def _tool_output_words(words: list[str], path: tuple[str, ...]) -> Iterator[_Finding]:
    """Findings among ptxas or nvlink words: their output file."""
    for word in words:
        name = word.lstrip("-").partition("=")[0]
        if name in ("o", "output-file") or (word.startswith("-o") and not word.startswith("--")):
            yield word, path, _NAMES_OUTPUT


def _response_file(word: str, path: tuple[str, ...], checker: _Checker) -> Iterator[_Finding]:
    """Findings in the response file ``@FILE`` (nested ``@file`` read in turn)."""
    if sum(step.startswith("@") for step in path) >= _MAX_RESPONSE_DEPTH:
        return  # a file that names itself: the tool gives up too
    words = _read_response(word[1:])
    if words is not None:
        yield from checker(words, (*path, word))


def _read_response(path: str) -> list[str] | None:
    """The words of a response file, split as GCC's libiberty splits them (whitespace,
    quotes, backslashes); None when it cannot be read (the tool takes ``@FILE`` literally)."""
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as file:
            return shlex.split(file.read())
    except (OSError, ValueError):
        return None


def response_files(flags: Iterable[str]) -> list[str]:
    """The response files ``flags`` name (``@FILE``, ``-Wl,@FILE``, and those they name in
    turn): files a build reads besides its sources, as given (absolute in a build)."""
    found: list[str] = []
    pending = [(flag, 0) for flag in flags]
    while pending:
        flag, depth = pending.pop()
        name = flag[1:] if flag.startswith("@") else flag[5:] if flag.startswith("-Wl,@") else ""
        if not name or name in found or depth >= _MAX_RESPONSE_DEPTH:
            continue
        words = _read_response(name)
        if words is not None:
            found.append(name)
            pending += [(word, depth + 1) for word in words]
    return found
