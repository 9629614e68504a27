"""Numbers in the prose come from the outputs: a measured-looking number in a markdown cell must be
printed by a code cell of the same notebook, or be a declared constant or a quoted lesson figure.

"Measured-looking" means a number with a unit that a run produces: %, × (or x), ms, µs, s, nats,
bytes, KB/MB/GB (and KiB/MiB/GiB). Numbers in code spans (`...`) and in LaTeX are formulas and
settings, not measurements, so they are skipped.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvlib.notebook import catalog

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = [nb.path for nb in catalog.NOTEBOOKS]

UNIT = r"(?:%|×|x\b|ms\b|µs\b|us\b|s\b|seconds?\b|nats?\b|bytes?\b|[KMG]i?B\b)"
NUMBER = re.compile(r"(?<![\w.,/-])(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?)\s?" + UNIT)

# Numbers that no run produces (facts, settings, figures quoted from the lessons or papers): per notebook
# in the catalog, and a few everywhere.
DECLARED = {f"{nb.number:02d}": set(nb.declared) for nb in catalog.NOTEBOOKS} | {"*": set(catalog.DECLARED_EVERYWHERE)}


def markdown_numbers(source: str) -> list[str]:
    text = re.sub(r"```.*?```", " ", source, flags=re.S)   # fenced code
    text = re.sub(r"`[^`]*`", " ", text)                   # code spans
    text = re.sub(r"\$[^$]*\$", " ", text)                 # LaTeX
    return [m.group(1) for m in NUMBER.finditer(text)]


def output_text(nb: dict) -> str:
    parts = []
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            if "text" in out:
                parts.append("".join(out["text"]))
            for key in ("text/plain", "text/html", "text/markdown"):
                if key in out.get("data", {}):
                    parts.append("".join(out["data"][key]))
    return "\n".join(parts)


def appears(number: str, text: str) -> bool:
    plain = number.replace(",", "")
    forms = {number, plain}
    if "." not in plain and len(plain) > 3:
        forms.add(f"{int(plain):,}")
    return any(re.search(rf"(?<![\d.]){re.escape(f)}(?![\d])", text) for f in forms)


def test_the_scanner_finds_measured_numbers_and_skips_code():
    found = markdown_numbers("It took 38.3 ms, 8.7× faster, 14 % of 1,187 cases; `top_p=0.9` and $p = 0.5$ are settings.")
    assert found == ["38.3", "8.7", "14"]
    assert appears("1,187", "169 of 1187") and appears("14", "(14 %)") and not appears("14", "0.142")


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_prose_numbers_are_printed_by_the_notebook(notebook):
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    outputs = output_text(nb)
    allowed = DECLARED.get("*", set()) | DECLARED.get(notebook.name[:2], set())
    missing = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        for number in markdown_numbers("".join(cell["source"])):
            if number.replace(",", "") not in {a.replace(",", "") for a in allowed} and not appears(number, outputs):
                missing.append(f"cell {i}: {number}")
    assert not missing, (f"{notebook.name}: numbers in the prose that no output prints (print them from code, "
                         f"or declare them in {Path(__file__).name}):\n" + "\n".join(missing))
