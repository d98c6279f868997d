"""Option bundles declared once, for the magics and for ``python -m opmagic``.

An :class:`Option` is an argparse argument as data. A bundle (a tuple of options) is
applied to a magic with :func:`with_options`, as IPython's ``script_args`` does, or to an
argparse parser with :func:`add_options`: ``%%torch_library`` and ``%%cuda_kernel`` share
:data:`BUILD_OPTIONS`, the cell magics :data:`COMPARE_OPTIONS`, ``%%custom_op`` and
``%%triton_op`` :data:`PYTHON_OP_OPTIONS`, the cell magics that make an op
:data:`DOCTOR_CELL_OPTIONS`, ``%doctor`` and the CLI's ``doctor`` :data:`DOCTOR_LADDER_OPTIONS`;
``%dispatch``, ``%%trace`` and the CLI's
``resolve`` share :data:`CONTEXT_OPTIONS`; ``%kernels`` and the CLI's ``kernels`` share
:data:`KERNELS_OPTIONS`. The values of options are read here too: :func:`evaluate` (a Python
expression) and :func:`names` (a comma-separated list).
"""

from __future__ import annotations

import argparse
import shlex
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
    """A magic's parsed option line (``@magic_arguments``), split as a shell would.

    Quotes group a value and are removed (``--cflags="-DA=1 -DB=2"``, ``-I "/dir with
    space"``); a trailing ``# comment`` is left out, as in Python, so that a line can carry a
    note like the rest of a cell; an option that takes a value takes the next word even when
    it starts with ``-`` (``--cflags -O3``). A line that cannot be split is a UsageError.
    """
    parser = magic.parser
    return parser.parse_args(_attach_values(parser, split_words(without_comment(line))))


def split_words(line: str) -> list[str]:
    """The words of an option line, as ``sh`` splits them; a UsageError when it cannot."""
    from IPython.core.error import UsageError

    try:
        return shlex.split(line)
    except ValueError as error:
        quote = next((q for q in ("'", '"') if _unclosed(line, q)), None)
        cause = (
            f"a {quote} quote is never closed"
            if quote is not None
            else "it ends with a backslash that escapes nothing"
        )
        raise UsageError(
            f"cannot split the option line {line!r}: {cause} ({error}). Quote a value that "
            'holds spaces as a whole, e.g. --cflags="-DA=1 -DB=2".'
        ) from None


def _unclosed(line: str, quote: str) -> bool:
    """Whether ``quote`` opens a quoted part of ``line`` that never closes (shell rules)."""
    inside: str | None = None
    escaped = False
    for char in line:
        if escaped:
            escaped = False
        elif char == "\\" and inside != "'":
            escaped = True
        elif inside is None and char in "'\"":
            inside = char
        elif char == inside:
            inside = None
    return inside == quote


def _attach_values(parser: argparse.ArgumentParser, words: list[str]) -> list[str]:
    """``--cflags -O3`` as ``--cflags=-O3``: argparse would take ``-O3`` for an option.

    Only options that take one value are joined to a next word that starts with ``-`` and is
    not itself one of the parser's options.
    """
    takes_one = {
        flag for action in parser._actions if action.nargs is None for flag in action.option_strings
    }
    known = set(parser._option_string_actions)
    attached: list[str] = []
    index = 0
    while index < len(words):
        word = words[index]
        following = words[index + 1] if index + 1 < len(words) else None
        if (
            word in takes_one
            and following is not None
            and following.startswith("-")
            and following.split("=", 1)[0] not in known
        ):
            attached.append(f"{word}={following}")
            index += 2
        else:
            attached.append(word)
            index += 1
    return attached


def without_comment(line: str) -> str:
    """``line`` up to a ``#`` that starts a word outside quotes (a shell-style comment)."""
    quote = None
    escaped = False
    for index, char in enumerate(line):
        if escaped:
            escaped = False
        elif char == "\\" and quote != "'":
            escaped = True
        elif quote is not None:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            return line[:index].rstrip()
    return line


def evaluate(expression: str, namespace: dict[str, Any], what: str) -> Any:
    """The value of a user's expression (an option's value, a call's argument) in
    ``namespace``; one that does not evaluate is a UsageError naming ``what`` and the error."""
    from IPython.core.error import UsageError

    try:
        return eval(expression, namespace)
    except Exception as error:  # the user's expression: a bad magic line
        raise UsageError(
            f"could not evaluate {what} {expression!r}: {type(error).__name__}: {error}"
        ) from error


def names(values: str | list[str] | None) -> list[str]:
    """The names of a list option, as words or comma-separated: ``["float32", "float16"]``
    from ``"float32, float16"`` or ``["float32", "float16"]`` or ``["float32,float16"]``."""
    words = [values] if isinstance(values, str) else values or []
    return [name.strip() for word in words for name in word.split(",") if name.strip()]


def joined(values: list[str] | str | None) -> str:
    """The words of a repeatable option (``--cflags A --cflags B``) as one flags string."""
    if values is None:
        return ""
    return values if isinstance(values, str) else " ".join(values)


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


# ---------------------------------------------------------------- a cell's Python operator

PYTHON_OP_OPTIONS: tuple[Option, ...] = (  # of %%custom_op and %%triton_op
    Option(
        ("--mutates-args",),
        {
            "default": "",
            "metavar": "NAMES",
            "help": "comma-separated names of the arguments the function mutates in place, or "
            "'unknown' (assume it may mutate every argument); default: it mutates nothing",
        },
    ),
    Option(
        ("--check",),
        {
            "default": None,
            "metavar": "EXPR",
            "help": "a Python expression for sample arguments (a tuple is the argument list); "
            "runs torch.library.opcheck, and gradcheck when the cell has a @backward, and "
            "shows a pass/fail table",
        },
    ),
)


def mutates_args(options: argparse.Namespace) -> tuple[str, ...] | str:
    """``custom_op``'s ``mutates_args`` from parsed :data:`PYTHON_OP_OPTIONS`."""
    text = options.mutates_args.strip()
    return "unknown" if text == "unknown" else tuple(names(text))


def check_arguments(options: argparse.Namespace, namespace: dict[str, Any]) -> tuple | None:
    """The sample arguments ``--check EXPR`` of parsed :data:`PYTHON_OP_OPTIONS` gives, EXPR
    evaluated in ``namespace`` (a tuple is the argument list); ``None`` without ``--check``."""
    if options.check is None:
        return None
    value = evaluate(options.check, namespace, "--check")
    return value if isinstance(value, tuple) else (value,)


# ---------------------------------------------------------------- kernels per dispatch key

KERNELS_OPTIONS: tuple[Option, ...] = (  # of %kernels and `python -m opmagic kernels`
    Option(
        ("ns",),
        {"nargs": "?", "metavar": "NS", "help": "only operators of this namespace, e.g. aten"},
    ),
    Option(("-n", "--namespace"), {"metavar": "NS", "help": "the same as NS"}),
    Option(
        ("-k", "--key"),
        {
            "action": "append",
            "help": "a runtime key to show (repeat for several; 'all' for every key)",
        },
    ),
    Option(
        ("-m", "--missing"),
        {
            "metavar": "KEY",
            "help": "only operators without a kernel of their own for KEY (e.g. Meta)",
        },
    ),
    Option(
        ("--wide",),
        {
            "dest": "long",
            "action": "store_false",
            "default": False,
            "help": "a row per operator, a column per key (the default)",
        },
    ),
    Option(
        ("--long",),
        {
            "action": "store_true",
            "default": False,
            "help": "a row per (operator, key) kernel with its source, instead of operators x keys",
        },
    ),
)


def kernels_keywords(options: argparse.Namespace) -> dict[str, Any]:
    """``opmagic.kernels`` arguments from parsed :data:`KERNELS_OPTIONS`."""
    if options.ns and options.namespace and options.ns != options.namespace:
        from IPython.core.error import UsageError

        raise UsageError(
            f"two namespaces, {options.ns!r} and --namespace {options.namespace!r}: give one."
        )
    keys = None
    if options.key:
        keys = "all" if options.key == ["all"] else options.key
    return {
        "namespace": options.ns or options.namespace,
        "keys": keys,
        "wide": not options.long,
        "missing": options.missing,
    }


# ---------------------------------------------------------------- comparing a cell's op

COMPARE_OPTIONS: tuple[Option, ...] = (  # of the cell magics that make an op
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


# ---------------------------------------------------------------- the doctor

DOCTOR_LADDER_OPTIONS: tuple[Option, ...] = (  # of %doctor and `python -m opmagic doctor`
    Option(
        ("--until",),
        {
            "default": None,
            "metavar": "RUNG",
            "help": "the last rung to climb, e.g. aot_eager (leaves out Inductor, export and "
            "AOTInductor, which take seconds)",
        },
    ),
    Option(
        ("--rungs",),
        {
            "default": None,
            "metavar": "RUNGS",
            "help": "comma-separated rungs to climb (the others are skipped), e.g. fake,make_fx",
        },
    ),
)

DOCTOR_CELL_OPTIONS: tuple[Option, ...] = (  # of %%custom_op and %%triton_op
    Option(
        ("--doctor",),
        {
            "nargs": "?",
            "const": "",
            "default": None,
            "metavar": "SAMPLES",
            "help": "after the cell registered its op, diagnose it (opmagic.doctor): SAMPLES is "
            "a Python expression for the arguments (a tuple is the argument list) or a list of "
            "argument tuples; without it a sample is built from the schema",
        },
    ),
    *DOCTOR_LADDER_OPTIONS,
)


def doctor_keywords(options: argparse.Namespace) -> dict[str, Any]:
    """``opmagic.doctor``'s ``rungs`` and ``until`` from parsed :data:`DOCTOR_LADDER_OPTIONS`."""
    return {
        "rungs": names(options.rungs) if options.rungs is not None else None,
        "until": options.until,
    }


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
            "action": "append",
            "default": [],
            "metavar": "FLAGS",
            "help": "extra compiler flags, split as a shell would (repeatable): "
            '--cflags="-DFOO=1 -march=native"',
        },
    ),
    Option(
        ("--ldflags",),
        {
            "action": "append",
            "default": [],
            "metavar": "FLAGS",
            "help": "extra linker flags, split as a shell would (repeatable): "
            '--ldflags="-L/opt/lib -lfoo"',
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
        "extra_cflags": joined(options.cflags),
        "extra_ldflags": joined(options.ldflags),
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
