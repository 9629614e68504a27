"""Slide metadata for the notebooks, so that a teacher can present each one (View > Render as Reveal Slideshow).

The rule follows the notebooks' structure: the title cell and every cell with a "## " section
heading start a new slide, a cell with a "### " heading a sub-slide (below its section in RISE's two-dimensional layout), and every other
cell continues the slide before it. Self-checks and exercises start slides of their own because
they are sections. Run ``python -m kvlib.tools.slides`` after adding cells; a test checks the result.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from .integrity import write_bytes

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def slide_type(cell: dict, first: bool) -> str:
    """RISE's slide type for one cell: "slide", "subslide" or "-" (continue)."""
    lines = "".join(cell.get("source", "")).splitlines() if cell["cell_type"] == "markdown" else []
    if first or any(line.startswith(("# ", "## ")) for line in lines):
        return "slide"
    if any(line.startswith("### ") for line in lines):
        return "subslide"
    return "-"


def with_slides(nb: dict) -> dict:
    """The notebook with every cell's ``metadata.slideshow.slide_type`` set by :func:`slide_type`."""
    for i, cell in enumerate(nb["cells"]):
        cell.setdefault("metadata", {})["slideshow"] = {"slide_type": slide_type(cell, i == 0)}
    return nb


def main(paths: list[str] | None = None) -> int:
    for path in [Path(p) for p in paths] if paths else sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        nb = with_slides(json.loads(path.read_text(encoding="utf-8")))
        write_bytes(path, (json.dumps(nb, ensure_ascii=False, indent=1) + "\n").encode("utf-8"))
        print(f"{path.name}: {sum(c['metadata']['slideshow']['slide_type'] == 'slide' for c in nb['cells'])} slides")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
