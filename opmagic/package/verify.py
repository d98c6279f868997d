"""Proving an exported package: build its wheel, install it where opmagic is not importable,
run its generated tests there, and audit its stable-ABI libraries.

Steps (each timed; a failure keeps the end of its log and stops the later steps):

1. **build the wheel**: ``pip wheel --no-build-isolation --no-deps --no-index`` on a copy of
   the directory, with this interpreter (and its torch); the wheel is kept in ``DIR/dist``;
2. **fresh environment**: ``python -m venv --system-site-packages --without-pip``, which sees
   torch (and pip, pytest) but imports nothing of the package's source tree; a ``.pth`` file
   there makes ``import opmagic`` fail (a meta path finder ahead of every other);
3. **install** the wheel there (``pip install --no-index --no-deps``);
4. **without opmagic**: in that environment ``import opmagic`` fails and ``import NAME``
   loads the installed package;
5. **stable ABI** (stable-ABI libraries only): the library's undefined symbols, read with
   ``nm``, that torch's libraries define must be the stable C shim's (``aoti_torch_*``,
   ``torch_*``); a classic ``at::``/``c10::``/``torch::`` symbol would break on the next torch;
6. **tests**: the generated tests, copied out of the source tree, run there by pytest in a
   fresh process (no plugins but pytest's own).

Nothing is downloaded: pip runs with ``--no-index``, ``setuptools`` and ``wheel`` come from this
interpreter.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import ExportError
from .result import Verification, VerifyStep

ProgressCallback = Callable[[str], None]
STEP_TIMEOUT_S = 1800  # a step that takes longer fails (a cold C++ build on a loaded machine)
LOG_LINES = 40  # lines of a failed step's output that its result keeps
# the finder a .pth file installs in the fresh environment: `import opmagic` fails there
BLOCKER_MODULE = "_opmagic_blocked"
_BLOCKER = '''"""Makes `import opmagic` fail: this environment checks a package works without it."""
import sys


class _NoOpmagic:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "opmagic" or name.startswith("opmagic."):
            raise ModuleNotFoundError(
                f"No module named {name!r} (opmagic is blocked here)", name=name
            )
        return None


sys.meta_path.insert(0, _NoOpmagic)
'''
_CHECK_ISOLATION = """
import json, sys
try:
    import opmagic
except ModuleNotFoundError:
    blocked = True
else:
    blocked = False
import {name}
print(json.dumps({{"blocked": blocked, "file": {name}.__file__,
                  "loaded": list(getattr({name}, "LOADED", ()))}}))
"""
_SHIM_PREFIXES = ("aoti_torch_", "torch_")
_CLASSIC_NAMESPACES = ("at::", "c10::", "caffe2::", "torch::")
_HEADER_ONLY_NAMESPACES = ("torch::stable::", "torch::headeronly::")
# the C++ runtime's: torch's libraries export copies of some (template instances), but the
# library would find them in libstdc++ just the same
_RUNTIME = ("std::", "__gnu_cxx::", "__cxxabiv1::", "operator new", "operator delete")
_SPECIAL = ("typeinfo name for ", "typeinfo for ", "vtable for ", "VTT for ", "guard variable for ")


@dataclass
class _Run:
    """A finished command: exit status, output (stdout and stderr), wall time."""

    returncode: int
    output: str
    seconds: float


def verify_package(directory: str | os.PathLike, progress: ProgressCallback | None = None) -> (
    Verification
):
    """Build, install and test the package opmagic exported to ``directory`` (see the module
    docstring); ``progress`` is told each step as it starts."""
    directory = Path(directory)
    manifest = _manifest(directory)
    name = manifest["package"]
    steps: list[VerifyStep] = []
    wheel = ""
    work = Path(tempfile.mkdtemp(prefix="opmagic-verify-"))
    say = progress or (lambda _: None)
    try:
        say("verify: building the wheel")
        step, built = _build(directory, work)
        steps.append(step)
        if built is None:
            return Verification(directory, name, wheel, tuple(steps))
        wheel = built.name
        (directory / "dist").mkdir(exist_ok=True)
        shutil.copy2(built, directory / "dist" / built.name)
        say("verify: making a fresh environment")
        venv = work / "venv"
        step, python = fresh_environment(venv)
        steps.append(step)
        stable = [lib for lib in manifest.get("libraries", ()) if lib.get("stable")]
        actions = [
            ("verify: installing the wheel", lambda: _install(python, built)),
            ("verify: importing it without opmagic", lambda: _isolation(python, name, work)),
        ]
        if stable:  # cheap, and a failure makes the tests moot
            actions.append(
                ("verify: auditing the stable-ABI libraries", lambda: _audit(python, name, stable))
            )
        actions.append(
            ("verify: running the generated tests", lambda: _tests(python, directory, work))
        )
        for title, action in actions:
            if steps[-1].status == "FAIL":
                break
            say(title)
            steps.append(action())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return Verification(directory, name, wheel, tuple(steps))


def _manifest(directory: Path) -> dict:
    """The export's ops.json; an error when ``directory`` is not an export."""
    try:
        manifest = json.loads((directory / "ops.json").read_text())
    except (OSError, ValueError) as error:
        raise ExportError(
            f"{directory} is not a package opmagic exported (its ops.json cannot be read: "
            f"{error}); export one with opmagic.export(directory, name)."
        ) from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("package"), str):
        raise ExportError(f"{directory}/ops.json does not name the package: export it again.")
    return manifest


def _clean_environment(**extra: str) -> dict[str, str]:
    """This process's environment without what would make children import the notebook's
    modules (``PYTHONPATH``, the user site) or ask an index for packages."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTEST_ADDOPTS")
        and not key.startswith("PIP_")
    }
    env.update(
        PYTHONNOUSERSITE="1",
        PIP_NO_INDEX="1",
        PIP_NO_INPUT="1",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_CONFIG_FILE=os.devnull,
        **extra,
    )
    return env


def _run(command: list[str], cwd: Path, **extra: str) -> _Run:
    """Run a command, its output (stdout and stderr together) captured."""
    started = time.perf_counter()
    try:
        done = subprocess.run(
            command,
            cwd=cwd,
            env=_clean_environment(**extra),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            timeout=STEP_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as error:
        output = error.stdout if isinstance(error.stdout, str) else ""
        return _Run(-1, f"{output}\n(timed out after {STEP_TIMEOUT_S} s)", STEP_TIMEOUT_S)
    except OSError as error:
        return _Run(-1, f"{command[0]} could not run: {error}", time.perf_counter() - started)
    return _Run(done.returncode, done.stdout, time.perf_counter() - started)


def _excerpt(output: str) -> str:
    """The last :data:`LOG_LINES` lines of a step's output."""
    return "\n".join(output.rstrip().splitlines()[-LOG_LINES:])


def _failed(name: str, run: _Run, detail: str) -> VerifyStep:
    """A failed step, with its log's end."""
    return VerifyStep(name, "FAIL", run.seconds, detail, _excerpt(run.output))


def _build(directory: Path, work: Path) -> tuple[VerifyStep, Path | None]:
    """The wheel of a copy of ``directory`` (so the export stays as it was written)."""
    source, dist = work / "source", work / "dist"
    shutil.copytree(
        directory,
        source,
        ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__"),
    )
    run = _run(
        [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps",
         "--no-index", "-w", str(dist), str(source)],
        cwd=work,
    )
    wheels = sorted(dist.glob("*.whl")) if dist.is_dir() else []
    if run.returncode != 0 or not wheels:
        return _failed("build the wheel", run, "pip wheel failed"), None
    return VerifyStep("build the wheel", "pass", run.seconds, wheels[0].name), wheels[0]


def fresh_environment(venv: Path) -> tuple[VerifyStep, Path]:
    """A virtual environment at ``venv`` that sees this interpreter's packages (torch, pip,
    pytest) but where ``import opmagic`` fails, and its Python."""
    name = "fresh environment"
    run = _run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
        cwd=venv.parent,
    )
    python = venv / "bin" / "python"
    if run.returncode != 0:
        return _failed(name, run, "python -m venv failed"), python
    located = _run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        cwd=venv.parent,
    )
    site_packages = Path(located.output.strip().splitlines()[-1])
    (site_packages / f"{BLOCKER_MODULE}.py").write_text(_BLOCKER)
    # .pth files run in order of their names: this one comes before any that imports opmagic
    (site_packages / f"00{BLOCKER_MODULE}.pth").write_text(f"import {BLOCKER_MODULE}\n")
    if sys.prefix != sys.base_prefix:  # this interpreter is a venv: see its packages too
        paths = dict.fromkeys(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))
        (site_packages / "zz_parent_environment.pth").write_text("\n".join(paths) + "\n")
    seconds = run.seconds + located.seconds
    detail = f"a venv seeing torch {torch.__version__}, opmagic blocked"
    return VerifyStep(name, "pass", seconds, detail), python


def _install(python: Path, wheel: Path) -> VerifyStep:
    """The wheel installed into the fresh environment."""
    run = _run(
        [str(python), "-m", "pip", "install", "--no-index", "--no-deps", "--no-build-isolation",
         str(wheel)],
        cwd=wheel.parent,
    )
    if run.returncode != 0:
        return _failed("install", run, "pip install failed")
    return VerifyStep("install", "pass", run.seconds, f"pip install {wheel.name}")


def _isolation(python: Path, name: str, work: Path) -> VerifyStep:
    """In the fresh environment opmagic does not import, and the package imports from it."""
    step = "without opmagic"
    run = _run([str(python), "-c", _CHECK_ISOLATION.format(name=name)], cwd=work)
    try:
        found = json.loads(run.output.strip().splitlines()[-1])
    except (ValueError, IndexError):
        found = None
    if run.returncode != 0 or not isinstance(found, dict):
        return _failed(step, run, f"import {name} failed")
    if not found["blocked"]:
        return _failed(step, run, "opmagic is importable in the fresh environment")
    if not Path(found["file"]).is_relative_to(python.parent.parent):
        return _failed(step, run, f"{name} was imported from {found['file']}, not the wheel")
    loaded = ", ".join(found["loaded"]) or "no compiled library"
    detail = f"import opmagic fails; import {name} works (loaded: {loaded})"
    return VerifyStep(step, "pass", run.seconds, detail)


def _tests(python: Path, directory: Path, work: Path) -> VerifyStep:
    """The generated tests, run by pytest in the fresh environment, away from the sources."""
    run_dir = work / "run"
    shutil.copytree(directory / "tests", run_dir / "tests")
    shutil.copy2(directory / "ops.json", run_dir / "ops.json")
    run = _run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=run_dir,
        PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
    )
    summary = run.output.strip().splitlines()[-1] if run.output.strip() else ""
    summary = summary.strip("= ")
    if run.returncode != 0:
        return _failed("tests", run, summary or "pytest failed")
    return VerifyStep("tests", "pass", run.seconds, summary)


def _audit(python: Path, name: str, libraries: list[dict]) -> VerifyStep:
    """The stable-ABI libraries use no torch symbol but the stable C shim's."""
    step = "stable ABI"
    started = time.perf_counter()
    if shutil.which("nm") is None:
        return VerifyStep(step, "skip", 0.0, "nm is not installed (binutils): not audited")
    located = _run([str(python), "-c", f"import {name}; print({name}.__file__)"], cwd=python.parent)
    package = Path(located.output.strip().splitlines()[-1]).parent
    torch_symbols = _defined_symbols(sorted((Path(torch.__file__).parent / "lib").glob("lib*.so")))
    findings, audited = [], []
    for library in libraries:
        files = sorted(package.glob(f"{library['module']}.*so"))
        if not files:
            continue
        audited.append(files[0].name)
        undefined = _undefined_symbols(files[0])
        classic = classic_symbols(undefined, torch_symbols)
        if classic:
            more = f" and {len(classic) - 8} more" if len(classic) > 8 else ""
            findings.append(f"{files[0].name} (cell {library['cell']}): "
                            f"{', '.join(classic[:8])}{more}")
    seconds = time.perf_counter() - started
    if findings:
        detail = ("uses torch's C++ ABI, not only the stable C shim: the wheel would break with "
                  "another torch")
        return VerifyStep(step, "FAIL", seconds, detail, "\n".join(findings))
    if not audited:
        return VerifyStep(step, "skip", seconds, "no stable-ABI library in this build")
    detail = (f"{', '.join(audited)}: every torch symbol it uses is the stable C shim's "
              "(aoti_torch_*, torch_*)")
    return VerifyStep(step, "pass", seconds, detail)


def _nm(arguments: list[str]) -> list[str]:
    """Symbol names ``nm`` prints for ``arguments`` (versions like ``@GLIBC_2.2.5`` dropped)."""
    done = subprocess.run(["nm", *arguments], capture_output=True, text=True, check=False)
    names = []
    for line in done.stdout.splitlines():
        parts = line.split()
        if parts and not line.endswith(":"):
            names.append(parts[-1].split("@")[0])
    return names


def _undefined_symbols(library: Path) -> list[str]:
    """The dynamic symbols a shared library needs from others."""
    return _nm(["-D", "--undefined-only", str(library)])


def _defined_symbols(libraries: list[Path]) -> frozenset[str]:
    """The dynamic symbols some shared libraries define."""
    return frozenset(_nm(["-D", "--defined-only", *map(str, libraries)])) if libraries else (
        frozenset()
    )


def classic_symbols(undefined: list[str], torch_symbols: frozenset[str]) -> list[str]:
    """The symbols of ``undefined`` that tie a library to one torch: defined by torch's
    libraries but not the stable C shim's, or in torch's C++ namespaces; demangled."""
    shim = {name for name in undefined if name.startswith(_SHIM_PREFIXES)}
    demangled = _demangled([name for name in undefined if name not in shim])
    found = []
    for name, readable in demangled.items():
        plain = next((readable[len(p) :] for p in _SPECIAL if readable.startswith(p)), readable)
        in_namespace = plain.startswith(_CLASSIC_NAMESPACES) and not plain.startswith(
            _HEADER_ONLY_NAMESPACES
        )
        from_torch = name in torch_symbols and not plain.startswith(_RUNTIME)
        if from_torch or in_namespace:
            found.append(readable)
    return sorted(found)


def _demangled(names: list[str]) -> dict[str, str]:
    """C++ names as people read them (``c++filt``; the names themselves without it)."""
    if not names or shutil.which("c++filt") is None:
        return {name: name for name in names}
    done = subprocess.run(
        ["c++filt"], input="\n".join(names), capture_output=True, text=True, check=False
    )
    readable = done.stdout.splitlines()
    return dict(zip(names, readable, strict=False)) if len(readable) == len(names) else {
        name: name for name in names
    }
