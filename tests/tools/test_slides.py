"""Every notebook carries slide metadata that follows its headings."""
import json
from pathlib import Path

import pytest

from kvlib.tools.slides import slide_type, with_slides

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_the_rule():
    md = lambda s: {"cell_type": "markdown", "source": s}  # noqa: E731
    assert slide_type(md("text"), first=True) == "slide"
    assert slide_type(md("## 2. Section"), first=False) == "slide"
    assert slide_type(md("### detail"), first=False) == "subslide"
    assert slide_type(md("More prose"), first=False) == "-"
    assert slide_type(md("The end of one part.\n\n## 3. The next"), first=False) == "slide"
    assert slide_type({"cell_type": "code", "source": "## not a heading"}, first=False) == "-"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_every_cell_has_its_slide_type(notebook):
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    have = [c.get("metadata", {}).get("slideshow", {}).get("slide_type") for c in nb["cells"]]
    want = [c["metadata"]["slideshow"]["slide_type"] for c in with_slides(json.loads(json.dumps(nb)))["cells"]]
    assert have == want, f"{notebook.name}: run python -m kvlib.tools.slides"
    assert have.count("slide") >= 5, f"{notebook.name}: only {have.count('slide')} slides"
