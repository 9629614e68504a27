"""The notebooks exported to HTML and read offline: under every widget, its static copy.

``jupyter nbconvert --to html`` (nbviewer, course sites) draws a widget view with scripts from the
network and nothing without them, so every widget is followed by an ordinary HTML output, its static
copy (:class:`kvlib.notebook.show.LiveWidget`). The fast test reads the saved outputs; the browser test
exports each committed notebook with nbconvert's ``HTMLExporter`` (nothing is executed), opens it in
headless Chromium with every network request refused, and checks that the copy is on screen in each
widget cell. It needs ``/usr/bin/chromium`` and ``playwright``, as ``tests/test_browser.py`` does:
without them it is skipped, saying why, or fails under ``KVLIB_REQUIRE_BROWSER=1``.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kvlib.notebook.show import STATIC_CLASS, STATIC_NOTE

from ..chromium import CHROMIUM, CHROMIUM_FLAGS, chromium_missing

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("0*.ipynb"))
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def widget_cells(notebook: Path) -> list[dict]:
    """The code cells of ``notebook`` whose saved outputs include a widget view."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    return [c for c in cells if any(WIDGET_VIEW in o.get("data", {}) for o in c.get("outputs", []))]


def is_static_copy(output: dict) -> bool:
    data = output.get("data", {})
    return (output.get("output_type") == "display_data" and WIDGET_VIEW not in data
            and STATIC_CLASS in "".join(data.get("text/html", "")))


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_every_widget_is_followed_by_a_separate_static_copy(notebook):
    """Right after each widget view (which holds no HTML), a display_data of its own holds the copy.

    Right after: the classroom CSS hides the copy in JupyterLab only when the output before it is a widget.
    """
    for cell in widget_cells(notebook):
        outputs = cell["outputs"] + [{}]
        for out, after in zip(outputs, outputs[1:]):
            if WIDGET_VIEW in out.get("data", {}):
                where = f"{notebook.name}, cell {cell.get('id')}"
                assert "text/html" not in out["data"], f"{where}: the widget's output carries HTML; run it again"
                assert is_static_copy(after), f"{where}: no static copy right under the widget; run it again"




@pytest.fixture(scope="module")
def offline_page():
    """A headless Chromium page that refuses every request other than file: and data: URLs."""
    reason = chromium_missing()
    if reason and os.environ.get("KVLIB_REQUIRE_BROWSER") == "1":
        pytest.fail(f"export test required (KVLIB_REQUIRE_BROWSER=1) but cannot run: {reason}")
    if reason:
        pytest.skip(f"export test skipped: {reason}")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1280, "height": 720}, locale="en-US")
        page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(("file:", "data:"))
                   else route.abort())
        yield page
        browser.close()


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_an_offline_html_export_shows_every_static_copy(notebook, offline_page, tmp_path):
    import nbformat
    from nbconvert import HTMLExporter

    cells = widget_cells(notebook)
    if not cells:
        return
    body, _ = HTMLExporter().from_notebook_node(nbformat.read(notebook, as_version=4))
    exported = tmp_path / f"{notebook.stem}.html"
    exported.write_text(body, encoding="utf-8")
    offline_page.goto(exported.as_uri(), wait_until="load")
    for cell in cells:
        where = f"{notebook.name}, cell {cell['id']}"
        copy = offline_page.locator(f'[id="cell-id={cell["id"]}"] .{STATIC_CLASS}')
        assert copy.count(), f"{where}: the export has no static copy under the widget"
        shown = copy.first
        assert shown.is_visible(), f"{where}: the static copy is hidden"
        drawn = shown.inner_text().replace(STATIC_NOTE, "").strip() or shown.locator("img, svg").count()
        assert drawn, f"{where}: the static copy shows neither text nor a picture besides its note"
