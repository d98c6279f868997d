"""How big the quickstart's diagrams are: each SVG's width and height, in points.

Baseline: the budget of 500 pt of height for a two-key path (a ratio below 1 meets
it); a table or a longer path is held to the same number, for scale. With ``--baseline
CHECKOUT`` the same notebook also runs on another checkout's opmagic (e.g. main) in the same
run, and each diagram's height is given as a ratio to that checkout's.

The notebook runs in a fresh kernel (nbclient) with the checkout first on ``PYTHONPATH``, as
a user runs it; each diagram is read from the SVG the cell displayed (its ``image/svg+xml``
output, else the SVG inlined in its ``text/html``).

    python benchmarks/diagram_sizes.py [--baseline /path/to/main] [NOTEBOOK]
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient

BUDGET_PT = 500.0
ROOT = Path(__file__).resolve().parents[1]
_SIZE = re.compile(r'<svg[^>]*?width="([\d.]+)pt"[^>]*?height="([\d.]+)pt"', re.S)


def diagram_sizes(notebook_path: Path, checkout: Path) -> list[tuple[str, float, float]]:
    """(the cell's magic or last line, width pt, height pt) of every diagram the notebook
    displays, run with ``checkout``'s opmagic."""
    notebook = nbformat.read(notebook_path, as_version=4)
    pythonpath = os.pathsep.join(filter(None, [str(checkout), os.environ.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory() as where:
        NotebookClient(
            notebook, kernel_name="python3", timeout=600, resources={"metadata": {"path": where}}
        ).execute(env={**os.environ, "PYTHONPATH": pythonpath})
    sizes = []
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        lines = cell.source.strip().splitlines()
        label = next((line for line in reversed(lines) if line.startswith("%")), lines[-1])
        for output in cell.outputs:
            data = output.get("data", {})
            svg = data.get("image/svg+xml") or data.get("text/html") or ""
            for width, height in _SIZE.findall(svg):
                sizes.append((label, float(width), float(height)))
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook", nargs="?", default=ROOT / "notebooks" / "quickstart.ipynb")
    parser.add_argument("--baseline", type=Path, help="another checkout to compare with")
    options = parser.parse_args()
    path = Path(options.notebook)
    sizes = diagram_sizes(path, ROOT)
    print(f"{path.name}: diagram sizes (budget: {BUDGET_PT:.0f} pt tall)")
    if options.baseline is None:
        for label, width, height in sizes:
            ratio = height / BUDGET_PT
            print(f"  {width:5.0f} x {height:5.0f} pt  height/budget {ratio:4.2f}  {label}")
        return
    before = diagram_sizes(path, options.baseline.resolve())
    print(f"  baseline: {options.baseline} (same notebook, same run)")
    for (label, width, height), (_, old_width, old_height) in zip(sizes, before, strict=True):
        print(
            f"  {old_width:5.0f} x {old_height:5.0f} pt -> {width:5.0f} x {height:5.0f} pt  "
            f"height/baseline {height / old_height:4.2f}  height/budget "
            f"{height / BUDGET_PT:4.2f}  {label}"
        )


if __name__ == "__main__":
    main()
