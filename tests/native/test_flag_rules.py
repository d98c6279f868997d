"""Flags that would write a file opmagic did not name (or stop the build) are refused before
anything runs, whichever way they are spelled: joined, with ``=``, handed on to the linker,
preprocessor or assembler, or read from a response file."""

from __future__ import annotations

import pytest

import opmagic.native.library
from opmagic import compile_cuda_library, compile_library
from opmagic.errors import BuildOptionError
from opmagic.native.flag_rules import refuse_writing_flags

from .sources import op_source

_CLEAN = "which a build cannot take: it {}. Leave it out"

# (flag words, the flag the message names): each spelling the compiler driver takes
DRIVER = [
    (["-o", "/tmp/x.so"], "-o"),
    (["-o/tmp/x.so"], "-o/tmp/x.so"),
    (["-ofoo"], "-ofoo"),
    (["--output=/tmp/x"], "--output=/tmp/x"),
    (["--output", "/tmp/x"], "--output"),
    (["-MF", "/tmp/x.d"], "-MF"),
    (["-MF/tmp/x.d"], "-MF/tmp/x.d"),
    (["-MD"], "-MD"),
    (["-MMD"], "-MMD"),
    (["-MJ", "/tmp/db.json"], "-MJ"),
    (["-Wp,-MD,/tmp/x.d"], "-MD"),
    (["-Wp,-MMD,/tmp/x.d"], "-MMD"),
    (["-Xpreprocessor", "-MF/tmp/x.d"], "-MF/tmp/x.d"),
    (["-save-temps"], "-save-temps"),
    (["-save-temps=cwd"], "-save-temps=cwd"),
    (["-save-temps=obj"], "-save-temps=obj"),
    (["--save-temps"], "--save-temps"),
    (["-fdump-tree-all"], "-fdump-tree-all"),
    (["-fdump-rtl-expand"], "-fdump-rtl-expand"),
    (["-fdump-ipa-all"], "-fdump-ipa-all"),
    (["-fdump-lang-class"], "-fdump-lang-class"),
    (["-fdump-final-insns=/tmp/x"], "-fdump-final-insns=/tmp/x"),
    (["-dumpdir", "/tmp/"], "-dumpdir"),
    (["-dumpbase", "x"], "-dumpbase"),
    (["-aux-info", "/tmp/x.h"], "-aux-info"),
    (["-fstack-usage"], "-fstack-usage"),
    (["-fcallgraph-info=su"], "-fcallgraph-info=su"),
    (["-fopt-info-all"], None),  # to stderr: allowed
    (["-fsave-optimization-record"], "-fsave-optimization-record"),
    (["-foptimization-record-file=/tmp/x"], "-foptimization-record-file=/tmp/x"),
    (["-ftime-trace=/tmp/t"], "-ftime-trace=/tmp/t"),
    (["-fprofile-generate=/tmp/prof"], "-fprofile-generate=/tmp/prof"),
    (["-fprofile-dir=/tmp"], "-fprofile-dir=/tmp"),
    (["--coverage"], "--coverage"),
    (["-fprofile-arcs"], "-fprofile-arcs"),
    (["-ftest-coverage"], "-ftest-coverage"),
    (["-fprofile-instr-generate=/tmp/x"], "-fprofile-instr-generate=/tmp/x"),
    (["-fcrash-diagnostics-dir=/tmp"], "-fcrash-diagnostics-dir=/tmp"),
    (["-fmodules-cache-path=/tmp/m"], "-fmodules-cache-path=/tmp/m"),
    (["-fdiagnostics-format=sarif-file"], "-fdiagnostics-format=sarif-file"),
    (["-gsplit-dwarf"], "-gsplit-dwarf"),
    (["--serialize-diagnostics", "/tmp/x"], "--serialize-diagnostics"),
    (["-Xclang", "-dependency-file"], "-dependency-file"),
    (["-E"], "-E"),
    (["-S"], "-S"),
    (["-c"], "-c"),
    (["-fsyntax-only"], "-fsyntax-only"),
    (["-###"], "-###"),
    (["--version"], "--version"),
    (["-print-search-dirs"], "-print-search-dirs"),
    (["-Wa,-adhln=/tmp/x.lst"], "-adhln=/tmp/x.lst"),
    (["-Wa,--MD,/tmp/x.d"], "--MD"),
    (["-Wa,-o,/tmp/x.o"], "-o"),
    (["-Xassembler", "-o/tmp/x.o"], "-o/tmp/x.o"),
]
# each spelling a linker takes (GNU ld, gold, lld, mold), handed on by the driver
LINKER = [
    (["-Wl,-o,/tmp/x"], "-o"),
    (["-Wl,-o/tmp/x"], "-o/tmp/x"),
    (["-Wl,--output=/tmp/x"], "--output=/tmp/x"),
    (["-Wl,-output=/tmp/x"], "-output=/tmp/x"),
    (["-Wl,--output,/tmp/x"], "--output"),
    (["-Xlinker", "-o", "-Xlinker", "/tmp/x"], "-o"),
    (["-Xlinker", "--output=/tmp/x"], "--output=/tmp/x"),
    (["-Wl,-Map=/tmp/x.map"], "-Map=/tmp/x.map"),
    (["-Wl,-Map,/tmp/x.map"], "-Map"),
    (["-Wl,--Map=/tmp/x.map"], "--Map=/tmp/x.map"),
    (["-Wl,--dependency-file=/tmp/x.d"], "--dependency-file=/tmp/x.d"),
    (["-Wl,--out-implib=/tmp/x.a"], "--out-implib=/tmp/x.a"),
    (["-Wl,--reproduce=/tmp/x.tar"], "--reproduce=/tmp/x.tar"),
    (["-Wl,--why-extract=/tmp/x"], "--why-extract=/tmp/x"),
    (["-Wl,--thinlto-cache-dir=/tmp/c"], "--thinlto-cache-dir=/tmp/c"),
    (["-Wl,--separate-debug-file=/tmp/x"], "--separate-debug-file=/tmp/x"),
    (["-Wl,--print-symbol-counts=/tmp/x"], "--print-symbol-counts=/tmp/x"),
    (["-Wl,--plugin-opt=obj-path=/tmp/x"], "--plugin-opt=obj-path=/tmp/x"),
    (["-Wl,-plugin-opt=save-temps"], "-plugin-opt=save-temps"),
    (["-Wl,--save-temps"], "--save-temps"),
    (["-Wl,--version"], "--version"),
]
ACCEPTED = [
    ["-O3", "-march=native", "-Wall", "-Wextra", "-fopenmp", "-g"],
    ["-Wl,-O1", "-Wl,--as-needed", "-Wl,-rpath,/opt/lib", "-Wl,-soname,libx.so"],
    ["-Wl,--oformat=elf64-x86-64", "-Wl,-z,defs", "-Xlinker", "--no-undefined"],
    ["-Wp,-DX=1", "-Wa,--noexecstack", "-fopt-info-vec", "-lm", "-L/opt/lib"],
]


def _reason(words: list[str], **keywords) -> str | None:
    """The message refusing ``words``, or None when they are taken."""
    try:
        refuse_writing_flags(tuple(words), "extra_ldflags", **keywords)
    except BuildOptionError as error:
        return str(error)
    return None


@pytest.mark.parametrize(("words", "flag"), DRIVER + LINKER, ids=lambda v: " ".join(v or "-"))
def test_each_spelling_is_refused_with_one_message(words, flag):
    message = _reason(words)
    if flag is None:
        assert message is None
        return
    assert message is not None and message.startswith(f"extra_ldflags has {flag}"), message
    assert "which a build cannot take: it " in message
    assert message.endswith("nothing of a build is written outside its cache.")


@pytest.mark.parametrize("words", ACCEPTED, ids=" ".join)
def test_flags_that_write_nothing_of_their_own_are_taken(words):
    assert _reason(words) is None


def test_a_response_file_is_read_as_the_tools_read_it(tmp_path):
    inner = tmp_path / "inner.rsp"
    inner.write_text("-Wl,--output=/tmp/x\n")
    outer = tmp_path / "outer.rsp"
    outer.write_text(f'-O2 "-DA=1 2" @{inner}\n')
    message = _reason([f"@{outer}"])
    assert message is not None
    assert message.startswith(f"extra_ldflags has --output=/tmp/x (through @{outer} → @{inner}")
    linker = tmp_path / "link.rsp"
    linker.write_text("-Map /tmp/x.map\n")
    assert "has -Map (through -Wl,@" in (_reason([f"-Wl,@{linker}"]) or "")
    looping = tmp_path / "loop.rsp"
    looping.write_text(f"@{looping}\n")
    assert _reason([f"@{looping}"]) is None  # ends, as GCC's own reading of it does
    assert _reason([f"@{tmp_path / 'missing.rsp'}"]) is None  # GCC takes it literally


@pytest.mark.parametrize(
    ("words", "flag"),
    [
        (["-o", "x"], "-o"),
        (["--output-file=x"], "--output-file=x"),
        (["-odir", "/tmp"], "-odir"),
        (["-keep"], "-keep"),
        (["--keep-dir", "/tmp"], "--keep-dir"),
        (["-MF", "x.d"], "-MF"),
        (["--generate-dependencies-with-compile"], "--generate-dependencies-with-compile"),
        (["-Xcompiler", "-save-temps"], "-save-temps"),
        (["-Xcompiler=-fPIC,-MD"], "-MD"),
        (["--compiler-options", "-Wall,-o,/tmp/x"], "-o"),
        (["-Xlinker", "-Map=/tmp/x"], "-Map=/tmp/x"),
        (["-Xptxas", "-o,/tmp/x"], "-o"),
        (["-Xnvlink", "--output-file=/tmp/x"], "--output-file=/tmp/x"),
        (["-ptx"], "-ptx"),
        (["--run"], "--run"),
        (["-time", "/tmp/t.csv"], "-time"),
    ],
    ids=lambda v: " ".join(v),
)
def test_nvcc_flags_are_checked_as_nvcc_reads_them(words, flag):
    message = _reason(words, nvcc=True)
    assert message is not None and message.startswith(f"extra_ldflags has {flag}"), message
    assert _reason(["-lineinfo", "--use_fast_math", "-Xcompiler", "-fPIC"], nvcc=True) is None


def _would_build(*args, **kwargs):
    raise AssertionError("a build started")


@pytest.mark.parametrize(
    "keywords",
    [
        {"extra_cflags": "-Wp,-MD,/tmp/opmagic-deps.d"},
        {"extra_ldflags": "-Wl,-o,/tmp/opmagic-x"},
        {"extra_ldflags": ["-Xlinker", "--output=/tmp/opmagic-x"]},
        {"extra_cflags": "-save-temps=cwd"},
    ],
)
@pytest.mark.slow  # calls compile_library (it refuses before building)
def test_compile_library_refuses_them_before_anything_runs(monkeypatch, keywords):
    monkeypatch.setattr(opmagic.native.library, "published_build", _would_build)
    with pytest.raises(BuildOptionError, match="which a build cannot take"):
        compile_library(op_source("fr_before"), progress=None, **keywords)


@pytest.mark.slow  # calls compile_cuda_library (it refuses before building)
def test_compile_cuda_library_refuses_nvcc_flags_before_anything_runs(monkeypatch):
    monkeypatch.setattr(opmagic.native.library, "published_build", _would_build)
    with pytest.raises(BuildOptionError, match=r"nvcc_flags has -keep, which a build"):
        compile_cuda_library(op_source("fr_cuda"), nvcc_flags="-keep", progress=None)
