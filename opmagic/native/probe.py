"""Trying a new build in a child process before this process loads it: no C++ cell can end it.

Loading a library runs its static initialisers (inside ``dlopen``) and registering runs its
blocks: C++ that may crash (a null dereference), throw where nothing catches it
(``std::terminate``), never return, register operators where opmagic cannot undo them
(``torch::RegisterOperators``, a ``torch::Library`` object of its own, in the source or in a
header it includes, for any namespace), or leave something running that strikes later (a
thread, a timer). :func:`probe` forks this process (the child has the same dispatcher, so it
meets the same duplicates), and in the child unregisters the version the build replaces,
loads the build, registers its blocks one at a time and unregisters them, telling the parent
each step on a pipe. Then it compares the whole dispatcher (every operator of every
namespace) with what it was before the load, looks for threads and timers the library left
running, and runs the library's exit-time code (its static objects' destructors and
``atexit`` handlers, as ``exit()`` will: a joinable ``std::thread`` ends the process there).
A crash is caught in the child, whose signal handler sends the native stack, so the parent
says what happened and where, and never loads the build. A child that does not finish within
:func:`load_time_limit` seconds (``OPMAGIC_LOAD_TIMEOUT``, default 30) is asked for its stack
and killed: the build hangs.

A build that passed is recorded (``probe.json`` beside it in the cache): loading it again, in
this process or a later one, skips the probe (a fork, ~0.1 s, and two readings of the whole
dispatcher, ~0.3 s each on a 2-core VM). Each process that loads a build leaves a marker
beside it (``loads/``) that it removes when it exits normally; a marker whose process is gone
means that process crashed or was killed with the build loaded: that is remembered
(``crashes.json``), and every later load of the build tries it in a child again and says so.
"""

from __future__ import annotations

import atexit
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
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..cachedir import opened_names, read_json_file, write_atomic
from ..dispatch.sites import label_location, parse_site
from ..display import format_duration
from ..errors import BuildOptionError, LoadError
from .loader import NativeLibrary
from .registration import Registration, SourceSite
from .snapshots import registrations_left, whole_dispatcher
from .tokens import function_definitions, plain_function_name, tokenize

PROBE_FILE = "probe.json"  # beside the library: it loaded and registered cleanly in a child
LOADS_DIRECTORY = "loads"  # beside the library: a marker per process that has it loaded
CRASHES_FILE = "crashes.json"  # beside the library: processes that ended with it loaded
LOAD_TIMEOUT_VARIABLE = "OPMAGIC_LOAD_TIMEOUT"
DEFAULT_LOAD_TIMEOUT_S = 30.0
SETTLE_S = 0.2  # how long threads the library started may take to end before they count
STACK_WAIT_S = 2.0  # how long a child may take to send stacks once it was asked for them
_CRASHED = 70  # the child's exit status after its signal handler reported a crash
_HUNG = 71  # the child's exit status after it sent its main thread's stack on request
_STACK_SIGNAL = signal.SIGUSR2  # asks a thread of the child for its stack
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
_TERMINATE_BARE = "terminate called without an active exception"
_LAMBDA_OWNER = re.compile(r"(\w+)\([^()]*\)(?: const)?::\{lambda")  # f(int)::{lambda
_WHAT_END = re.compile(r"\nException raised from |\n\s*frame #")
_STEPS = {
    "start": "before it was loaded",
    "load": "while it was loaded, in a static initialiser (a namespace-scope variable's "
    "initialiser or a static object's constructor)",
    "exit": "when its static objects were destroyed and its atexit handlers ran (as they are "
    "when this process exits)",
}


@dataclass(frozen=True)
class _Trial:
    """What the child tries: the build, its registration site, the version it replaces."""

    path: Path
    site: SourceSite
    previous: Registration | None
    source: str


def load_time_limit() -> float:
    """Seconds a build may take to load, register, unregister and run its exit-time code in
    the probe's child: ``$OPMAGIC_LOAD_TIMEOUT``, else :data:`DEFAULT_LOAD_TIMEOUT_S`."""
    text = os.environ.get(LOAD_TIMEOUT_VARIABLE, "").strip()
    if not text:
        return DEFAULT_LOAD_TIMEOUT_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise BuildOptionError(
            f"{LOAD_TIMEOUT_VARIABLE} is {text!r}: set it to the number of seconds a build may "
            f"take to load (a positive number; {DEFAULT_LOAD_TIMEOUT_S:g} when unset)."
        )
    return seconds


def probe(
    path: Path, site: SourceSite, previous: Registration | None, source: str
) -> tuple[str, ...]:
    """Raise :class:`LoadError` unless the library at ``path`` loads, registers, unregisters
    and runs its exit-time code in a child process without crashing or hanging, leaving
    nothing registered and nothing running; returns notes for the user (processes that ended
    abnormally with this build loaded: it is tried again then, whatever ``probe.json`` says).

    ``previous``: the registration the library replaces (the child unregisters it first, as
    this process will). Registration errors torch reports are not the probe's business: this
    process meets them again and reports them with the previous version restored.
    """
    directory = path.parent
    notes = _earlier_crashes(directory)
    record = directory / PROBE_FILE
    if record.is_file() and not notes:
        return ()
    limit = load_time_limit()
    trial = _Trial(path, site, previous, source)
    messages, status, output = _in_child(functools.partial(_try, trial), limit)
    if messages and messages[-1].get("done"):
        with contextlib.suppress(OSError):  # a read-only cache: probe again next time
            write_atomic(record, json.dumps({"loads": True}))
        return notes
    raise _failure(trial, messages, status, output, limit)


# ---------------------------------------------------------------- processes that had it loaded

_MARKED: list[tuple[Path, str]] = []  # (build directory, marker) this process left


def mark_loaded(directory: Path) -> None:
    """Leave this process's marker beside the build in ``directory`` (it is being loaded); it
    goes when the process exits normally. Never raises: a read-only cache remembers nothing."""
    marker = (directory, _process_identity(os.getpid()))
    if marker in _MARKED:
        return
    with _loads_directory(directory, create=True) as fd:
        if fd is None:
            return
        with contextlib.suppress(OSError):
            flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            os.close(os.open(marker[1], flags, 0o600, dir_fd=fd))
            if not _MARKED:
                atexit.register(_remove_markers)
            _MARKED.append(marker)


def _remove_markers() -> None:
    """At a normal exit: this process had its builds loaded and did not crash."""
    for directory, name in _MARKED:
        with _loads_directory(directory, create=False) as fd, contextlib.suppress(OSError):
            if fd is not None:
                os.unlink(name, dir_fd=fd)


@contextlib.contextmanager
def _loads_directory(directory: Path, *, create: bool) -> Iterator[int | None]:
    """A descriptor of the build's :data:`LOADS_DIRECTORY` (None when there is none, or
    something else is there: a symlink planted in the cache is never followed)."""
    path = directory / LOADS_DIRECTORY
    if create:
        with contextlib.suppress(OSError):
            os.mkdir(path, 0o700)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        yield None
        return
    try:
        yield fd
    finally:
        os.close(fd)


def _earlier_crashes(directory: Path) -> tuple[str, ...]:
    """What the cache remembers of processes that ended abnormally with this build loaded,
    as notes; markers of such processes found now are remembered first."""
    path = directory / CRASHES_FILE
    crashes = [
        crash
        for crash in read_json_file(path, list) or []
        if isinstance(crash, dict) and isinstance(crash.get("pid"), int)
    ]
    own, boot, found = {name for _, name in _MARKED}, _boot_id(), False
    with _loads_directory(directory, create=False) as fd, contextlib.suppress(OSError):
        for name in os.listdir(fd) if fd is not None else []:
            booted, _, rest = name.partition("-")
            pid = rest.partition("-")[0]
            if name in own or (
                booted == boot and pid.isdigit() and _process_identity(int(pid)) == name
            ):
                continue  # running now
            if booted == boot and pid.isdigit():  # not a reboot (nor another machine's)
                crashes.append({"pid": int(pid), "noticed": time.strftime("%Y-%m-%d %H:%M")})
                found = True
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=fd)
    if found:
        with contextlib.suppress(OSError):
            write_atomic(path, json.dumps(crashes))
    if not crashes:
        return ()
    pids = ", ".join(str(crash["pid"]) for crash in crashes[-3:])
    count = f"{len(crashes)} processes" if len(crashes) > 1 else "a process"
    return (
        f"this build was loaded in {count} (pid {pids}, noticed {crashes[-1].get('noticed')}) "
        "that ended without exiting normally: it crashed or was killed. It was tried in a child "
        "process again before this load; if this process dies too, rebuild with force=True "
        "after fixing the C++ (a thread or an exit-time destructor that crashes, memory "
        "corruption).",
    )


def _process_identity(pid: int) -> str:
    """``BOOT-PID-START``: a process, never confused with a later one of the same pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        start = stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        start = "gone"
    return f"{_boot_id()}-{pid}-{start}"


@functools.cache
def _boot_id() -> str:
    """This boot of the machine (a reboot ends every process without a crash)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")
    except OSError:
        return "unknown"


# ---------------------------------------------------------------- in the child


def _try(trial: _Trial, report: Callable[[dict], None]) -> None:
    """The child's work: unregister the replaced version, load, register block by block,
    unregister, compare the whole dispatcher, look for what is left running, run the
    library's exit-time code."""
    if trial.previous is not None and trial.previous.active:
        trial.previous.native.fini()
    threads, timers = _threads(), _timers()
    before = whole_dispatcher()
    report({"step": "load"})
    try:
        native = NativeLibrary(trial.path)
    except LoadError:
        report({"done": True})  # this process raises the same LoadError when it loads it
        return
    for index, block in enumerate(native.blocks):
        report({"step": "block", "block": str(block), "line": block.line})
        if native.init(str(trial.site.file), index + 1) is not None:
            break  # torch's error: this process reports it (with the previous version back)
    native.fini()
    report({"step": "compare"})
    left = registrations_left(before, whole_dispatcher())
    if left:
        report({"static": left})
        return
    running = _left_running(threads, timers)
    if running["threads"] or running["timers"]:
        report({"running": running})
        for tid in running["threads"]:  # each sends its stack (see _catch_crashes)
            _signal_thread(os.getpid(), int(tid), _STACK_SIGNAL)
        time.sleep(0.5)
        return
    report({"step": "exit"})
    native.run_exit_handlers()
    report({"done": True})


def _threads() -> dict[str, str]:
    """This process's threads: thread id -> name (``comm``)."""
    names = {}
    with contextlib.suppress(OSError):
        for task in os.scandir("/proc/self/task"):
            with contextlib.suppress(OSError):
                names[task.name] = Path(task.path, "comm").read_text().strip()
    return names


def _timers() -> list[str]:
    """Timers armed in this process that will send it a signal: ``alarm``/``setitimer`` and
    POSIX timers (``timer_create``)."""
    armed = []
    for which, name in (
        (signal.ITIMER_REAL, "SIGALRM"),
        (signal.ITIMER_VIRTUAL, "SIGVTALRM"),
        (signal.ITIMER_PROF, "SIGPROF"),
    ):
        delay, interval = signal.getitimer(which)
        if delay or interval:
            armed.append(f"a timer that sends {name} in {format_duration(delay)}")
    with contextlib.suppress(OSError):
        count = Path("/proc/self/timers").read_text().count("ID:")
        armed += ["a POSIX timer (timer_create)"] * count
    return armed


def _left_running(threads: dict[str, str], timers: list[str]) -> dict:
    """Threads started since ``threads`` that are still running after :data:`SETTLE_S`, and
    timers armed since ``timers``."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        new = {tid: name for tid, name in _threads().items() if tid not in threads}
        if not new or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    return {"threads": new, "timers": _timers()[len(timers) :]}


def _signal_thread(pid: int, tid: int, signum: int) -> None:
    """Send ``signum`` to one thread of process ``pid`` (``tgkill``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        libc.tgkill(pid, tid, signum)
    except AttributeError:  # a C library without tgkill: the process picks the thread
        os.kill(pid, signum)


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
_KEPT: list = []  # the child's signal handlers must outlive the call that installs them


def _catch_crashes(write_fd: int, earlier_names: frozenset[str]) -> None:
    """In the child: on a crash signal, send the stack's offsets into the library, then exit;
    on :data:`_STACK_SIGNAL`, send the stack of the thread it reached (and exit if that is
    the main thread: the parent asks it of a child that hangs).

    The library's frames are those of the one object opened under a name no load before the
    fork used (``earlier_names``): every load gets a name of its own, and its descriptor is
    closed once it is mapped, so the name is all that tells the new build from older ones.
    """
    libc = ctypes.CDLL(None)
    libc.backtrace.argtypes = (ctypes.c_void_p, ctypes.c_int)
    libc.dladdr.argtypes = (ctypes.c_void_p, ctypes.POINTER(_DlInfo))

    def offsets_into_library() -> list[int]:
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
        return offsets

    def on_crash(signum: int, info: int, context: int) -> None:
        _send(write_fd, {"crash": signum, "offsets": offsets_into_library()})
        os._exit(_CRASHED)

    def on_stack_request(signum: int, info: int, context: int) -> None:
        thread = threading.get_native_id()
        _send(write_fd, {"stack": thread, "offsets": offsets_into_library()})
        if thread == os.getpid():
            os._exit(_HUNG)

    for handler, signums in ((on_crash, list(_SIGNALS)), (on_stack_request, [_STACK_SIGNAL])):
        kept = _HANDLER(handler)
        _KEPT.append(kept)
        action = _SigAction()
        action.sa_sigaction = ctypes.cast(kept, ctypes.c_void_p)
        action.sa_flags = _SA_SIGINFO
        for signum in signums:
            libc.sigaction(signum, ctypes.byref(action), None)


def _send(fd: int, message: dict) -> None:
    """One JSON line to the parent."""
    os.write(fd, (json.dumps(message) + "\n").encode())


# ---------------------------------------------------------------- in the parent


def _in_child(
    work: Callable[[Callable[[dict], None]], None], limit: float
) -> tuple[list[dict], int, str]:
    """Run ``work(report)`` in a forked child: its reports, exit status and output. A child
    still running after ``limit`` seconds is asked for its main thread's stack and killed
    (its reports then end with ``{"hang": limit}``)."""
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
            data, finished = _read_until_closed(read_fd, time.monotonic() + limit)
            if not finished:  # it hangs: its stack, then it goes
                _signal_thread(pid, pid, _STACK_SIGNAL)
                more, _ = _read_until_closed(read_fd, time.monotonic() + STACK_WAIT_S)
                data += more + (json.dumps({"hang": limit}) + "\n").encode()
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
        except BaseException:  # Ctrl-C: the child goes too
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise
        finally:
            os.close(read_fd)
        output.seek(0)
        text = output.read().decode(errors="replace")
    lines = data.decode(errors="replace").splitlines()
    messages = []
    for line in lines:
        with contextlib.suppress(ValueError):  # a line cut short by the kill
            messages.append(json.loads(line))
    return messages, os.waitstatus_to_exitcode(status), text


def _read_until_closed(fd: int, deadline: float) -> tuple[bytes, bool]:
    """Everything written to the pipe ``fd`` until its writer closes it or the deadline
    passes, and whether it was closed. A report of threads left running shortens the
    deadline to :data:`STACK_WAIT_S` (their stacks come next, then the child exits)."""
    chunks: list[bytes] = []
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return b"".join(chunks), False
        ready, _, _ = select.select([fd], [], [], remaining)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                return b"".join(chunks), True
            chunks.append(chunk)
            if b'{"running"' in chunk:
                deadline = min(deadline, time.monotonic() + STACK_WAIT_S)


def _failure(
    trial: _Trial, messages: list[dict], status: int, output: str, limit: float
) -> LoadError:
    """The error for a build that crashed, hung, registered where opmagic cannot undo it or
    left something running, in the child."""
    site, name = trial.site, trial.path.name
    last_step: dict[str, Any] = next(
        (m for m in reversed(messages) if "step" in m), {"step": "start"}
    )
    static = next((m["static"] for m in messages if "static" in m), None)
    if static is not None:
        return _left_registered(trial, static)
    running = next((m["running"] for m in messages if "running" in m), None)
    stacks = {str(m["stack"]): m["offsets"] for m in messages if "stack" in m}
    if running is not None:
        return _left_running_error(trial, running, stacks)
    hang = next((m["hang"] for m in messages if "hang" in m), None)
    crash = next((m for m in messages if "crash" in m), None)
    exception = next((m["exception"] for m in messages if "exception" in m), None)
    # the crashing thread's stack, or the hanging main thread's (sent on request)
    offsets = crash["offsets"] if crash else next(iter(stacks.values()), [])
    function, line = _crash_site(offsets, trial)
    if last_step["step"] == "block":
        block_line = last_step["line"]
        when = f"while registering its {last_step['block']} block"
        if line is not None and line != block_line:
            when += f" ({site.where(block_line)})"
        line = line if line is not None else block_line
    else:
        when = _STEPS.get(last_step["step"], "after its blocks were unregistered")
    inside = f", in {function}" if function else ""
    kept = f"; {trial.previous.site.label} stays registered" if trial.previous else ""
    if hang is not None:
        return LoadError(
            f"{site.where(line)}: {name} did not finish {when} within {hang:g} s{inside}: it "
            f"hangs (if it only needs longer, set {LOAD_TIMEOUT_VARIABLE} to more seconds). It "
            "was tried in a child process, which was killed, so this one goes on: nothing of "
            f"this build was loaded{kept}.",
            line=line,
        )
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
    elif _TERMINATE_BARE in output:
        cause += (
            "; std::terminate without an exception (e.g. a std::thread destroyed while still "
            "joinable)"
        )
    return LoadError(
        f"{site.where(line)}: {name} crashed {when}: {cause}{inside}. It was tried in a child "
        f"process, so this one goes on: nothing of this build was loaded{kept}.",
        line=line,
    )


def _left_registered(trial: _Trial, static: dict[str, list[str]]) -> LoadError:
    """The error for registrations that stayed after the library's blocks were unregistered."""
    line = _static_line(static, trial)
    names = ", ".join(sorted(static))
    located = {
        site for found in static.values() for s in found if (site := parse_site(s)) is not None
    }
    source = trial.site.file.name  # torch::Library's __FILE__: the source as compiled
    elsewhere = sorted(label_location(*s) for s in located if Path(s[0]).name != source)
    where = f" (at {'; '.join(elsewhere[:3])})" if elsewhere else ""
    return LoadError(
        f"{trial.site.where(line)}: {trial.path.name} registers {names}{where} outside its "
        "registration blocks (when it is loaded, or through torch::RegisterOperators or a "
        "torch::Library object of its own, in the source or a header it includes): opmagic "
        "could neither remove nor replace that, so nothing was loaded. Register in blocks "
        "instead: TORCH_LIBRARY(ns, m) { m.def(...); } and TORCH_LIBRARY_IMPL(ns, CPU, m) "
        "{ m.impl(...); } (STABLE_TORCH_LIBRARY* for the stable ABI).",
        line=line,
    )


def _left_running_error(trial: _Trial, running: dict, stacks: dict[str, list[int]]) -> LoadError:
    """The error for threads or timers the library left running."""
    threads = running["threads"]
    function, line = None, None
    for tid in threads:
        function, line = _crash_site(stacks.get(tid, []), trial)
        if function is not None:
            break
    what = []
    if threads:
        names = ", ".join(sorted({f"'{n}'" for n in threads.values()}))
        what.append(f"{len(threads)} thread{'s' if len(threads) > 1 else ''} (named {names})")
    what += running["timers"]
    inside = f", in {function}" if function else ""
    return LoadError(
        f"{trial.site.where(line)}: {trial.path.name} leaves {' and '.join(what)} running "
        f"once it is loaded, registered and unregistered{inside}: that would go on running its "
        "code after the cell is re-run or unloaded, and end this process if it crashed. It was "
        "tried in a child process: nothing of this build was loaded. Start threads and timers "
        "in a kernel and stop them (join the threads) before it returns.",
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
    definitions = function_definitions(trial.source)
    for function in functions:
        plain = plain_function_name(function)
        if _BLOCK_BODY.match(plain):
            return None, None  # the block's body: the block line says more
        # the function, or one whose lambda it runs (std::thread's _M_run of start()'s lambda)
        for name in (plain, *_LAMBDA_OWNER.findall(function)):
            if name in definitions:
                return (function if name == plain else f"{name}()'s lambda"), definitions[name]
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
