"""``NAME/csrc/``: each exported C++/CUDA cell's source as a file, and how setup.py builds it.

The file is the cell's source unchanged, after a block that makes explicit what opmagic's
build gave it: the ``#include`` lines of the prefix header it was compiled after (the torch
header set of its build and the registration preamble's standard headers) that the source
does not write itself, and ``TORCH_EXTENSION_NAME`` when the source uses it. opmagic's
deferred registration macros are not needed: torch's own register when the library loads.

Each cell becomes an extension of its own, as it was a library of its own in the session
(``NAME._C`` when there is one): a cell whose blocks are all ``STABLE_TORCH_LIBRARY*`` and
whose torch headers are all stable-ABI ones builds with ``py_limited_api=True``,
``-DPy_LIMITED_API`` and ``-DTORCH_TARGET_VERSION`` (the running torch's version: the
library then loads on it and every later torch), as extension-cpp's stable variant does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..cells.history import CellEntry
from ..native import DEFAULT_OPT_LEVEL, LoadedLibrary
from ..native.blocks import scan_blocks
from ..native.cuda.toolkit import nvcc_arch_flags, parse_archs
from ..native.headers import (
    included_headers,
    included_torch_headers,
    prefix_includes,
    refuses_target_version,
)
from ..native.options import split_flags
from ..native.toolchain import find_toolchain
from .selection import native_libraries

# the CPython limited API version abi3 wheels are built for: torch's own minimum
# (torch.utils.cpp_extension adds -DPy_LIMITED_API with it to py_limited_api extensions)
LIMITED_API = "0x030A0000"
LIMITED_API_TAG = "cp310"
EXPORTED_OPT_LEVEL = "3"  # a package is built once and run often (opmagic builds at -O1)
_WORD = re.compile(r"\bTORCH_EXTENSION_NAME\b")


@dataclass(frozen=True)
class NativeSource:
    """One exported C++/CUDA cell: its file, its extension module and how to build it."""

    label: str  # the cell's label, "[3]"
    path: str  # in the package directory: "csrc/mylib.cpp", "csrc/cuda/mylib.cu"
    module: str  # the extension module: "_C", "_C_mylib"
    text: str  # the file's contents
    cuda: bool
    stable: bool  # built for the stable ABI (py_limited_api, TORCH_TARGET_VERSION)
    why_classic: str  # for STABLE_ blocks built classic: why
    cxx_flags: tuple[str, ...]
    nvcc_flags: tuple[str, ...]
    link_flags: tuple[str, ...]
    include_dirs: tuple[str, ...]
    operators: tuple[tuple[str, str], ...]  # (name, schema) of the operators it defines
    explicit: tuple[str, ...]  # what the file adds above the cell's source


def target_version() -> str:
    """``TORCH_TARGET_VERSION`` for this torch: ``0x020d000000000000`` for 2.13 (major, minor,
    patch 0, no ABI tag)."""
    major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    return f"0x{major:02x}{minor:02x}000000000000"


def native_sources(exported: Sequence[CellEntry]) -> tuple[NativeSource, ...]:
    """The C++/CUDA files of the exported cells, in cell order, named after their libraries."""
    cells = [
        (entry, source, library)
        for entry in exported
        for source in entry.sources
        for library in native_libraries(entry)
        if source.handle is library
    ]
    stems: dict[str, int] = {}
    result = []
    for entry, source, library in cells:
        stem = _unique(library.name, stems)
        module = "_C" if len(cells) == 1 else f"_C_{stem}"
        cuda = source.kind == "cuda_kernel"
        path = f"csrc/cuda/{stem}.cu" if cuda else f"csrc/{stem}.cpp"
        result.append(_native_source(entry.label, source.options, library, path, module, cuda))
    return tuple(result)


def _unique(name: str, taken: dict[str, int]) -> str:
    """``name``, or ``name_2``, ...: a file stem no earlier cell took."""
    count = taken.get(name, 0) + 1
    taken[name] = count
    return name if count == 1 else f"{name}_{count}"


def _native_source(
    label: str,
    options: Mapping[str, Any],
    library: LoadedLibrary,
    path: str,
    module: str,
    cuda: bool,
) -> NativeSource:
    """The file and build of one cell's library."""
    source = library.source
    explicit = [
        f"#include <{header}>"
        for header in prefix_includes(source, library.build.header_set)
        if header not in included_headers(source)
    ]
    if _WORD.search(source):
        explicit += ["#undef TORCH_EXTENSION_NAME", f"#define TORCH_EXTENSION_NAME {library.name}"]
    stable, why_classic = _stable_abi(source, explicit)
    build = library.options
    opt = build.opt_level if build is not None and build.opt_level != DEFAULT_OPT_LEVEL else None
    cxx = [f"-O{opt or EXPORTED_OPT_LEVEL}"]
    if build is not None:
        cxx += [*build.cflags, *build.defines]
    nvcc = [f"-O{opt or EXPORTED_OPT_LEVEL}", *split_flags(options.get("nvcc_flags") or "", "")]
    if cuda and options.get("arch"):
        nvcc += nvcc_arch_flags(parse_archs(options["arch"]))
    if stable:
        cxx += [f"-DPy_LIMITED_API={LIMITED_API}", f"-DTORCH_TARGET_VERSION={target_version()}"]
        nvcc += [f"-DTORCH_TARGET_VERSION={target_version()}", "-DUSE_CUDA"]
    return NativeSource(
        label=label,
        path=path,
        module=module,
        text=_file_text(label, "%%cuda_kernel" if cuda else "%%torch_library", explicit, source),
        cuda=cuda,
        stable=stable,
        why_classic=why_classic,
        cxx_flags=tuple(cxx),
        nvcc_flags=tuple(nvcc) if cuda else (),
        link_flags=tuple(build.ldflags) if build is not None else (),
        include_dirs=tuple(build.include_dirs) if build is not None else (),
        operators=tuple((op.name, op.schema) for op in library.operators),
        explicit=tuple(explicit),
    )


def _stable_abi(source: str, explicit: list[str]) -> tuple[bool, str]:
    """Whether the source builds for the stable ABI alone, and if its blocks are stable but it
    does not, why."""
    blocks = scan_blocks(source)
    if not blocks or not all(block.stable for block in blocks):
        return False, ""
    toolchain = find_toolchain()
    headers = [*included_torch_headers(source, toolchain)]
    headers += [line.split("<", 1)[1].rstrip(">") for line in explicit if "<" in line]
    classic = [h for h in headers if refuses_target_version(h, toolchain)]
    if classic:
        return False, (
            f"it includes {', '.join(f'<{h}>' for h in classic)}, outside the stable ABI: built as "
            "a classic extension, tied to this torch version"
        )
    return True, ""


def _file_text(label: str, magic: str, explicit: list[str], source: str) -> str:
    """The exported file: where it comes from, what opmagic's build gave it, the source."""
    head = [f"// Exported by opmagic from cell {label} ({magic}); below the marker, the cell as it"]
    head.append("// was written.")
    if explicit:
        head += [
            "// opmagic compiled the cell after a prefix header: what of it the cell did not",
            "// write itself, so that the file builds with plain torch as it did there:",
            *explicit,
        ]
    head.append(f"// ---- cell {label} ----")
    return "\n".join(head) + "\n" + source
