"""Reading a cell of CUDA C++ without a compiler: its kernels, its launches, its two halves.

A scanner over the cell's tokens (:mod:`opmagic.native.tokens`: comments, strings and
preprocessor lines understood; no semantic analysis) finds the cell's top-level declarations,
namespace blocks included, and tells what each one is: a ``__global__`` kernel, device-only
code (``__device__``, ``__constant__``), code for both sides (``__host__ __device__``, types,
constants), or host code (functions, ``TORCH_LIBRARY`` blocks). From that:

- :func:`kernel_signatures`: the kernels' names and parameters (the NVRTC quick path binds a
  launcher per ``extern "C"`` kernel and converts Python arguments to the parameters' types);
- :func:`rewrite_launches`: every ``kernel<<<grid, block, shared, stream>>>(args)`` becomes a
  call of opmagic's launch helper (``cuda_launch.h``), which checks that the launch worked;
- :func:`split_source`: the device code for nvcc without torch's host headers, and the host
  code for g++ with the precompiled ones, both with the cell's line numbers, so that the
  36 s nvcc spends on a ``.cu`` that includes torch becomes about a second; or the reason the
  cell has to be compiled as one nvcc translation unit instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..tokens import Token, tokenize

_INCLUDE = re.compile(r'#\s*include\s*[<"]([^>"]+)[>"]')

# Headers of torch's host API: left out of the device code, which nvcc then reads in a second
# (ATen/cuda/*.cuh and c10/util device helpers stay: kernels use them).
_HOST_HEADER = re.compile(
    r"^(?:torch/|ATen/(?!cuda/.*\.cuh$)|c10/(?!util/|macros/)|caffe2/|pybind11/|Python\.h$)"
)
_TORCH_NAMESPACES = frozenset({"at", "torch", "c10", "caffe2", "pybind11", "py"})
_TORCH_MACRO = re.compile(r"^(?:TORCH|AT|C10|PYBIND11)_")
_ATTRIBUTE_CALLS = frozenset(
    {"__launch_bounds__", "__attribute__", "alignas", "__declspec", "__align__", "__maxnreg__"}
)
_TYPE_KEYWORDS = frozenset({"struct", "class", "union", "enum", "typedef", "using"})
_DEVICE_STORAGE = frozenset({"__constant__", "__shared__", "__managed__"})


@dataclass
class Item:
    """A top-level piece of the source: a declaration, a definition, a directive or a brace."""

    kind: str  # "directive", "open" (namespace/extern block), "close", "declaration"
    tokens: list[Token]
    namespaces: tuple[str, ...]  # enclosing namespaces ("" for an anonymous one)
    extern_c: bool  # inside extern "C" { } or declared extern "C"
    body: tuple[int, int] | None = None  # offsets of a function body's braces, if any

    @property
    def start(self) -> int:
        """Offset of the item's first character."""
        return self.tokens[0].start

    @property
    def end(self) -> int:
        """Offset just after the item's last character."""
        return self.tokens[-1].end

    @property
    def line(self) -> int:
        """Line of the item's first token."""
        return self.tokens[0].line

    @property
    def words(self) -> set[str]:
        """The identifiers of the item."""
        return {t.text for t in self.tokens if t.kind == "id"}

    @property
    def is_function(self) -> bool:
        """Whether the item defines a function (it has a body)."""
        return self.body is not None

    @property
    def is_kernel(self) -> bool:
        """A ``__global__`` function (declaration or definition)."""
        return self.kind == "declaration" and "__global__" in self.words

    @property
    def is_device_only(self) -> bool:
        """Code only the GPU runs: ``__device__`` without ``__host__``, device variables."""
        if self.kind != "declaration" or self.is_kernel:
            return False
        texts = [t.text for t in self.tokens if t.kind == "id"]
        device = texts.count("__device__") + texts.count("C10_DEVICE")
        host = texts.count("__host__") + texts.count("C10_HOST_DEVICE")
        return (device > host) or bool(_DEVICE_STORAGE & self.words)

    @property
    def uses_torch(self) -> bool:
        """Whether the item names torch's C++ API (``at::``, ``c10::``, ``TORCH_...``, ...)."""
        tokens = self.tokens
        for index, token in enumerate(tokens):
            if token.kind != "id":
                continue
            if _TORCH_MACRO.match(token.text):
                return True
            following = tokens[index + 1].text if index + 1 < len(tokens) else ""
            previous = tokens[index - 1].text if index else ""
            if token.text in _TORCH_NAMESPACES and (following == "::" or previous == "namespace"):
                return True
        return False

    @property
    def name(self) -> str | None:
        """The declared function's name: the identifier before its parameter list."""
        paren = self.parameter_list()
        return None if paren is None else self.tokens[paren - 1].text

    def parameter_list(self) -> int | None:
        """Index of the ``(`` that opens the function's parameters, if the item has one."""
        depth = 0
        for index, token in enumerate(self.tokens):
            if token.text in "([{" and token.kind == "punct":
                if (
                    token.text == "("
                    and depth == 0
                    and index
                    and self.tokens[index - 1].kind == "id"
                    and self.tokens[index - 1].text not in _ATTRIBUTE_CALLS
                    and not self.tokens[index - 1].text.startswith("C10_LAUNCH_BOUNDS")
                ):
                    return index
                depth += 1
            elif token.text in ")]}" and token.kind == "punct":
                depth -= 1
        return None

    def parameters(self) -> list[list[Token]]:
        """The tokens of each parameter of the function (nothing for ``()`` or ``(void)``)."""
        start = self.parameter_list()
        if start is None:
            return []
        params: list[list[Token]] = [[]]
        depth = 0
        for token in self.tokens[start + 1 :]:
            if token.kind == "punct" and token.text in "([{<":
                depth += 1
            elif token.kind == "punct" and token.text in ")]}>":
                if depth == 0:
                    break
                depth -= 1
            elif token.kind == "punct" and token.text == "," and depth == 0:
                params.append([])
                continue
            params[-1].append(token)
        if params == [[]] or [t.text for t in params[0]] == ["void"]:
            return []
        return params

    @property
    def qualified_name(self) -> str | None:
        """``ns::name`` of the declared function."""
        name = self.name
        return None if name is None else "::".join([*self.namespaces, name])


def scan(source: str) -> list[Item]:
    """The top-level items of ``source``, namespace blocks opened and closed as items too."""
    tokens = tokenize(source)
    items: list[Item] = []
    scopes: list[tuple[str, bool]] = []  # (namespace or "extern", extern "C")
    index = 0
    while index < len(tokens):
        token = tokens[index]
        namespaces = tuple(name for name, _ in scopes if name != "extern")
        extern_c = any(c for _, c in scopes)
        if token.kind == "directive":
            items.append(Item("directive", [token], namespaces, extern_c))
            index += 1
        elif token.text == "}" and token.kind == "punct":
            if scopes:
                scopes.pop()
            items.append(Item("close", [token], namespaces, extern_c))
            index += 1
        elif token.text == ";" and token.kind == "punct":
            index += 1
        elif (opened := _block_opening(tokens, index)) is not None:
            end, scope = opened
            items.append(Item("open", tokens[index : end + 1], namespaces, extern_c))
            scopes.append(scope)
            index = end + 1
        else:
            item, index = _declaration(tokens, index, namespaces, extern_c)
            items.append(item)
    return items


def _block_opening(tokens: list[Token], index: int) -> tuple[int, tuple[str, bool]] | None:
    """``(index of the '{', scope)`` when a namespace or ``extern "C" {`` block starts here."""
    texts = [t.text for t in tokens[index : index + 8]]
    if texts[:1] == ["inline"]:
        texts = texts[1:]
        index += 1
    if texts[:1] == ["namespace"]:
        name_parts: list[str] = []
        for offset, text in enumerate(texts[1:], start=1):
            if text == "{":
                return index + offset, ("::".join(name_parts), False)
            if text in ("=", ";"):
                return None  # a namespace alias is a declaration
            if text != "::":
                name_parts.append(text)
        return None
    extern_block = texts[:1] == ["extern"] and len(texts) > 2 and texts[2] == "{"
    if extern_block and tokens[index + 1].kind == "string":
        return index + 2, ("extern", tokens[index + 1].text == '"C"')
    return None


def _declaration(
    tokens: list[Token], index: int, namespaces: tuple[str, ...], extern_c: bool
) -> tuple[Item, int]:
    """The declaration or definition starting at ``tokens[index]``; returns it and what follows."""
    start = index
    depth = 0
    has_parens = has_equals = False
    while index < len(tokens):
        token = tokens[index]
        text = token.text if token.kind == "punct" else None
        if token.kind == "directive" and depth == 0:
            break  # a directive inside an unfinished declaration ends it here
        if text in ("(", "["):
            depth += 1
            has_parens = has_parens or (text == "(" and depth == 1)
        elif text in (")", "]"):
            depth -= 1
        elif text == "=" and depth == 0:
            has_equals = True
        elif text == ";" and depth == 0:
            return Item("declaration", tokens[start : index + 1], namespaces, extern_c), index + 1
        elif text == "{" and depth == 0:
            close = _matching_brace(tokens, index)
            head = tokens[start:index]
            if has_parens and not has_equals and not _declares_type(head):
                item = Item("declaration", tokens[start : close + 1], namespaces, extern_c)
                item.body = (token.start, tokens[close].end)
                if extern_c is False and _is_extern_c(head):
                    item.extern_c = True
                return item, close + 1
            index = close  # a class body or a braced initializer: go on to the ';'
        index += 1
    item = Item("declaration", tokens[start:index], namespaces, extern_c)
    return item, index


def _matching_brace(tokens: list[Token], index: int) -> int:
    """Index of the ``}`` that closes the ``{`` at ``index`` (the last token if unclosed)."""
    depth = 0
    for position in range(index, len(tokens)):
        token = tokens[position]
        if token.kind == "punct" and token.text == "{":
            depth += 1
        elif token.kind == "punct" and token.text == "}":
            depth -= 1
            if depth == 0:
                return position
    return len(tokens) - 1


def _declares_type(head: list[Token]) -> bool:
    """Whether a declaration's head (before its brace) starts a class, struct, enum or alias."""
    position = 0
    while position < len(head) and head[position].text == "template":
        position = _skip_angles(head, position + 1)
    return position < len(head) and head[position].text in _TYPE_KEYWORDS


def _skip_angles(tokens: list[Token], index: int) -> int:
    """The index after the ``<...>`` group starting at ``tokens[index]``."""
    depth = 0
    for position in range(index, len(tokens)):
        text = tokens[position].text
        if text == "<":
            depth += 1
        elif text in (">", ">>>"):
            depth -= len(text)
            if depth <= 0:
                return position + 1
    return len(tokens)


def _is_extern_c(head: list[Token]) -> bool:
    """Whether a declaration is written ``extern "C" ...``."""
    return any(head[i].text == "extern" and head[i + 1].text == '"C"' for i in range(len(head) - 1))


# ---------------------------------------------------------------- kernels


@dataclass(frozen=True)
class KernelParameter:
    """One parameter of a kernel: its C type, split into base type and pointer-ness."""

    name: str
    type: str  # as written, without the name, e.g. "const float* __restrict__"
    base: str  # the type without qualifiers and '*', e.g. "float", "unsigned int"
    pointer: bool


@dataclass(frozen=True)
class KernelSignature:
    """A ``__global__`` function of the source."""

    name: str
    qualified_name: str
    parameters: tuple[KernelParameter, ...]
    line: int
    extern_c: bool
    template: bool
    defined: bool


_QUALIFIERS = frozenset(
    {"const", "volatile", "__restrict__", "__restrict", "restrict", "struct", "__grid_constant__"}
)


def kernel_signatures(source: str) -> list[KernelSignature]:
    """Every ``__global__`` function the source declares, in source order."""
    kernels = []
    for item in scan(source):
        if not item.is_kernel or item.name is None:
            continue
        kernels.append(
            KernelSignature(
                item.name,
                item.qualified_name or item.name,
                tuple(_parameter(tokens, n) for n, tokens in enumerate(item.parameters())),
                item.line,
                item.extern_c,
                item.tokens[0].text == "template",
                item.is_function,
            )
        )
    return kernels


def _parameter(tokens: list[Token], position: int) -> KernelParameter:
    """A parameter from its tokens; an unnamed one is called ``arg<position>``."""
    texts = [t.text for t in tokens]
    pointer = "*" in texts or "[" in texts
    if "[" in texts:
        texts = texts[: texts.index("[")]
    words = [t for t in texts if t not in ("*", "&")]
    named = len([w for w in words if w not in _QUALIFIERS]) > 1 and re.match(r"^\w+$", words[-1])
    name = words[-1] if named else f"arg{position}"
    type_words = texts[: len(texts) - 1] if named and texts[-1] == name else texts
    base = " ".join(w for w in type_words if w not in _QUALIFIERS and w not in ("*", "&"))
    return KernelParameter(name, " ".join(type_words), base, pointer)


# ---------------------------------------------------------------- launches


@dataclass(frozen=True)
class Launch:
    """One ``kernel<<<config>>>(`` of the source, by offsets."""

    kernel: str  # the kernel expression as written, e.g. "add_kernel<scalar_t>"
    start: int  # offset of the kernel expression
    open: int  # offset of "<<<"
    close: int  # offset just after ">>>"
    config: str
    line: int


def find_launches(source: str) -> list[Launch]:
    """Every ``<<<...>>>`` kernel launch of the source, in order."""
    tokens = tokenize(source)
    launches = []
    for index, token in enumerate(tokens):
        if token.kind != "launch" or token.text != "<<<":
            continue
        start = _kernel_expression_start(tokens, index)
        close = next((j for j in range(index + 1, len(tokens)) if tokens[j].text == ">>>"), None)
        if start is None or close is None:
            continue
        launches.append(
            Launch(
                source[tokens[start].start : token.start].strip(),
                tokens[start].start,
                token.start,
                tokens[close].end,
                source[token.end : tokens[close].start].strip(),
                token.line,
            )
        )
    return launches


def _kernel_expression_start(tokens: list[Token], index: int) -> int | None:
    """Index of the first token of the kernel expression before ``<<<`` at ``index``."""
    position = index - 1
    while position >= 0:
        token = tokens[position]
        if token.text == ">":  # template arguments: back to the matching '<'
            depth = 0
            while position >= 0:
                if tokens[position].text == ">":
                    depth += 1
                elif tokens[position].text == "<":
                    depth -= 1
                    if depth == 0:
                        break
                position -= 1
            position -= 1
            continue
        if token.kind != "id":
            return None
        if position >= 1 and tokens[position - 1].text == "::":
            position -= 2
            continue
        return position
    return None


def rewrite_launches(source: str, launches: list[Launch] | None = None) -> str:
    """``k<<<g, b, s, st>>>(args)`` as ``::opmagic_cuda::launch<k>("k", g, b, s, st)(args)``.

    The rewritten text keeps every newline, so the source keeps its line numbers.
    """
    pieces, position = [], 0
    for launch in launches if launches is not None else find_launches(source):
        name = launch.kernel.replace('"', "")
        pieces.append(source[position : launch.start])
        pieces.append(f'::opmagic_cuda::launch<{launch.kernel}>("{name}", ')
        pieces.append(source[launch.open + 3 : launch.close - 3].strip(" \t"))
        pieces.append(")")
        position = launch.close
    pieces.append(source[position:])
    return "".join(pieces)


# ---------------------------------------------------------------- host and device halves


@dataclass(frozen=True)
class SplitSource:
    """A cell's host and device code (each with the cell's line numbers), or why not split."""

    host: str  # launches rewritten, kernels declared only, device-only code blanked
    device: str  # kernels and device code, without torch's host headers and host functions
    kernels: tuple[KernelSignature, ...]
    whole_reason: str | None = None  # why the cell must be one nvcc translation unit
    launched: tuple[str, ...] = field(default=())  # kernel expressions the host code launches


def split_source(source: str) -> SplitSource:
    """The host and device halves of a full-path cell (see the module docstring)."""
    items = scan(source)
    host, device = list(source), list(source)
    kernels = kernel_signatures(source)
    reason = _whole_reason(items, kernels)
    device_names: set[str] = set()
    for item in items:
        side = _side(item)
        if side == "kernel" and item.body is not None:  # the host side only declares it
            _blank(host, item.body[0], item.body[1])
            host[item.body[0]] = ";"
        elif side == "device":
            _blank(host, item.start, item.end)
            device_names |= _declared_names(item)
        elif side == "host":
            _blank(device, item.start, item.end)
    host_text = "".join(host)
    launches = find_launches(host_text)
    if reason is None:
        reason = _device_names_in_host(items, device_names)
    return SplitSource(
        rewrite_launches(host_text, launches),
        "".join(device),
        tuple(kernels),
        reason,
        tuple(dict.fromkeys(launch.kernel for launch in launches)),
    )


def _side(item: Item) -> str:
    """Where an item is compiled: "kernel", "device", "host" or "both".

    Kernels are defined on the device side and declared on the host side; torch's host
    headers, host functions, TORCH_LIBRARY blocks, variables and anything naming torch's API
    are host code; types, constants, declarations and ``__host__ __device__`` or ``constexpr``
    functions are both.
    """
    if item.kind == "directive":
        include = _INCLUDE.search(item.tokens[0].text)
        return "host" if include and _HOST_HEADER.match(include[1]) else "both"
    if item.kind != "declaration":
        return "both"
    if item.is_kernel:
        return "kernel"
    if item.is_device_only:
        return "device"
    if item.uses_torch:
        return "host"
    if item.is_function:
        return "both" if _is_host_device(item) or "constexpr" in item.words else "host"
    if item.parameter_list() is not None or _declares_type(item.tokens):
        return "both"  # a function declaration, or a type
    return "both" if {"const", "constexpr", "extern"} & item.words else "host"


def _is_host_device(item: Item) -> bool:
    """``__host__ __device__`` code: compiled on both sides."""
    words = item.words
    return ("__host__" in words and "__device__" in words) or "C10_HOST_DEVICE" in words


def _whole_reason(items: list[Item], kernels: list[KernelSignature]) -> str | None:
    """Why host and device code cannot be compiled apart, or ``None``."""
    for item in items:
        if item.kind == "directive" and "__CUDACC__" in item.tokens[0].text:
            return f"line {item.line} tests __CUDACC__, which only nvcc defines"
        if item.kind != "declaration" or not (item.is_kernel or item.is_device_only):
            continue
        if item.uses_torch:
            what = "a kernel" if item.is_kernel else "device code"
            return f"{what} at line {item.line} uses torch's C++ API, which nvcc must then read"
        if item.is_kernel and ("static" in item.words or "" in item.namespaces):
            return (
                f"the kernel at line {item.line} has internal linkage (static or in an "
                "anonymous namespace), so only its own translation unit can launch it"
            )
        if any(t.kind == "launch" for t in item.tokens):
            return f"device code at line {item.line} launches a kernel (dynamic parallelism)"
    names = [k.qualified_name for k in kernels]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        return f"the kernel {repeated[0]} is overloaded"
    return None


def _declared_names(item: Item) -> set[str]:
    """Names a device-only declaration introduces (its function or variable names)."""
    name = item.name
    if name is not None:
        return {name}
    before_init = []
    for token in item.tokens:
        if token.text in ("=", ";", "[", "{"):
            break
        before_init.append(token)
    ids = [t.text for t in before_init if t.kind == "id"]
    return {ids[-1]} if ids else set()


def _device_names_in_host(items: list[Item], device_names: set[str]) -> str | None:
    """Host code that names device-only functions or variables cannot be compiled apart."""
    if not device_names:
        return None
    for item in items:
        if item.kind != "declaration" or item.is_kernel or item.is_device_only:
            continue
        if _is_host_device(item):
            continue
        used = device_names & item.words
        if used:
            name = sorted(used)[0]
            return f"host code at line {item.line} uses the device symbol {name}"
    return None


def _blank(chars: list[str], start: int, end: int) -> None:
    """Replace ``chars[start:end]`` by spaces, keeping newlines (and so line numbers)."""
    for position in range(start, end):
        if chars[position] != "\n":
            chars[position] = " "

