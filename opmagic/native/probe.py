"""Trying a new build in a child process before this process loads it: no C++ cell can end it.

Loading a library runs its static initialisers (inside ``dlopen``) and registering runs its
blocks: C++ that may crash (a null dereference), throw where nothing catches it
(``std::terminate``), or register operators outside the blocks (``torch::RegisterOperators``,
a ``torch::Library`` object of its own), where opmagic could neither remove nor replace them.
:func:`probe` forks this process (the child has the same dispatcher, so it meets the same
duplicates), and in the child unregisters the version the build replaces, loads the build and
registers its blocks one at a time, telling the parent each step on a pipe. A crash is caught
in the child, whose signal handler sends the native stack, so the parent says what happened
and where, and never loads the build.

A build that passed is recorded (``probe.json`` beside it in the cache): loading it again, in
this process or a later one, skips the probe (a fork, ~0.1 s).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import re
import select
import shutil
import signal
import subprocess
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._torch import dispatcher
from ..cachedir import opened_names
from ..errors import LoadError
from .loader import NativeLibrary
from .registration import Registration, SourceSite
from .snapshots import OperatorState, snapshot
from .tokens import tokenize

PROBE_FILE = "probe.json"  # beside the library: it loaded and registered cleanly in a child
PROBE_TIMEOUT_S = 120.0
_CRASHED = 70  # the child's exit status after its signal handler reported a crash
_SIGNALS = {
    signal.SIGSEGV: "a segmentation fault (an invalid memory access, e.g. through a null pointer)",
    signal.SIGBUS: "a bus error (an access to unmapped or misaligned memory)",
    signal.SIGFPE: "an arithmetic fault (e.g. an integer division by zero)",
    signal.SIGILL: "an illegal instruction",
    signal.SIGABRT: "an abort (std::terminate: a C++ exception nothing caught, or abort())",
}
_BLOCK_BODY = re.compile(r"^(?:STABLE_)?TORCH_LIBRARY(?:_FRAGMENT|_IMPL)?_init_")
_TERMINATE = re.compile(
    r"terminate called after throwing an instance of '(?P<type>[^']+)'"
    r"\s*(?:what\(\):\s*(?P<what>.*))?",
    re.S,
)
_WHAT_END = re.compile(r"\nException raised from |\n\s*frame #")


@dataclass(frozen=True)
class _Trial:
    """What the child tries: the build, its registration site, the version it replaces."""

    path: Path
    site: SourceSite
    previous: Registration | None
    source: str


def probe(path: Path, site: SourceSite, previous: Registration | None, source: str) -> None:
    """Raise :class:`LoadError` unless the library at ``path`` loads and registers in a child
    process without crashing and without registering outside its blocks.

    ``previous``: the registration the library replaces (the child unregisters it first, as
    this process will). Registration errors torch reports are not the probe's business: this
    process meets them again and reports them with the previous version restored.
    """
    record = path.parent / PROBE_FILE
    if record.is_file():
        return
    trial = _Trial(path, site, previous, source)
    messages, status, output = _in_child(functools.partial(_try, trial))
    if messages and messages[-1].get("done"):
        if not messages[-1].get("static"):
            with contextlib.suppress(OSError):  # a read-only cache: probe again next time
                record.write_text(json.dumps({"loads": True}))
        return
    raise _failure(trial, messages, status, output)


# ---------------------------------------------------------------- in the child


def _try(trial: _Trial, report: Callable[[dict], None]) -> None:
    """The child's work: unregister the replaced version, load, check, register block by block."""
    if trial.previous is not None and trial.previous.active:
        trial.previous.native.fini()
    names = set(dispatcher.all_op_names())
    namespaces = _mentioned_namespaces(trial.source, {n.split("::", 1)[0] for n in names})
    before = snapshot(namespaces)
    report({"step": "load"})
    try:
        native = NativeLibrary(trial.path)
    except LoadError:
        report({"done": True})  # this process raises the same LoadError when it loads it
        return
    new_names = set(dispatcher.all_op_names()) - names
    after = snapshot(namespaces | {n.split("::", 1)[0] for n in new_names})
    static = {name: _sites(state) for name, state in after.items() if before.get(name) != state}
    if static:
        report({"static": static})
        return
    for index, block in enumerate(native.blocks):
        report({"step": "block", "block": str(block), "line": block.line})
        if native.init(str(trial.site.file), index + 1) is not None:
            break  # torch's error: this process reports it (with the previous version back)
    native.fini()
    report({"done": True})


def _sites(state: OperatorState) -> list[str]:
    """The registration sites of an operator's state (definition first)."""
    return [s for s in [state.def_site, *(k[2] for k in state.kernels)] if s]


def _mentioned_namespaces(source: str, known: set[str]) -> set[str]:
    """Operator namespaces the source names (identifiers, words in string literals)."""
    words = set()
    for token in tokenize(source):
        if token.kind == "id":
            words.add(token.text)
        elif token.kind == "string":
            words.update(re.findall(r"[A-Za-z_]\w*", token.text))
    return words & known


class _SigAction(ctypes.Structure):
    """glibc's ``struct sigaction`` (the same layout on x86-64 and aarch64)."""

    _fields_ = (
        ("sa_sigaction", ctypes.c_void_p),
        ("sa_mask", ctypes.c_ulong * (128 // ctypes.sizeof(ctypes.c_ulong))),
        ("sa_flags", ctypes.c_int),
        ("sa_restorer", ctypes.c_void_p),
    )


class _DlInfo(ctypes.Structure):
    """glibc's ``Dl_info`` (what ``dladdr`` says about an address)."""

    _fields_ = (
        ("fname", ctypes.c_char_p),
        ("fbase", ctypes.c_void_p),
        ("sname", ctypes.c_char_p),
        ("saddr", ctypes.c_void_p),
    )


_HANDLER = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
_SA_SIGINFO = 4
_KEPT: list = []  # the child's signal handler must outlive the call that installs it


def _catch_crashes(write_fd: int, earlier_names: frozenset[str]) -> None:
    """In the child: on a crash signal, send the stack's offsets into the library, then exit.

    The library's frames are those of the one object opened under a name no load before the
    fork used (``earlier_names``): every load gets a name of its own, and its descriptor is
    closed once it is mapped, so the name is all that tells the new build from older ones.
    """
    libc = ctypes.CDLL(None)
    libc.backtrace.argtypes = (ctypes.c_void_p, ctypes.c_int)
    libc.dladdr.argtypes = (ctypes.c_void_p, ctypes.POINTER(_DlInfo))

    def on_crash(signum: int, info: int, context: int) -> None:
        frames = (ctypes.c_void_p * 64)()
        count = libc.backtrace(frames, 64)
        offsets = []  # into the new library, innermost first
        for address in frames[:count]:
            described = _DlInfo()
            if not address or not libc.dladdr(address, ctypes.byref(described)):
                continue
            name = (described.fname or b"").decode(errors="replace")
            if name.startswith("/proc/") and name not in earlier_names:
                offsets.append(address - described.fbase)
        _send(write_fd, {"crash": signum, "offsets": offsets})
        os._exit(_CRASHED)

    handler = _HANDLER(on_crash)
    _KEPT.append(handler)
    action = _SigAction()
    action.sa_sigaction = ctypes.cast(handler, ctypes.c_void_p)
    action.sa_flags = _SA_SIGINFO
    for signum in _SIGNALS:
        libc.sigaction(signum, ctypes.byref(action), None)


def _send(fd: int, message: dict) -> None:
    """One JSON line to the parent."""
    os.write(fd, (json.dumps(message) + "\n").encode())


# ---------------------------------------------------------------- in the parent


def _in_child(
    work: Callable[[Callable[[dict], None]], None]
) -> tuple[list[dict], int, str]:
    """Run ``work(report)`` in a forked child: its reports, exit status and output."""
    read_fd, write_fd = os.pipe()
    with tempfile.TemporaryFile() as output:
        with warnings.catch_warnings():  # Python 3.12+ warns about forking with threads
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the child: it never returns
            status = 0
            try:
                os.close(read_fd)
                os.dup2(output.fileno(), 1)
                os.dup2(output.fileno(), 2)
                _catch_crashes(write_fd, opened_names())
                work(lambda message: _send(write_fd, message))
            except BaseException as error:  # anything: the parent reports it
                with contextlib.suppress(BaseException):
                    _send(write_fd, {"exception": f"{type(error).__name__}: {error}"})
                status = 3
            finally:
                os._exit(status)
        os.close(write_fd)
        try:
            data = _read_until_closed(read_fd, time.monotonic() + PROBE_TIMEOUT_S)
            _, status = os.waitpid(pid, 0)
        except BaseException:  # the time limit, or Ctrl-C: the child goes too
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise
        finally:
            os.close(read_fd)
        output.seek(0)
        text = output.read().decode(errors="replace")
    messages = [json.loads(line) for line in data.decode(errors="replace").splitlines() if line]
    return messages, os.waitstatus_to_exitcode(status), text


def _read_until_closed(fd: int, deadline: float) -> bytes:
    """Everything written to the pipe ``fd`` until its writer closes it (or the deadline)."""
    chunks: list[bytes] = []
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        ready, _, _ = select.select([fd], [], [], remaining)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


def _failure(trial: _Trial, messages: list[dict], status: int, output: str) -> LoadError:
    """The error for a build that crashed or registered outside its blocks in the child."""
    site, name = trial.site, trial.path.name
    last_step: dict[str, Any] = next(
        (m for m in reversed(messages) if "step" in m), {"step": "start"}
    )
    static = next((m["static"] for m in messages if "static" in m), None)
    if static is not None:
        line = _static_line(static, trial)
        names = ", ".join(sorted(static))
        return LoadError(
            f"{site.where(line)}: {name} registers {names} when it is loaded, outside a "
            "registration block (torch::RegisterOperators, or a torch::Library object of its "
            "own): opmagic could neither remove nor replace that, so nothing was loaded. "
            "Register in blocks instead: TORCH_LIBRARY(ns, m) { m.def(...); } and "
            "TORCH_LIBRARY_IMPL(ns, CPU, m) { m.impl(...); } (STABLE_TORCH_LIBRARY* for the "
            "stable ABI).",
            line=line,
        )
    crash = next((m for m in messages if "crash" in m), None)
    exception = next((m["exception"] for m in messages if "exception" in m), None)
    if crash is not None:
        signum = crash["crash"]
        cause = f"{signal.Signals(signum).name}, {_SIGNALS.get(signum, 'a fatal signal')}"
    elif exception is not None:
        cause = f"the trial failed: {exception}"
    elif status < 0:
        cause = f"it was killed by {signal.Signals(-status).name}"
    else:
        cause = f"it exited with status {status}"
    uncaught = _TERMINATE.search(output)
    if uncaught is not None:
        what = _WHAT_END.split(uncaught["what"] or "", maxsplit=1)[0].strip()
        cause += f"; uncaught {uncaught['type']}" + (f": {what}" if what else "")
    function, line = _crash_site(crash["offsets"] if crash else [], trial)
    if last_step["step"] == "block":
        block_line = last_step["line"]
        when = f"while registering its {last_step['block']} block"
        if line is not None and line != block_line:
            when += f" ({site.where(block_line)})"
        line = line if line is not None else block_line
    elif last_step["step"] == "load":
        when = (
            "while it was loaded, in a static initialiser (a namespace-scope variable's "
            "initialiser or a static object's constructor)"
        )
    else:
        when = "before it was loaded"
    inside = f", in {function}" if function else ""
    kept = f"; {trial.previous.site.label} stays registered" if trial.previous else ""
    return LoadError(
        f"{site.where(line)}: {name} crashed {when}: {cause}{inside}. It was tried in a child "
        f"process, so this one goes on: nothing of this build was loaded{kept}.",
        line=line,
    )


def _static_line(static: dict[str, list[str]], trial: _Trial) -> int | None:
    """The source line of a registration made outside the blocks: its site when torch
    recorded one in the source, else the string literal that names the operator."""
    stem = trial.site.file.name
    for sites in static.values():
        for registered in sites:
            match = re.search(r"(?:^|[/\s])([^/\s:]+):(\d+)$", registered)
            if match and match[1] == stem:
                return int(match[2])
    for qualname in static:
        bare = qualname.split("::", 1)[-1].split(".", 1)[0]
        for token in tokenize(trial.source):
            if token.kind == "string" and re.search(rf"\b{re.escape(bare)}\b", token.text):
                return token.line
    return None


def _crash_site(offsets: list[int], trial: _Trial) -> tuple[str | None, int | None]:
    """The innermost function of the crash stack that the source defines, and its line."""
    functions = _function_names(trial.path, offsets)
    definitions = _definitions(trial.source)
    for function in functions:
        plain = _plain_name(function)
        if _BLOCK_BODY.match(plain):
            return None, None  # the block's body: the block line says more
        if plain in definitions:
            return function, definitions[plain]
    return None, None


def _function_names(path: Path, offsets: list[int]) -> list[str]:
    """The functions at ``offsets`` (innermost first) of the library, as ``addr2line`` names
    them from its symbol table; none without binutils."""
    tool = shutil.which("addr2line")
    if tool is None or not offsets:
        return []
    # the first offset is where the crash was; the others are return addresses, just after
    # the call instruction of their frame
    addresses = [hex(offsets[0])] + [hex(max(o - 1, 0)) for o in offsets[1:]]
    result = subprocess.run(
        [tool, "-f", "-C", "-e", str(path), *addresses],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    return [line for line in result.stdout.splitlines()[::2] if line and line != "??"]


def _plain_name(function: str) -> str:
    """``foo`` of ``ns::foo(int) const`` or of ``foo()::{lambda()#1}::operator()() const``."""
    function = function.split("::{lambda", 1)[0]
    depth, cut = 0, len(function)
    for index, char in enumerate(function):  # drop the parameters (and template arguments)
        if char in "<(":
            if depth == 0 and char == "(":
                cut = index
                break
            depth += 1
        elif char in ">)":
            depth -= 1
    name = re.sub(r"<.*>", "", function[:cut])
    return name.rsplit("::", 1)[-1].strip()


def _definitions(source: str) -> dict[str, int]:
    """The line of each function the source defines (``name(...) ... {``), first one wins."""
    tokens = tokenize(source)
    found: dict[str, int] = {}
    for index, token in enumerate(tokens[:-1]):
        if token.kind != "id" or tokens[index + 1].text != "(" or token.text in found:
            continue
        depth, position = 0, index + 1
        while position < len(tokens):
            text = tokens[position].text
            depth += text == "("
            depth -= text == ")"
            position += 1
            if depth == 0:
                break
        for follower in tokens[position : position + 12]:
            if follower.text in ("{", ":"):
                found[token.text] = token.line
                break
            if follower.text in (";", ",", ")", "=", "}"):
                break
    return found
