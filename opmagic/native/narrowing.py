"""Which torch headers a source is compiled against first: ``torch/extension.h`` narrowed.

Most operator sources include ``torch/extension.h`` (or ``torch/torch.h``, ``torch/all.h``)
and use only tensors, ATen functions and the registration API; the rest of that header (the
C++ frontend's nn, optim, data, jit, autograd functions, and pybind11 with Python.h) costs
most of each build: a precompiled ``torch/types.h`` leaves ~3 s per build where the
precompiled ``torch/extension.h`` leaves ~10 s (its templates are instantiated again in
every build), and ~11 s against ~26 s before anything is precompiled.

So a source whose tokens use none of those parts is first compiled with those umbrella
headers standing for :data:`NARROW_HEADERS` (a directory of headers named like them is
searched before torch's own: the source is compiled as written). Should that compile fail
for any reason, the source is compiled again with the full headers, and that compile's
result is the build's: narrowing never makes a source fail that builds in full, and what a
source registers is what the same code registers compiled in full.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

from ..cachedir import BuildCache, digest, private_problem, remove_path, write_atomic
from .tokens import tokenize

# the headers that include (nearly) everything of torch's C++ API
UMBRELLA_HEADERS = ("torch/extension.h", "torch/torch.h", "torch/all.h")
# what stands for them first: tensors, every ATen function, torch::'s factories, registration
NARROW_HEADERS = ("torch/types.h", "torch/library.h")
# parts of the C++ API the narrow headers leave out, as sources name them: ``torch::nn::``,
# ``nn::Linear``, ``torch::NoGradGuard`` (a source naming one is compiled in full at once;
# ``at::cuda::`` or ``std::data`` are other namespaces' names)
FULL_ONLY_NAMES = frozenset(
    {
        "autograd",
        "nn",
        "optim",
        "data",
        "jit",
        "serialize",
        "save",
        "load",
        "pickle_save",
        "pickle_load",
        "fft",
        "special",
        "linalg",
        "sparse",
        "nested",
        "cuda",
        "mps",
        "xpu",
        "enumtype",
        "python",
        "NoGradGuard",
        "AutoGradMode",
        "manual_seed",
        "set_num_threads",
        "get_num_threads",
        "set_num_interop_threads",
        "get_num_interop_threads",
    }
)
# identifiers of Python's C API, pybind11 (py::, PYBIND11_MODULE) and torch's Python bindings
_PYTHON_PREFIXES = ("Py", "PY", "_Py", "THP", "py")
_DIRECTIVE = re.compile(r'#\s*(\w*)\s*(?:[<"]([^>"]*)[>"])?')
_CONDITIONALS = frozenset({"if", "ifdef", "ifndef", "elif", "elifdef", "elifndef"})


def narrowable(source: str) -> bool:
    """Whether ``source`` is compiled with :data:`NARROW_HEADERS` first: it includes an
    umbrella header, names nothing of Python (pybind11's ``py::``, the CPython API, torch's
    bindings: identifiers starting ``py``, ``Py``, ``PY``, ``THP``) nor of
    :data:`FULL_ONLY_NAMES`, and has no ``#if``/``#ifdef`` (a macro of the full headers could
    choose other code there, and compile). Headers it includes itself are included as
    written either way."""
    tokens = tokenize(source)
    includes_umbrella = False
    for index, token in enumerate(tokens):
        if token.kind == "directive":
            match = _DIRECTIVE.match(token.text)
            assert match is not None  # a directive token starts with "#", which matches
            directive, name = match.groups()
            if directive in _CONDITIONALS:
                return False
            includes_umbrella |= directive == "include" and name in UMBRELLA_HEADERS
        elif token.kind == "id":
            if token.text.startswith(_PYTHON_PREFIXES):
                return False
            if token.text in FULL_ONLY_NAMES and _scoped(tokens, index):
                return False
    return includes_umbrella


def _scoped(tokens: list, index: int) -> bool:
    """Whether the identifier at ``index`` is torch's (``torch::nn``) or an unqualified scope
    (``nn::Linear`` after ``using namespace torch``); another namespace's (``at::cuda::``,
    ``std::data``) is not."""
    after = tokens[index + 1].text if index + 1 < len(tokens) else ""
    before = [t.text for t in tokens[max(0, index - 2) : index]]
    return before == ["torch", "::"] or (after == "::" and before[-1:] != ["::"])


def narrow_include_dir(cache: BuildCache) -> Path:
    """A directory of headers named like :data:`UMBRELLA_HEADERS` that include
    :data:`NARROW_HEADERS` (written in the cache once): searched before torch's headers, it
    makes a source's ``#include <torch/extension.h>`` include those instead."""
    text = (
        "// opmagic: this source is compiled with the torch headers it needs first (a build\n"
        "// that fails with them is compiled again with the full header)\n#pragma once\n"
        + "".join(f"#include <{header}>\n" for header in NARROW_HEADERS)
    )
    directory = cache.prefix_dir(f"narrow-{digest({'narrow': text, 'for': UMBRELLA_HEADERS})}")
    if private_problem(directory) not in (None, "it does not exist"):
        remove_path(directory)  # not ours alone: nothing in it can be trusted
    for name in UMBRELLA_HEADERS:
        header = directory / name
        with contextlib.suppress(OSError, UnicodeDecodeError):
            if header.read_text() == text:
                continue
        header.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomic(header, text)
    return directory
