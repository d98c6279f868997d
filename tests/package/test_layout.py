"""The package's build files and how they are written (opmagic/package/layout.py)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch

from opmagic.package.layout import (
    abi_of,
    dependencies,
    init_py,
    is_export,
    manifest,
    pyproject,
    setup_py,
    write_package,
)
from opmagic.package.native import NativeSource, target_version
from opmagic.package.python import PythonModule


def native(module: str, *, stable: bool, cuda: bool = False) -> NativeSource:
    flags = ("-O3", f"-DTORCH_TARGET_VERSION={target_version()}") if stable else ("-O3",)
    return NativeSource(
        label="[3]",
        path=f"csrc/cuda/{module}.cu" if cuda else f"csrc/{module}.cpp",
        module=f"_C_{module}",
        text="",
        cuda=cuda,
        stable=stable,
        why_classic="",
        cxx_flags=flags,
        nvcc_flags=("-O3",) if cuda else (),
        link_flags=("-lm",),
        include_dirs=("/opt/include",),
        operators=(),
        explicit=(),
    )


def test_setup_py_builds_stable_libraries_as_abi3_and_cuda_ones_only_with_cuda() -> None:
    stable = setup_py("pkg", [native("a", stable=True), native("b", stable=True, cuda=True)])
    ast.parse(stable)
    assert '"py_limited_api": "cp310"' in stable and stable.count("py_limited_api=True") == 2
    assert "CUDAExtension(" in stable and "    if USE_CUDA:\n        built += [" in stable
    assert '"pkg._C_a",  # cell [3]' in stable and '["pkg/csrc/a.cpp"],' in stable
    assert f'"-DTORCH_TARGET_VERSION={target_version()}",  # torch\'s stable ABI' in stable
    assert 'extra_link_args=["-lm"]' in stable and 'include_dirs=["/opt/include"]' in stable
    classic = setup_py("pkg", [native("a", stable=True), native("c", stable=False)])
    assert "bdist_wheel" not in classic and classic.count("py_limited_api=True") == 1
    assert abi_of([native("a", stable=True)]) == "stable" and abi_of([]) == "python"


def test_target_version_is_this_torch() -> None:
    major, minor = (int(p) for p in torch.__version__.split(".")[:2])
    assert int(target_version(), 16) >> 48 == (major << 8) + minor


def test_dependencies_pin_torch_for_classic_libraries_and_add_what_ops_py_imports() -> None:
    version = torch.__version__.split("+")[0]
    python = PythonModule("", frozenset({"numpy", "os", "torch", "pkg", "no_such_module"}), ())
    requirements, notes = dependencies("pkg", [native("c", stable=False)], python)
    assert requirements == [f"torch=={version}", "numpy"]
    assert notes == ["ops.py imports no_such_module, which no installed distribution provides"]
    minor = ".".join(version.split(".")[:2])
    assert dependencies("pkg", [native("a", stable=True)], None)[0] == [f"torch>={minor}"]
    text = pyproject("pkg", "1.0", [f"torch>={minor}"], False, "ops")
    assert 'requires = ["setuptools>=64"]' in text and f'"torch>={minor}",' in text


def test_init_py_loads_the_libraries_then_ops() -> None:
    libraries = [native("a", stable=True), native("b", stable=False, cuda=True)]
    text = init_py("pkg", "0.1.0", libraries, True)
    ast.parse(text)
    assert '("_C_a", False),  # cell [3]' in text and '("_C_b", True),' in text
    assert text.rstrip().endswith("from . import ops  # noqa: E402  (after the libraries: it "
                                  "registers on them)")
    pure = init_py("pkg", "0.1.0", [], True)
    assert "CUDA_BUILD = False" in pure and "load_library" not in pure


def test_the_package_is_written_whole_and_replaces_only_an_earlier_export(tmp_path: Path) -> None:
    target = tmp_path / "pkg"
    files = {"ops.json": manifest("pkg", "0.1.0", "python", [], [], []), "pkg/a.txt": b"1"}
    write_package(target, files, replace=False)
    assert is_export(target) and (target / "pkg" / "a.txt").read_bytes() == b"1"
    assert json.loads((target / "ops.json").read_text())["exported_by"] == "opmagic"

    def failing_write(self: Path, data: bytes) -> int:
        raise OSError(28, "No space left on device")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Path, "write_bytes", failing_write)
        with pytest.raises(OSError, match="No space"):
            write_package(target, {**files, "pkg/b.txt": b"2"}, replace=True)
    assert (target / "pkg" / "a.txt").read_bytes() == b"1"  # the earlier export is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pkg"]  # no staging left behind
    write_package(target, {"ops.json": files["ops.json"], "pkg/b.txt": b"2"}, replace=True)
    assert not (target / "pkg" / "a.txt").exists() and (target / "pkg" / "b.txt").exists()
    assert not is_export(tmp_path)
