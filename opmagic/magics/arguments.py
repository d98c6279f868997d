"""Option bundles declared once, for the magics and for ``python -m opmagic``.

An :class:`Option` is an argparse argument as data. A bundle (a tuple of options) is
applied to a magic with :func:`with_options`, as IPython's ``script_args`` does, or to an
argparse parser with :func:`add_options`: ``%%torch_library`` and ``%%cuda_kernel`` share
:data:`BUILD_OPTIONS`, the three cell magics :data:`COMPARE_OPTIONS`; ``%dispatch`` and the
CLI's ``resolve`` share :data:`CONTEXT_OPTIONS`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..dispatch.contexts import CallContext
from ..native.options import DEFAULT_OPT_LEVEL

_F = TypeVar("_F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Option:
    """One command-line option: its flags and argparse keywords."""

    flags: tuple[str, ...]
    spec: dict[str, Any] = field(default_factory=dict)

    @property
    def takes_value(self) -> bool:
        """Whether the option reads the next word as its value (not a switch)."""
        return self.spec.get("action") not in ("store_true", "store_false")

    @property
    def dest(self) -> str:
        """The attribute argparse stores the option's value under."""
        return self.spec.get("dest") or self.flags[-1].lstrip("-").replace("-", "_")

    @property
    def default(self) -> Any:
        """The value the option has when the command line leaves it out."""
        if "default" in self.spec:
            return self.spec["default"]
        return {"store_true": False, "store_false": True}.get(self.spec.get("action"))


def with_options(bundle: tuple[Option, ...]) -> Callable[[_F], _F]:
    """Decorate a magic (under ``@magic_arguments()``) with every option of ``bundle``."""
    from IPython.core.magic_arguments import argument

    def decorate(magic: _F) -> _F:
        """Add the bundle's options, in the bundle's order in the magic's help."""
        for option in reversed(bundle):
            magic = argument(*option.flags, **option.spec)(magic)
        return magic

    return decorate


def add_options(parser: argparse.ArgumentParser, bundle: tuple[Option, ...]) -> None:
    """Add every option of ``bundle`` to an argparse parser."""
    for option in bundle:
        parser.add_argument(*option.flags, **option.spec)


def parse_options(magic: Callable[..., Any], line: str) -> argparse.Namespace:
    """A magic's parsed option line (``@magic_arguments``), a trailing ``# comment`` left out
    as it is in Python, so that a line can carry a note like the rest of a cell."""
    from IPython.core.magic_arguments import parse_argstring

    return parse_argstring(magic, without_comment(line))


def without_comment(line: str) -> str:
    """``line`` up to a ``#`` that starts a word outside quotes (a shell-style comment)."""
    quote = None
    for index, char in enumerate(line):
        if quote is not None:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            return line[:index].rstrip()
    return line


def unquote(text: str | None) -> str | None:
    """An option value without the quotes IPython's argument splitting leaves on it."""
    if text is not None and len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


# ---------------------------------------------------------------- the thread-local context

CONTEXT_OPTIONS: tuple[Option, ...] = (
    Option(("--no-grad",), {"action": "store_true", "help": "resolve under torch.no_grad()"}),
    Option(
        ("--inference-mode",),
        {"action": "store_true", "help": "resolve under torch.inference_mode()"},
    ),
    Option(
        ("--autocast",),
        {"metavar": "DEVICE", "help": "resolve under torch.autocast(DEVICE), e.g. cpu"},
    ),
    Option(
        ("--vmap",),
        {
            "action": "store_true",
            "help": "resolve inside torch.func.vmap over dim 0 of every tensor argument",
        },
    ),
    Option(
        ("--fake",),
        {"action": "store_true", "help": "resolve under FakeTensorMode, with fake inputs"},
    ),
    Option(
        ("--logging-mode",),
        {"action": "store_true", "help": "resolve under a logging TorchDispatchMode"},
    ),
)


def call_context(options: argparse.Namespace) -> CallContext:
    """The :class:`CallContext` that parsed :data:`CONTEXT_OPTIONS` ask for."""
    return CallContext(
        no_grad=options.no_grad,
        inference_mode=options.inference_mode,
        autocast=options.autocast,
        vmap=options.vmap,
        fake=options.fake,
        logging=options.logging_mode,
    )


# ---------------------------------------------------------------- comparing a cell's op

COMPARE_OPTIONS: tuple[Option, ...] = (  # of %%custom_op, %%torch_library and %%cuda_kernel
    Option(
        ("--compare",),
        {
            "default": None,
            "metavar": "SPEC",
            "help": "after the cell registered its op, compare it with a reference and time "
            "both: SPEC is %%compare's arguments with the cell's op as the candidate, e.g. "
            '--compare "torch.sin --inputs make_inputs --sizes 1024 65536" (%%compare? says '
            "more)",
        },
    ),
)


# ---------------------------------------------------------------- C++ and CUDA builds

BUILD_OPTIONS: tuple[Option, ...] = (
    Option(("-n", "--name"), {"help": "library name (lib<NAME>.so); default: the first namespace"}),
    Option(
        ("-O", "--opt"),
        {
            "dest": "opt_level",
            "default": DEFAULT_OPT_LEVEL,
            "help": f"optimisation level 0, 1, 2, 3, s or g (default {DEFAULT_OPT_LEVEL})",
        },
    ),
    Option(
        ("-I", "--include"),
        {
            "dest": "include_dirs",
            "action": "append",
            "default": [],
            "metavar": "DIR",
            "help": "add an include directory (repeatable); headers there are tracked for rebuilds",
        },
    ),
    Option(
        ("--cflags",),
        {
            "default": "",
            "metavar": "FLAGS",
            "help": 'extra compiler flags, one string: --cflags="-DFOO=1 -march=native"',
        },
    ),
    Option(
        ("--ldflags",),
        {
            "default": "",
            "metavar": "FLAGS",
            "help": 'extra linker flags, one string: --ldflags="-L/opt/lib -lfoo"',
        },
    ),
    Option(
        ("--no-pch",),
        {
            "dest": "precompiled_headers",
            "action": "store_false",
            "help": "do not use precompiled torch headers (slower; to rule them out)",
        },
    ),
    Option(
        ("-f", "--force"),
        {"action": "store_true", "help": "rebuild even if a cached build exists"},
    ),
    Option(
        ("-v", "--verbose"),
        {"action": "store_true", "help": "print the compiler commands and output"},
    ),
)


def build_keywords(options: argparse.Namespace) -> dict[str, Any]:
    """``compile_library`` keywords from parsed :data:`BUILD_OPTIONS`."""
    return {
        "name": options.name,
        "extra_cflags": unquote(options.cflags) or "",
        "extra_ldflags": unquote(options.ldflags) or "",
        "include_dirs": options.include_dirs,
        "opt_level": options.opt_level,
        "precompiled_headers": options.precompiled_headers,
        "force": options.force,
        "verbose": options.verbose,
    }


def given_build_options(options: argparse.Namespace) -> list[str]:
    """The :data:`BUILD_OPTIONS` a command line set away from their defaults, by flag."""
    return [
        option.flags[-1]
        for option in BUILD_OPTIONS
        if getattr(options, option.dest) != option.default
    ]
