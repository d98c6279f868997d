"""The repository keeps its promises: CI runs the README's test command; ruff config holds."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_test_command() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("Run the tests", 1)[1]
    return re.search(r"```bash\n(.+?)\n```", section, re.S).group(1).strip()


def test_ci_runs_exactly_the_readme_test_command():
    ci_lines = [
        line.strip()
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert ci_lines[-1] == _readme_test_command()


def test_ci_installs_torch_before_the_project():
    text = (ROOT / ".ci" / "run").read_text()
    assert text.index("torch==2.13.0") < text.index('-e ".[test,cuda,triton]"')


def test_readme_documents_every_cli_command():
    readme = (ROOT / "README.md").read_text()
    for command in ("table", "resolve", "kernels"):
        assert f"python -m opmagic {command}" in readme


def test_every_file_the_package_reads_is_package_data():
    """A non-Python file inside the package (a header, C++ source) ships with it: a wheel
    without it would fail at the first build or trace."""
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]
    shipped = {
        f"{package.replace('.', '/')}/{name}"
        for package, names in declared.items()
        for name in names
    }
    package = ROOT / "opmagic"
    files = {
        path.relative_to(ROOT).as_posix()
        for path in package.rglob("*")
        if path.is_file() and path.suffix not in {".py", ".pyc"}
    }
    assert files <= shipped, sorted(files - shipped)


def test_the_license_file_is_the_license_pyproject_names():
    """pyproject says BSD-3-Clause; LICENSE holds that license's text (setuptools ships it
    in the wheel as a license file), held by the opmagic authors."""
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"]
    assert declared == {"text": "BSD-3-Clause"}
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("BSD 3-Clause License\n")
    assert re.search(r"^Copyright \(c\) \d{4}, the opmagic authors$", text, re.M)
    assert "3. Neither the name of the copyright holder nor the names of its" in text
