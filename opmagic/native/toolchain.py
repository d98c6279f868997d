"""The compiler, torch's headers and libraries, and the flags a build uses.

Found once per process (``$CXX``, else ``c++``/``g++`` on ``PATH``); every problem becomes one
:class:`~opmagic.errors.ToolchainError` that names what to install.
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

from ..cachedir import compiler_environment
from ..errors import CompilerNotFoundError, MissingHeadersError, ToolchainError

INSTALL_COMPILER = (
    "install a C++ compiler: apt-get install g++ (Debian/Ubuntu), dnf install gcc-c++ "
    "(Fedora/RHEL), or conda install -c conda-forge gxx_linux-64; or point $CXX at one"
)
INSTALL_PYTHON_HEADERS = (
    "install the Python development headers: apt-get install python3-dev (Debian/Ubuntu), "
    "dnf install python3-devel (Fedora/RHEL); conda and pyenv Pythons include them"
)
TORCH_LIBRARIES = ("c10", "torch_cpu", "torch", "torch_python")


@dataclass(frozen=True)
class Toolchain:
    """A working C++ compiler plus the torch and Python paths a build compiles against."""

    compiler: tuple[str, ...]  # the command, e.g. ("/usr/bin/c++",) or ("g++-12",) from $CXX
    version: str  # compiler version and target, part of every cache key
    is_gcc: bool  # precompiled headers are used with GCC only
    # ccache to prefix compiles with, when $CXX names it ("ccache g++"): not by default, since
    # on a miss it costs ~15% of a compile (preprocessing, hashing the precompiled header) and
    # opmagic's own cache already serves every source built before
    ccache: str | None
    linker: str | None  # -fuse-ld= of the fastest linker installed (None: the default ld.bfd)
    torch_includes: tuple[str, ...]
    python_include: str
    torch_lib: str
    # the process's libstdc++.so.6, linked by path when the compiler finds no shared libstdc++
    # of its own (else it would link its static libstdc++.a into the library, beside the
    # process's: a crash at the first iostream use)
    libstdcxx: str | None = None

    @property
    def system_includes(self) -> tuple[str, ...]:
        """Include directories that hold torch's and Python's headers (never the user's)."""
        return (*self.torch_includes, self.python_include)

    @property
    def abi_flag(self) -> str:
        """``-D_GLIBCXX_USE_CXX11_ABI=`` as torch was built: every compile must agree."""
        return f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}"

    def identity(self) -> dict[str, object]:
        """Everything about the environment that changes what a build produces."""
        return {
            "compiler": " ".join(self.compiler),
            "compiler_version": self.version,
            "torch": torch.__version__,
            "torch_git": torch.version.git_version,
            "torch_lib": self.torch_lib,
            "python": sys.version.split()[0],
            "python_include": self.python_include,
            "environment": compiler_environment(),
        }

    def compile_flags(self, opt_level: str, extra_cflags: tuple[str, ...]) -> list[str]:
        """Flags of every compile, and of the precompiled header it uses (which must match).

        Like torch's cpp_extension (C++20, -fPIC, the extension macros), plus: hidden
        visibility (fewer exported symbols, so two loaded versions cannot interpose), no
        debug info, and the chosen optimisation level. The user's include directories and
        macros are added per compile: they do not change torch's headers.
        """
        flags = [
            "-std=c++20",
            "-fPIC",
            f"-O{opt_level}",
            "-fvisibility=hidden",
            "-fvisibility-inlines-hidden",
            "-fdiagnostics-color=never",
            "-DTORCH_API_INCLUDE_EXTENSION_H",
            self.abi_flag,
        ]
        for directory in self.system_includes:
            flags += ["-isystem", directory]
        return flags + list(extra_cflags)

    def link_flags(self, extra_ldflags: tuple[str, ...]) -> list[str]:
        """Flags that link an object into a shared library against libtorch."""
        flags = ["-shared"]
        if self.linker:
            flags.append(f"-fuse-ld={self.linker}")
        if self.libstdcxx:
            flags.append(self.libstdcxx)
        flags += [f"-L{self.torch_lib}", *(f"-l{lib}" for lib in TORCH_LIBRARIES)]
        flags.append(f"-Wl,-rpath,{self.torch_lib}")
        return flags + list(extra_ldflags)


def find_toolchain() -> Toolchain:
    """The toolchain for this process's ``$CXX``/``PATH`` (cached); raises what to install."""
    if not sys.platform.startswith("linux"):
        raise ToolchainError(
            f"Compiling operator libraries needs Linux (ELF shared libraries, memfd, flock); "
            f"this is {sys.platform}. Use a Linux machine or container."
        )
    return _find_toolchain(os.environ.get("CXX", ""), os.environ.get("PATH", ""))


@functools.cache
def _find_toolchain(cxx: str, path: str) -> Toolchain:
    """The toolchain for one ``$CXX`` and ``PATH`` (cached by :func:`find_toolchain`)."""
    compiler = tuple(shlex.split(cxx)) or _default_compiler(path)
    launcher = None
    if compiler and os.path.basename(compiler[0]) == "ccache":  # CXX="ccache g++"
        launcher, compiler = compiler[0], compiler[1:]
    if not compiler:
        raise CompilerNotFoundError(
            f"No C++ compiler found (c++, g++ on PATH): {INSTALL_COMPILER}."
        )
    version_text = _run_version(compiler)
    torch_root = Path(torch.__file__).parent
    torch_includes = (
        str(torch_root / "include"),
        str(torch_root / "include/torch/csrc/api/include"),
    )
    if not (torch_root / "include/torch/library.h").is_file():
        raise MissingHeadersError(
            f"torch's C++ headers are missing from {torch_root / 'include'}: this torch install "
            "cannot build C++ extensions. Reinstall torch from its official wheels or conda "
            "package (pip install --force-reinstall torch), which ship the headers."
        )
    is_gcc = "Free Software Foundation" in version_text and "clang" not in version_text
    libstdcxx = None if not is_gcc or _has_shared_libstdcxx(compiler) else _process_libstdcxx()
    return Toolchain(
        compiler=compiler,
        version=version_text,
        is_gcc=is_gcc,
        ccache=launcher,
        # gold takes a dangling libstdc++.so for a file it cannot open; bfd skips it
        linker=_fast_linker(path) if libstdcxx is None else None,
        torch_includes=torch_includes,
        python_include=sysconfig.get_paths()["include"],
        torch_lib=str(torch_root / "lib"),
        libstdcxx=libstdcxx,
    )


# linkers GCC and clang take with -fuse-ld=, fastest first: linking against libtorch takes
# ld.lld ~0.25 s, mold ~0.35 s, ld.gold ~0.45 s, ld.bfd ~1 s
FAST_LINKERS = (("lld", "ld.lld"), ("mold", "ld.mold"), ("gold", "ld.gold"))


def _fast_linker(path: str) -> str | None:
    """The fastest linker on ``PATH`` that ``-fuse-ld=`` selects, if any."""
    return next((name for name, tool in FAST_LINKERS if shutil.which(tool, path=path)), None)


def _has_shared_libstdcxx(compiler: tuple[str, ...]) -> bool:
    """Whether GCC's ``-lstdc++`` finds a shared libstdc++ (some installs' libstdc++.so is a
    dangling symlink: the GPU machine's $CXX has one beside a real libstdc++.a)."""
    found = subprocess.run(
        [*compiler, "-print-file-name=libstdc++.so"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    ).stdout.strip()
    return os.path.isabs(found) and os.path.exists(found)


def _process_libstdcxx() -> str:
    """The libstdc++ this process has loaded (torch's), as a linker input."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if os.path.basename(path).startswith("libstdc++.so"):
                    return path
    except OSError:
        pass
    return "-l:libstdc++.so.6"


def _default_compiler(path: str) -> tuple[str, ...]:
    """``c++`` or ``g++`` from ``PATH``, or nothing."""
    for name in ("c++", "g++"):
        found = shutil.which(name, path=path)
        if found:
            return (found,)
    return ()


def _run_version(compiler: tuple[str, ...]) -> str:
    """``--version`` and ``-dumpmachine`` of the compiler; raises when it does not run."""
    try:
        version = subprocess.run(
            [*compiler, "--version"], capture_output=True, text=True, check=True, timeout=60
        ).stdout
        machine = subprocess.run(
            [*compiler, "-dumpmachine"], capture_output=True, text=True, check=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError) as error:
        raise CompilerNotFoundError(
            f"The C++ compiler {' '.join(compiler)!r} does not run ({error}): {INSTALL_COMPILER}."
        ) from error
    return f"{version.strip()}\n{machine.strip()}"
