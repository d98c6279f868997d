"""The CUDA side of a build: nvcc, CUDA's headers and runtime library, GPU architectures, and
whether a GPU can run anything here.

Nothing here imports a CUDA library at ``import opmagic`` time: the driver bindings are
imported when a GPU is asked about, and nvcc is looked for when a full-path cell is built.
"""

from __future__ import annotations

import functools
import glob
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ...errors import BuildOptionError, CudaToolkitError

INSTALL_NVCC = (
    "install the CUDA toolkit's compiler: pip install nvidia-cuda-nvcc (with the CUDA major "
    "version of your torch), apt-get install nvidia-cuda-toolkit, or NVIDIA's CUDA toolkit; "
    "or set CUDA_HOME to a toolkit"
)
INSTALL_CUDA_HEADERS = (
    "install CUDA's headers: pip install nvidia-cuda-runtime, or a CUDA toolkit (then set "
    "CUDA_HOME to it)"
)
# without a GPU to ask, full-path builds target Ampere and Hopper, plus PTX for newer GPUs
DEFAULT_ARCHS = ("sm_80", "sm_90", "compute_90")
_ARCH = re.compile(
    r"^(?:(?P<kind>sm|compute)_)?(?P<major>\d+)(?:\.(?P<minor>\d))?(?P<suffix>[af]?)$"
)
_NVCC_VERSION = re.compile(r"release (\d+)\.(\d+)")


@dataclass(frozen=True)
class CudaToolkit:
    """nvcc and the CUDA headers and runtime library that builds compile and link against."""

    nvcc: str
    version: tuple[int, int]  # nvcc's release, e.g. (13, 0)
    include_dirs: tuple[str, ...]  # the toolkit's, then those of pip-installed CUDA packages
    library_dir: str  # where libcudart.so lives

    @property
    def version_text(self) -> str:
        """``13.0``."""
        return f"{self.version[0]}.{self.version[1]}"

    def identity(self) -> dict[str, str]:
        """What about the toolkit changes what a build produces (part of cache keys)."""
        return {"nvcc": self.nvcc, "nvcc_version": self.version_text}


def find_cuda_toolkit() -> CudaToolkit:
    """The toolkit of ``$CUDA_HOME``/``$CUDA_PATH``, ``nvcc`` on ``PATH`` or /usr/local/cuda.

    Raises :class:`CudaToolkitError` naming what to install, or when the toolkit's CUDA
    major version differs from torch's (kernels would link against another CUDA runtime
    than torch's).
    """
    return _find_cuda_toolkit(
        os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "",
        os.environ.get("PATH", ""),
    )


@functools.cache
def _find_cuda_toolkit(cuda_home: str, path: str) -> CudaToolkit:
    """The toolkit for one ``$CUDA_HOME`` and ``PATH`` (cached by :func:`find_cuda_toolkit`)."""
    candidates = [os.path.join(cuda_home, "bin", "nvcc")] if cuda_home else []
    candidates += [shutil.which("nvcc", path=path) or "", "/usr/local/cuda/bin/nvcc"]
    nvcc = next((c for c in candidates if c and os.access(c, os.X_OK)), None)
    if nvcc is None:
        raise CudaToolkitError(f"nvcc, the CUDA compiler, was not found: {INSTALL_NVCC}.")
    try:
        output = subprocess.run(
            [nvcc, "--version"], capture_output=True, text=True, check=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError) as error:
        raise CudaToolkitError(f"{nvcc} does not run ({error}): {INSTALL_NVCC}.") from error
    match = _NVCC_VERSION.search(output)
    if match is None:
        raise CudaToolkitError(f"{nvcc} --version names no CUDA release: {INSTALL_NVCC}.")
    version = (int(match[1]), int(match[2]))
    torch_cuda = torch.version.cuda
    if torch_cuda and int(torch_cuda.split(".")[0]) != version[0]:
        raise CudaToolkitError(
            f"nvcc {version[0]}.{version[1]} ({nvcc}) and torch's CUDA {torch_cuda} differ in "
            "their major version: kernels built with it would need another CUDA runtime than "
            f"torch's. Install a CUDA {torch_cuda.split('.')[0]}.x toolkit (pip install "
            "nvidia-cuda-nvcc) and point CUDA_HOME at it."
        )
    home = _toolkit_home(nvcc)
    include = home / "include"
    library_dir = next(
        (str(d) for d in (home / "lib64", home / "lib") if (d / "libcudart.so").exists()), None
    )
    if library_dir is None:
        raise CudaToolkitError(f"libcudart.so is missing from {home}: {INSTALL_NVCC}.")
    return CudaToolkit(
        nvcc, version, _unique([str(include), *pip_cuda_include_dirs()]), library_dir
    )


def _toolkit_home(nvcc: str) -> Path:
    """The toolkit directory of an nvcc (which may be a wrapper script elsewhere)."""
    dryrun = subprocess.run(
        [nvcc, "--dryrun", "-c", "-x", "cu", os.devnull],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    here = re.search(r"^#\$ _HERE_=(.+)$", dryrun.stdout + dryrun.stderr, re.M)
    binary = here[1].strip() if here else os.path.dirname(os.path.realpath(nvcc))
    return Path(binary).parent


def pip_cuda_include_dirs() -> list[str]:
    """Include directories of pip-installed CUDA packages (``nvidia-*``: cuBLAS, cuSPARSE, ...).

    A CUDA build of torch from PyPI brings them; torch's ATen/cuda headers include theirs.
    """
    found = []
    for entry in sys.path:
        root = os.path.join(entry or ".", "nvidia")
        found += sorted(glob.glob(os.path.join(root, "*", "include")))
    return [d for d in found if os.path.isdir(d)]


def cuda_include_dirs() -> tuple[str, ...]:
    """Where CUDA's own headers (``cuda_fp16.h``, ``cuda_runtime.h``) are, toolkit first.

    Used for NVRTC, which has no headers of its own; needs no nvcc.
    """
    homes = [os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", "")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        homes.append(str(Path(os.path.realpath(nvcc)).parent.parent))
    homes.append("/usr/local/cuda")
    dirs = [os.path.join(h, "include") for h in homes if h]
    dirs += pip_cuda_include_dirs()
    with_headers = [d for d in dirs if os.path.isfile(os.path.join(d, "cuda_fp16.h"))]
    extra = [
        os.path.join(d, "cccl") for d in with_headers if os.path.isdir(os.path.join(d, "cccl"))
    ]
    return _unique([*with_headers, *extra])


def _unique(items: Iterable[str]) -> tuple[str, ...]:
    """``items`` in order, each once (by real path)."""
    seen: dict[str, str] = {}
    for item in items:
        seen.setdefault(os.path.realpath(item), item)
    return tuple(seen.values())


# ---------------------------------------------------------------- architectures


def parse_archs(arch: str | Sequence[str] | None) -> tuple[str, ...]:
    """GPU architectures as ``sm_86`` (machine code) or ``compute_86`` (PTX, JIT-compiled).

    Accepts ``"sm_86"``, ``"86"``, ``"8.6"``, ``"compute_90"``, ``"sm_90a"``, a comma-separated
    string or a sequence of them. ``None``: the running GPU's, else :data:`DEFAULT_ARCHS`.
    """
    if arch is None:
        running = running_gpu_arch()
        return (running,) if running else DEFAULT_ARCHS
    if isinstance(arch, str):
        parts = [p.strip() for p in arch.split(",")]
    elif isinstance(arch, (list, tuple)) and all(isinstance(p, str) for p in arch):
        parts = list(arch)
    else:
        raise BuildOptionError(
            f"arch must be a str such as 'sm_86' or a list of them, got {arch!r}."
        )
    archs = []
    for part in parts:
        match = _ARCH.match(str(part).strip())
        if not part or match is None:
            raise BuildOptionError(
                f"Unknown GPU architecture {part!r}: write sm_86 (or 86, 8.6) for machine code "
                "of one architecture, compute_86 for PTX that newer GPUs JIT-compile."
            )
        number = match["major"] + (match["minor"] or "")
        archs.append(f"{match['kind'] or 'sm'}_{number}{match['suffix']}")
    return tuple(dict.fromkeys(archs))


def running_gpu_arch(device: int | None = None) -> str | None:
    """``sm_XY`` of the current (or given) CUDA device, when torch can use one."""
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def nvcc_arch_flags(archs: Sequence[str]) -> list[str]:
    """``-gencode`` flags: machine code for each ``sm_*``, PTX for each ``compute_*``."""
    flags = []
    for arch in archs:
        number = arch.split("_", 1)[1]
        flags += ["-gencode", f"arch=compute_{number},code={arch}"]
    return flags


# ---------------------------------------------------------------- is there a GPU?


def gpu_unavailable_reason() -> str | None:
    """Why no kernel can run here (no driver, no GPU, a CPU build of torch), or ``None``."""
    if torch.version.cuda is not None and torch.cuda.is_available():
        return None
    reasons = []
    driver = driver_problem()
    if driver is not None:
        reasons.append(driver)
    if torch.version.cuda is None:
        reasons.append(f"torch {torch.__version__} is a CPU build (no CUDA support)")
    elif driver is None:
        reasons.append("torch.cuda.is_available() is False (no CUDA device is visible)")
    return "No GPU can run kernels here: " + "; ".join(reasons) + "."


def driver_problem() -> str | None:
    """Why the NVIDIA driver cannot be used (not installed, no device), or ``None``."""
    try:
        from cuda.bindings import driver
    except ImportError:
        return None  # cannot ask the driver; torch's answer stands
    try:
        (result,) = driver.cuInit(0)
    except RuntimeError as error:  # cuda.pathfinder: libcuda.so.1 cannot be found
        if "driver" in str(error).lower():
            return "no NVIDIA driver is installed (libcuda.so.1 cannot be found)"
        raise
    if result == driver.CUresult.CUDA_ERROR_NO_DEVICE:
        return "the NVIDIA driver sees no GPU (check CUDA_VISIBLE_DEVICES)"
    if result != driver.CUresult.CUDA_SUCCESS:
        return f"the NVIDIA driver does not start ({result.name})"
    return None
