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


def test_the_fast_loop_samples_every_value_of_a_matrix():
    """The sample of a kernel sets x inputs x contexts matrix gives each parameter each of its
    values, keeps one case in SAMPLE_EVERY besides, and is the same on every run."""
    import itertools

    from .matrix import SAMPLE_EVERY, in_sample

    keys = [["CPU"], ["CPU", "Autograd"], ["Meta"], ["CPU", "Meta", "Autograd"]]
    cases = [
        {"context": context, "inputs": inputs, "keys": kernels}
        for context, inputs, kernels in itertools.product(
            ["plain", "no_grad", "autocast", "vmap", "FakeTensorMode"], ["cpu", "meta", "sparse"],
            keys,
        )
    ]
    chosen = in_sample(cases)
    sample = [case for case, keep in zip(cases, chosen, strict=True) if keep]
    for name in ("context", "inputs", "keys"):
        assert {repr(case[name]) for case in sample} == {repr(case[name]) for case in cases}
    assert all(chosen[::SAMPLE_EVERY])
    assert len(sample) < len(cases) / 3
    assert in_sample(cases) == chosen


def test_no_internal_issue_numbers_in_what_users_read():
    """Messages, docstrings, the docs, notebooks and benchmarks speak of features, not of the
    team's tracker ("issue 12", "(issue 13, class 5)")."""
    issue = re.compile(r"\bissues?\s*#?\d+", re.I)
    read = [
        ROOT / "README.md",
        *(ROOT / "docs").glob("*.md"),
        *(ROOT / "notebooks").glob("*.ipynb"),
        *(ROOT / "opmagic").rglob("*.py"),
        *(ROOT / "benchmarks").glob("*.py"),
    ]
    found = [
        f"{path.relative_to(ROOT)}: {match.group()}"
        for path in read
        for match in issue.finditer(path.read_text())
    ]
    assert not found
