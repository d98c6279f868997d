"""The registration blocks of a C++ source: ``TORCH_LIBRARY*`` and ``STABLE_TORCH_LIBRARY*``.

One scanner for every reader of sources: the library's default name, how a cell without a
cell id is recognised across runs, whether a CUDA cell takes the full path. It reads the
source's tokens (:mod:`opmagic.native.tokens`), so blocks in comments, string literals and
preprocessor lines are not blocks, and a macro's arguments may span lines. A loaded library
reports its blocks in the same :class:`Block` form, as the compiler saw them (macros
expanded, ``#if`` applied): :attr:`opmagic.native.LoadedLibrary.blocks`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .tokens import Token, tokenize

# macro -> what its block makes, as torch::Library::Kind names it
REGISTRATION_MACROS: dict[str, str] = {
    "TORCH_LIBRARY": "DEF",  # (ns, m)
    "TORCH_LIBRARY_FRAGMENT": "FRAGMENT",  # (ns, m)
    "TORCH_LIBRARY_IMPL": "IMPL",  # (ns, k, m)
    "STABLE_TORCH_LIBRARY": "DEF",
    "STABLE_TORCH_LIBRARY_FRAGMENT": "FRAGMENT",
    "STABLE_TORCH_LIBRARY_IMPL": "IMPL",
}
_OPENING = frozenset("([{")
_CLOSING = frozenset(")]}")


@dataclass(frozen=True)
class Block:
    """One registration block of a source: which macro, namespace and key, and where."""

    macro: str  # "TORCH_LIBRARY", "TORCH_LIBRARY_IMPL", "STABLE_TORCH_LIBRARY_FRAGMENT", ...
    namespace: str  # "_" for a fallback (TORCH_LIBRARY_IMPL(_, Key, m))
    key: str | None  # the dispatch key of an ``_IMPL`` block
    line: int  # the line of the macro's name

    @property
    def kind(self) -> str:
        """What the block makes: ``"DEF"`` (defines the namespace), ``"FRAGMENT"`` or ``"IMPL"``."""
        return REGISTRATION_MACROS[self.macro]

    @property
    def stable(self) -> bool:
        """Whether the block registers through the LibTorch stable ABI (``STABLE_...``)."""
        return self.macro.startswith("STABLE_")

    def __str__(self) -> str:
        args = f"{self.namespace}, {self.key}" if self.key else self.namespace
        return f"{self.macro}({args})"


def scan_blocks(source: str) -> tuple[Block, ...]:
    """The registration blocks of ``source``, in source order.

    A block is a registration macro followed by its parenthesised arguments; an ``_IMPL``
    block's key is its second argument (``None`` when it does not have three).
    """
    tokens = tokenize(source)
    blocks = []
    for index, token in enumerate(tokens):
        if token.kind != "id" or token.text not in REGISTRATION_MACROS:
            continue
        args = _arguments(tokens, index + 1)
        if not args or not args[0]:
            continue  # not an invocation (or not a whole one): not a block
        is_impl = REGISTRATION_MACROS[token.text] == "IMPL"
        key = args[1] if is_impl and len(args) == 3 else None
        blocks.append(Block(token.text, args[0], key, token.line))
    return tuple(blocks)


def _arguments(tokens: list[Token], index: int) -> list[str] | None:
    """The arguments of the macro invocation whose ``(`` is ``tokens[index]``, each as its
    tokens' text joined; ``None`` when no ``(`` is there or it is never closed."""
    if index >= len(tokens) or tokens[index].kind != "punct" or tokens[index].text != "(":
        return None
    args: list[list[str]] = [[]]
    depth = 0
    for token in tokens[index + 1 :]:
        if token.kind == "punct" and token.text in _OPENING:
            depth += 1
        elif token.kind == "punct" and token.text in _CLOSING:
            if depth == 0:
                return ["".join(arg) for arg in args]
            depth -= 1
        elif token.kind == "punct" and token.text == "," and depth == 0:
            args.append([])
            continue
        args[-1].append(token.text)
    return None
