"""The repository keeps its promises: CI runs the README's test command; ruff config holds."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
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
            ["plain", "no_grad", "autocast", "vmap", "FakeTensorMode"],
            ["cpu", "meta", "sparse"],
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


# ---------------------------------------------------------------- tests that spawn are slow
# What certainly starts a process, a compiler, a kernel or a browser when a test runs it: a
# call of one of these (as a name or an attribute), or a fixture named here.
_SPAWNING_CALLS = {
    "subprocess.run",
    "subprocess.Popen",
    "subprocess.check_output",
    "subprocess.check_call",
    "subprocess.call",
    "os.fork",
    "os.system",
    "multiprocessing.Process",
    "torch.compile",
    "compile_library",
    "compile_cuda_library",
    "sync_playwright",
    "NotebookClient",
}
_SPAWNING_FIXTURES = {"run_notebook"}


@dataclass
class _TestFunction:
    """A function of a test module (or conftest), with what a static reading finds in it."""

    module: str
    name: str
    node: ast.FunctionDef
    calls: set[str]  # dotted names it calls
    fixture: bool
    slow: bool  # marked slow itself, or by its class or module


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def _marks(decorators: list[ast.expr]) -> set[str]:
    """The pytest marker names among decorators (``pytest.mark.slow``, ``pytest.fixture``)."""
    names = set()
    for decorator in decorators:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        names.add(_dotted(target).removeprefix("pytest.mark.").removeprefix("pytest."))
    return names


def _module_marks(tree: ast.Module) -> set[str]:
    """Markers of the module's ``pytestmark`` (one marker or a list)."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            values = node.value.elts if isinstance(node.value, ast.List) else [node.value]
            return _marks(values)
    return set()


def _test_functions() -> list[_TestFunction]:
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        tree = ast.parse(path.read_text())
        module = path.relative_to(ROOT).as_posix()
        module_slow = "slow" in _module_marks(tree)
        scopes = [(tree.body, False)] + [
            (node.body, "slow" in _marks(node.decorator_list))
            for node in tree.body
            if isinstance(node, ast.ClassDef)
        ]
        for body, class_slow in scopes:
            for node in body:
                if not isinstance(node, ast.FunctionDef):
                    continue
                marks = _marks(node.decorator_list)
                calls = {
                    _dotted(call.func) for call in ast.walk(node) if isinstance(call, ast.Call)
                }
                found.append(
                    _TestFunction(
                        module,
                        node.name,
                        node,
                        calls,
                        "fixture" in marks,
                        "slow" in marks or class_slow or module_slow,
                    )
                )
    return found


def _spawners(functions: list[_TestFunction]) -> set[tuple[str, str]]:
    """(module, name) of every function that spawns, itself or through a helper or fixture
    (helpers and fixtures looked up by name: a module's own first, then those of the conftests
    that apply to it, the nearest first, as pytest does)."""
    by_module = {(f.module, f.name): f for f in functions}
    conftests = [f for f in functions if f.fixture and f.module.endswith("conftest.py")]

    def fixture(name: str, module: str) -> _TestFunction | None:
        applying = [
            f
            for f in conftests
            if f.name == name and module.startswith(f.module[: -len("conftest.py")])
        ]
        return max(applying, key=lambda f: len(f.module), default=None)

    def callees(function: _TestFunction) -> list[_TestFunction]:
        names = {c.rpartition(".")[2] for c in function.calls}
        names |= {a.arg for a in function.node.args.args}  # the fixtures it asks for
        found = [by_module.get((function.module, n)) or fixture(n, function.module) for n in names]
        return [f for f in found if f is not None and f is not function]

    spawning = {
        (f.module, f.name)
        for f in functions
        if f.calls & _SPAWNING_CALLS
        or {c.rpartition(".")[2] for c in f.calls} & _SPAWNING_CALLS
        or {a.arg for a in f.node.args.args} & _SPAWNING_FIXTURES
        or (f.fixture and f.name in _SPAWNING_FIXTURES)
    }
    changed = True
    while changed:
        changed = False
        for function in functions:
            key = (function.module, function.name)
            if key not in spawning and any(
                (c.module, c.name) in spawning for c in callees(function)
            ):
                spawning.add(key)
                changed = True
    return spawning


def test_every_test_that_spawns_is_marked_slow():
    """A test that starts a process, a compiler, a notebook kernel or a browser (itself, or
    through a helper or fixture it uses) is marked slow, so the fast loop never runs it."""
    functions = _test_functions()
    spawning = _spawners(functions)
    unmarked = [
        f"{f.module}::{f.name}"
        for f in functions
        if f.name.startswith("test_") and not f.slow and (f.module, f.name) in spawning
    ]
    assert not unmarked, "mark these slow (or give them a fast fixture): " + ", ".join(unmarked)


_CLOCKS = {"time.perf_counter", "time.monotonic", "time.time", "time.process_time"}
_DURATION = re.compile(r"(seconds|elapsed|duration|_time|time_ns|_ms|_us)$")


def _is_duration(node: ast.AST) -> bool:
    """An expression that reads a clock or names a duration (``build.seconds``, ``elapsed``)."""
    for part in ast.walk(node):
        if isinstance(part, ast.Call) and _dotted(part.func) in _CLOCKS:
            return True
        name = part.attr if isinstance(part, ast.Attribute) else getattr(part, "id", "")
        if isinstance(part, (ast.Attribute, ast.Name)) and _DURATION.search(name):
            return True
    return False


def test_no_test_holds_a_duration_to_a_budget():
    """Wall-clock budgets fail on a loaded machine and pass on a fast one: they live in
    benchmarks/, which print ratios against a baseline of the same run. A test compares a
    duration with zero at most (``seconds > 0``: it was measured)."""
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Assert):
                continue
            for compare in (n for n in ast.walk(node.test) if isinstance(n, ast.Compare)):
                ordering = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
                if not any(isinstance(op, ordering) for op in compare.ops):
                    continue  # a duration recorded and read back is no budget
                sides = [compare.left, *compare.comparators]
                budget = any(
                    isinstance(side, ast.Constant)
                    and isinstance(side.value, (int, float))
                    and not isinstance(side.value, bool)
                    and side.value != 0
                    for side in sides
                )
                if budget and any(_is_duration(side) for side in sides):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, "budgets belong in benchmarks/: " + ", ".join(found)


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


def test_no_benchmark_shadows_a_module_it_may_import():
    """``python benchmarks/X.py`` puts benchmarks/ first on sys.path: a script named like an
    installed module (cuda.py beside cuda-bindings, which ``import torch`` loads) would be
    imported in its place."""
    import importlib.util

    shadowing = [
        script.name
        for script in (ROOT / "benchmarks").glob("*.py")
        if importlib.util.find_spec(script.stem) is not None
    ]
    assert not shadowing
