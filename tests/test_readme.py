"""Every example in README.md and docs/*.md runs as written, and every link between them
holds: a page's Python and cell blocks run in order in one IPython shell of a fresh process
(the examples define operators of their own, so each page gets its own process)."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
PYTHONPATH = os.environ.get("PYTHONPATH", "")
# fenced blocks a user pastes into a notebook cell: Python, and C++/CUDA cells of the magics
_RUNNABLE = ("python", "ipython", "cpp", "cuda")
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)
# reference pages: what they show is commands and figures, not code to paste into a cell
_WITHOUT_EXAMPLES = {"architecture", "magics", "performance", "setup", "torch_versions"}
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_OPTION = re.compile(r"(?<![\w-])-{1,2}[\w-]+")  # -n, --no-pch: not the - of `-n/--name`
_CODE = re.compile(r"`[^`\n]*`")  # inline code: `vadd[grid, block](a, b)` is no link

# Runs the blocks as notebook cells. A cell shows only its last expression: an earlier line
# whose value would display (an opmagic result, a widget, a line magic's result) is recorded
# as lost, since its comment promises a picture the reader never sees.
_RUNNER = textwrap.dedent(
    """
    import ast, json, sys
    from IPython.core.interactiveshell import InteractiveShell

    lost = []

    def _shown_or_lost(value, line):
        if value is not None and any(
            hasattr(value, hook)
            for hook in ("_repr_mimebundle_", "_repr_html_", "_ipython_display_")
        ):
            lost.append((number, line, type(value).__name__))

    class NotLast(ast.NodeTransformer):
        def visit_Module(self, module):
            for statement in module.body[:-1]:
                if isinstance(statement, ast.Expr):
                    statement.value = ast.Call(
                        ast.Name("_shown_or_lost", ast.Load()),
                        [statement.value, ast.Constant(statement.lineno)],
                        [],
                    )
            return ast.fix_missing_locations(module)

    shell = InteractiveShell.instance()
    shell.ast_transformers.append(NotLast())
    shell.user_ns["_shown_or_lost"] = _shown_or_lost
    for number, cell in enumerate(json.loads(sys.stdin.read()), 1):
        result = shell.run_cell(cell, store_history=True)
        if not result.success:
            error = result.error_in_exec or result.error_before_exec
            print(f"block {number} failed: {type(error).__name__}: {error}\\n{cell}")
            sys.exit(1)
    for number, line, kind in lost:
        print(f"README block {number}, line {line}: a {kind} that a notebook never shows "
              "(not the cell's last line): end the block there, or display(...) it")
    sys.exit(2 if lost else 0)
    """
)


def runnable_blocks(page: Path) -> list[str]:
    """A page's runnable blocks, in order."""
    return [code for lang, code in _FENCE.findall(page.read_text()) if lang in _RUNNABLE]


def _name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def test_the_readme_has_examples_to_run() -> None:
    cells = runnable_blocks(README)
    assert len(cells) >= 8
    assert any(cell.startswith("%%torch_library") for cell in cells)
    assert any(cell.startswith("%%custom_op") for cell in cells)


@pytest.mark.parametrize("page", PAGES[1:], ids=_name)
def test_every_feature_page_has_examples(page: Path) -> None:
    assert bool(runnable_blocks(page)) != (page.stem in _WITHOUT_EXAMPLES), (
        f"{_name(page)}: a feature page shows a runnable example; a reference page "
        "(_WITHOUT_EXAMPLES) shows none"
    )


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as -."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = _FENCE.sub("", page.read_text())
    return {github_anchor(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_link_between_pages_holds(page: Path) -> None:
    broken = []
    for target in _LINK.findall(_CODE.sub("", _FENCE.sub("", page.read_text()))):
        if "://" in target:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists() or (anchor and anchor not in _anchors(linked)):
            broken.append(target)
    assert not broken, f"{_name(page)} links to what is not there: {broken}"


@pytest.mark.slow
@pytest.mark.parametrize(
    "page", [page for page in PAGES if runnable_blocks(page)], ids=_name
)
def test_every_example_runs_as_written(page: Path, build_cache: Path, tmp_path: Path) -> None:
    done = subprocess.run(  # in a directory of its own: examples save files where they run
        [sys.executable, "-c", _RUNNER],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), PYTHONPATH]))},
        input=json.dumps(runnable_blocks(page)),
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert done.returncode == 0, _name(page) + ": " + done.stdout[-4000:] + done.stderr[-4000:]


def _declared_magics() -> dict[str, set[str]]:
    """Every magic ``%load_ext opmagic`` registers (``%name`` or ``%%name``), with the option
    strings its parser declares."""
    from opmagic.magics import MAGIC_CLASSES

    declared = {}
    for module, name in MAGIC_CLASSES:
        magics = getattr(importlib.import_module(f"opmagic.magics.{module}"), name)
        for kind, methods in magics.magics.items():
            for magic, method in methods.items():
                parser = getattr(magics, method).parser
                options = {flag for action in parser._actions for flag in action.option_strings}
                declared[("%%" if kind == "cell" else "%") + magic] = options
    return declared


def _readme_magic_table() -> dict[str, set[str]]:
    """The README's table of magics: each magic's name, with the options its row lists."""
    section = README.read_text().split("\n## Magics\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:-1] for line in section.splitlines() if line.startswith("| `%")]
    return {
        re.match(r"`(%%?\w+)", magic.strip()).group(1): set(_OPTION.findall(options))
        for magic, options, *_ in rows
    }


def test_the_readme_names_every_magic_and_each_of_its_options() -> None:
    """The README's table of magics is the magics' parsers, option for option."""
    table, declared = _readme_magic_table(), _declared_magics()
    assert table.keys() == declared.keys(), "magics the README's table lacks or invents"
    wrong = {
        magic: {"missing": declared[magic] - options, "not declared": options - declared[magic]}
        for magic, options in table.items()
        if options != declared[magic]
    }
    assert not wrong, wrong
