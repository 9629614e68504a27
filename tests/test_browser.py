"""The notebooks in a real JupyterLab, driven by a real browser (headless Chromium via Playwright).

nbval re-executes cells but never touches a widget, so this test does what a teacher does: it
starts JupyterLab on a free loopback port with a temporary root and temporary settings (news and
update checks off), opens each notebook, checks that its saved widgets show before anything ran,
runs all cells from the Run menu, and checks that every code cell got an execution count, that no
cell shows an error, and that a known output appears. Then it uses the widgets as a teacher would
and measures, in the page, the time from a key press or click to the change of the output
(a MutationObserver): notebook 1's top-k slider and prompt box, notebook 2's temperature slider
(text and chart, which must both be on screen at 1280×720), notebook 4's Step, and the Step buttons
of notebooks 7 and 8. The medians are printed at the end (figures, not assertions: machines are
shared and noisy). Each notebook is then presented (View > Appearance > Presentation Mode at 1280×720, from the
first cell: body text, code and the tallest section measured) with its widgets used in that view,
its widgets are laid out with the file browser open and at 150 % zoom (no overflow, text >= 16 px),
and notebook 1 draws every vocabulary entry in the page's fonts. Screenshots at
1920×1080 and 1280×720 go to ``artifacts/browser/``. The server is stopped by its PID.

It needs Debian's ``chromium`` at ``/usr/bin/chromium`` and the ``playwright`` package (never
``playwright install``, which downloads a browser). Without them the test is skipped, saying why;
with ``KVLIB_REQUIRE_BROWSER=1`` (set by ``.ci/run``) it fails instead.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from kvlib.notebook import catalog
from kvlib.tools import lab as lab_setup

from .chromium import CHROMIUM, CHROMIUM_FLAGS, chromium_missing

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = [nb.path for nb in catalog.NOTEBOOKS]
ARTIFACTS = ROOT / "artifacts" / "browser"
TOKEN = "kvlib-browser-test"
RUN_TIMEOUT_S = 300  # per notebook: a guard only; each runs in under a minute under nbval on an idle machine
CURRENT = ".jp-NotebookPanel:not(.lm-mod-hidden)"  # the notebook on show

RNG_LINE = catalog.RNG_LINE
SIZES = {"1920x1080": (1920, 1080), "1280x720": (1280, 720)}
REPEATS = 7  # key presses or clicks per latency measurement
LATENCY: dict[str, list[float]] = {}  # what was measured -> milliseconds, printed at the end


def _missing() -> str | None:
    if chromium_missing():
        return chromium_missing()
    if not NOTEBOOKS:
        return "the notebook catalog is empty"
    return None


def _skip_or_fail(reason: str):
    if os.environ.get("KVLIB_REQUIRE_BROWSER") == "1":
        pytest.fail(f"browser test required (KVLIB_REQUIRE_BROWSER=1) but cannot run: {reason}")
    pytest.skip(f"browser test skipped: {reason}")


# ---- the JupyterLab server -----------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj), encoding="utf-8")


class Lab:
    def __init__(self, tmp: Path):
        self.root = tmp / "root"
        self.root.mkdir()
        for nb in NOTEBOOKS:
            shutil.copyfile(nb, self.root / nb.name)
        settings = tmp / "settings"
        # No news, no update checks, no extension manager (it would ask a package index), and every
        # cell kept in the page so that all prompts and outputs can be read.
        _write_json(settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings",
                    {"fetchNews": "false", "checkForUpdates": False})
        _write_json(settings / "@jupyterlab" / "extensionmanager-extension" / "plugin.jupyterlab-settings",
                    {"enabled": False})
        _write_json(settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings",
                    {"windowingMode": "none"})
        env = {**os.environ, **lab_setup.prepare(tmp / "config"), "JUPYTERLAB_SETTINGS_DIR": str(settings),
               "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces"), "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
               "JUPYTER_DATA_DIR": str(tmp / "data"), "IPYTHONDIR": str(tmp / "ipython"),
               "MPLCONFIGDIR": str(tmp / "mpl"), "JUPYTER_PLATFORM_DIRS": "1", "PYTHONUNBUFFERED": "1"}
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = open(tmp / "jupyterlab.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
             f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0", f"--ServerApp.root_dir={self.root}",
             f"--IdentityProvider.token={TOKEN}", "--ServerApp.terminals_enabled=False",
             "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate", "--LabApp.extension_manager=readonly",
             *lab_setup.arguments()],
            cwd=self.root, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.log_path = tmp / "jupyterlab.log"
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def api(self, path: str, method: str = "GET"):
        req = urllib.request.Request(f"{self.base}/api/{path}", method=method,
                                     headers={"Authorization": f"token {TOKEN}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read()
        return json.loads(body) if body else None

    def _wait_ready(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {self.proc.returncode}:\n{self.log_path.read_text()[-3000:]}")
            try:
                self.api("status")
                return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"JupyterLab did not answer within {timeout} s:\n{self.log_path.read_text()[-3000:]}")

    def kernel_state(self, name: str) -> str | None:
        for s in self.api("sessions"):
            if s.get("path") == name:
                return s["kernel"]["execution_state"]
        return None

    def shutdown_sessions(self) -> None:
        for s in self.api("sessions"):
            self.api(f"sessions/{s['id']}", method="DELETE")

    def stop(self) -> None:
        """Stop the server by its PID (it shuts its kernels down); kill what is left of its group."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # stray kernels of the group this test started
        except ProcessLookupError:
            pass
        self.log.close()


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    reason = _missing()
    if reason:
        _skip_or_fail(reason)
    server = Lab(tmp_path_factory.mktemp("lab"))
    yield server
    server.stop()


@pytest.fixture(scope="module", autouse=True)
def latency_report():
    """At the end of the module, the latencies go to a file; tests/conftest.py prints their medians."""
    yield
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    if LATENCY:
        (ARTIFACTS / "latency.json").write_text(json.dumps(LATENCY, indent=1), encoding="utf-8")
    if MEASURES:
        (ARTIFACTS / "sizes.json").write_text(json.dumps(MEASURES, indent=1, ensure_ascii=False), encoding="utf-8")


@pytest.fixture(scope="module")
def browser(lab, tmp_path_factory):
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=str(CHROMIUM), headless=True,
            args=CHROMIUM_FLAGS, viewport={"width": 1920, "height": 1080}, locale="en-US")
        context.set_default_timeout(30_000)
        yield context
        context.close()


# ---- driving a notebook ----------------------------------------------------------------------------

def open_notebook(lab: Lab, context, name: str):
    page = context.new_page()
    # ?reset: a fresh workspace, so no tab of an earlier notebook is restored (nor its kernel started)
    page.goto(f"{lab.base}/lab/tree/{name}?token={TOKEN}&reset", wait_until="domcontentloaded")
    page.locator(f"{CURRENT} .jp-Notebook .jp-Cell").first.wait_for(state="visible", timeout=60_000)
    tab = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current .lm-TabBar-tabLabel").first.inner_text()
    assert tab == name, f"the notebook shown is {tab!r}, not {name!r}"
    deadline = time.monotonic() + 60
    while lab.kernel_state(name) != "idle":
        assert time.monotonic() < deadline, f"the kernel of {name} did not start"
        time.sleep(0.3)
    return page


def run_all(page) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()


def prompts(page) -> list[str]:
    return page.locator(f"{CURRENT} .jp-CodeCell .jp-InputPrompt").all_inner_texts()


def wait_until_all_ran(lab: Lab, page, name: str) -> list[str]:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    time.sleep(1)
    while True:
        shown = prompts(page)
        done = shown and all(re.fullmatch(r"\s*\[\d+\]:\s*", p) for p in shown)
        if done and lab.kernel_state(name) == "idle":
            return shown
        if time.monotonic() > deadline:
            page.screenshot(path=str(ARTIFACTS / f"{Path(name).stem}-timeout.png"))
            pytest.fail(f"{name}: not every cell ran within {RUN_TIMEOUT_S} s; prompts {shown}")
        time.sleep(0.5)


def output_text(page) -> str:
    return "\n".join(page.locator(f"{CURRENT} .jp-OutputArea-output").all_inner_texts())


def save(page) -> None:
    page.locator(f"{CURRENT} .jp-Notebook").click(position={"x": 5, "y": 5})
    page.keyboard.press("Control+s")
    page.locator(".lm-TabBar-tab.jp-mod-dirty").first.wait_for(state="detached", timeout=30_000)


def check_notebook_ran(lab: Lab, page, name: str) -> str:
    """Every code cell numbered, no error shown or saved, the known outputs present; returns the text."""
    shown = wait_until_all_ran(lab, page, name)
    text = output_text(page)
    assert "Traceback (most recent call last)" not in text, f"{name}: a cell shows an error"
    assert "Error displaying widget" not in text and "Error rendering" not in text, f"{name}: a widget failed"
    errors = page.locator(f"{CURRENT} .jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']").all_inner_texts()
    assert not [e for e in errors if re.search(r"\w+Error\b.*Traceback|Traceback", e)], errors
    save(page)
    nb = json.loads((lab.root / name).read_text(encoding="utf-8"))
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert len(shown) == len(code)
    missing = [i for i, c in enumerate(code) if not isinstance(c.get("execution_count"), int)]
    assert not missing, f"{name}: code cells without an execution count: {missing}"
    errors = [(i, o.get("ename"), o.get("evalue")) for i, c in enumerate(code) for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors, f"{name}: error outputs {errors}"
    counts = [c["execution_count"] for c in code]
    assert counts == sorted(counts), f"{name}: cells ran out of order {counts}"
    known = catalog.by_file(name).known_output
    assert known in text, f"{name}: expected output {known!r} not shown"
    assert RNG_LINE in text, f"{name}: the last cell does not report the global RNG untouched"
    return text


def outer_widget(locator):
    """The outermost ipywidgets VBox around ``locator``: the whole interactive widget."""
    return locator.locator("xpath=ancestor::div[contains(concat(' ', normalize-space(@class), ' '), ' widget-vbox ')][last()]")


def wait_for_change(read, before, what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = read()
        if now != before:
            return now
        time.sleep(0.2)
    pytest.fail(f"{what} did not change within {timeout} s")


# ---- latency, measured in the page ----------------------------------------------------------------

WATCH = """(el, key) => {
    window.__kvlib = window.__kvlib || {};
    const record = {t: null};
    record.observer = new MutationObserver(() => { if (record.t === null) record.t = performance.now(); });
    record.observer.observe(el, {subtree: true, childList: true, characterData: true, attributes: true});
    window.__kvlib[key] = record;
}"""


def timed(page, act, watched: dict, optional=(), timeout_ms: int = 60_000) -> dict[str, float]:
    """Milliseconds from ``act()`` until each watched element (name -> locator) first changed.

    An ``optional`` element may legitimately stay as it was (a chart whose rounded numbers did not
    move): it is given a few seconds after the others, and left out if it did not change.
    """
    for key, locator in watched.items():
        locator.evaluate(WATCH, key)
    start = page.evaluate("performance.now()")
    act()
    out = {}
    for key in sorted(watched, key=lambda k: k in optional):
        try:
            page.wait_for_function("k => window.__kvlib[k].t !== null", arg=key,
                                   timeout=3_000 if key in optional else timeout_ms)
        except Exception:
            if key not in optional:
                raise
        t = page.evaluate("k => { const r = window.__kvlib[k]; r.observer.disconnect(); return r.t; }", key)
        if t is not None:
            out[key] = t - start
    return out


def record(what: str, ms: float) -> None:
    LATENCY.setdefault(what, []).append(ms)


def slider_named(page, label: str):
    return page.locator(f"{CURRENT} .widget-hslider").filter(
        has=page.locator(".widget-label", has_text=re.compile(rf"^{re.escape(label)}$"))).first


def settle(page, seconds: float = 0.3) -> None:
    """Let the kernel finish the previous update before the next key press."""
    time.sleep(seconds)


def on_screen(page, locator) -> bool:
    """The element's top 200 px (or all of it) lie inside the viewport."""
    box, view = locator.bounding_box(), page.viewport_size
    return (box is not None and box["y"] >= 0 and box["y"] + min(box["height"], 200) <= view["height"]
            and box["x"] >= 0 and box["x"] + box["width"] <= view["width"])


def notebook_01(page, name: str) -> None:
    """The prompt box: top-k slider and a typed prompt, each redrawing the bars."""
    slider = slider_named(page, "top k")
    slider.scroll_into_view_if_needed()
    widget = outer_widget(slider)
    chart = widget.locator(".widget-html-content").last
    handle = slider.locator(".noUi-handle")
    for _ in range(REPEATS):
        handle.focus()
        ms = timed(page, lambda: page.keyboard.press("ArrowRight"), {"chart": chart})
        record("01 top-k slider -> bars", ms["chart"])
        settle(page)
    box = widget.locator("input[type='text']").first
    for text in ["白日依山尽", "床前明月光", "春风", "大漠孤烟直", "明月", "春眠不觉晓", "黄河"][:REPEATS]:
        box.fill(text)
        ms = timed(page, lambda: box.press("Enter"), {"chart": chart})
        record("01 prompt + Enter -> bars", ms["chart"])
        assert text in chart.inner_text()
        settle(page)
    widget.screenshot(path=str(ARTIFACTS / f"{Path(name).stem}-prompt-box.png"))


def notebook_02(page, name: str) -> None:
    """The explorer: the temperature slider redraws the poem and settings (text) and the bars (chart);
    at 1280×720 the sliders and the bars are on screen together."""
    slider = slider_named(page, "temperature")
    slider.scroll_into_view_if_needed()
    widget = outer_widget(slider)
    htmls = widget.locator(".widget-html-content")
    text, chart = htmls.first, htmls.last  # the settings line comes first, the bars last
    handle = slider.locator(".noUi-handle")
    readout = slider.locator(".widget-readout")
    before = widget.inner_text()
    for _ in range(REPEATS):
        value = readout.inner_text()
        handle.focus()
        ms = timed(page, lambda: page.keyboard.press("ArrowRight"), {"text": text, "chart": chart}, optional={"chart"})
        assert readout.inner_text() != value and f"temperature {readout.inner_text()}," in text.inner_text()
        record("02 temperature slider -> poem and settings", ms["text"])
        if "chart" in ms:
            record("02 temperature slider -> bars", ms["chart"])
        settle(page)
    assert widget.inner_text() != before, "the explorer did not change with the temperature"
    page.set_viewport_size({"width": 1280, "height": 720})
    time.sleep(0.5)
    widget.evaluate("el => el.scrollIntoView({block: 'start'})")
    time.sleep(0.5)
    assert on_screen(page, slider) and on_screen(page, chart), "at 1280x720 the sliders and bars are not both on screen"
    widget.screenshot(path=str(ARTIFACTS / f"{Path(name).stem}-explorer-1280x720.png"))


def step_widget(page, name: str, label: str, repeats: int = REPEATS, button_text: str = "Step") -> None:
    """Press a widget's Step (or Round) button; the widget's output must change every time."""
    button = page.locator(f"{CURRENT} button.jupyter-button",
                          has_text=re.compile(rf"^\s*{button_text}\s*$")).first
    button.scroll_into_view_if_needed()
    widget = outer_widget(button)
    html = widget.locator(".widget-html-content").last
    widget.screenshot(path=str(ARTIFACTS / f"{Path(name).stem}-step-0.png"))
    for k in range(1, repeats + 1):
        if not button.is_enabled():
            break
        before = widget.inner_text()
        ms = timed(page, lambda: button.click(), {"picture": html})
        record(f"{name[:2]} {label}", ms["picture"])
        wait_for_change(widget.inner_text, before, f"{name}: the widget after Step {k}")
        settle(page)
    widget.screenshot(path=str(ARTIFACTS / f"{Path(name).stem}-step-{k}.png"))


# ---- presenting, narrow windows, glyphs --------------------------------------------------------------

MEASURES: dict[str, dict] = {}  # notebook -> sizes measured while presenting and in narrow windows
SMALLEST_BODY_PX, SMALLEST_CODE_PX, SMALLEST_WIDGET_PX = 20, 16, 16
NARROW = {"1280x720 with the file browser open": (1280, 720, True),
          "150 % zoom of 1280x720": (853, 480, False)}  # a 150 % zoom leaves 853x480 CSS pixels

TEXT_SIZES = """() => {
    const nb = document.querySelector('%s .jp-Notebook');
    const px = els => Array.from(els).filter(e => e.offsetParent !== null && e.textContent.trim())
        .map(e => parseFloat(getComputedStyle(e).fontSize));
    const body = px(nb.querySelectorAll('.jp-MarkdownOutput p, .jp-MarkdownOutput li'));
    const code = px(nb.querySelectorAll('.jp-InputArea-editor .cm-line'));
    const headings = Array.from(nb.querySelectorAll('.jp-MarkdownCell')).filter(c => c.offsetParent !== null
        && c.querySelector('h1, h2')).map(c => c.getBoundingClientRect().top);
    const end = nb.getBoundingClientRect().bottom;
    const sections = headings.map((top, i) => (i + 1 < headings.length ? headings[i + 1] : end) - top);
    return {body: Math.min(...body), code: Math.min(...code), tallest_section: Math.max(...sections),
            sections: sections.length};
}""" % CURRENT

WIDGET_FIT = """() => {
    const out = [];
    let smallest = Infinity;
    for (const w of document.querySelectorAll('%s .jp-OutputArea-output > .jupyter-widgets')) {
        if (w.offsetParent === null) continue;
        const area = w.closest('.jp-OutputArea-output').getBoundingClientRect();
        const box = w.getBoundingClientRect();
        if (box.right > area.right + 1 || w.scrollWidth > w.clientWidth + 1)
            out.push(`widget ${Math.round(box.width)} px wide in an output ${Math.round(area.width)} px wide`);
        for (const e of w.querySelectorAll('*')) {
            const r = e.getBoundingClientRect();
            if (r.width && r.right > area.right + 1)
                out.push(`${e.tagName.toLowerCase()}.${e.className} reaches ${Math.round(r.right - area.left)} px of ${Math.round(area.width)}`);
            const own = Array.from(e.childNodes).some(n => n.nodeType === 3 && n.textContent.trim());
            if (own || ['INPUT', 'SELECT', 'BUTTON'].includes(e.tagName))
                smallest = Math.min(smallest, parseFloat(getComputedStyle(e).fontSize));
        }
    }
    return {overflow: out.slice(0, 10), smallest_px: smallest};
}""" % CURRENT


def command(page, menu: str, *items: str) -> None:
    """Choose a menu entry, e.g. View > Appearance > Presentation Mode."""
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(rf"^{menu}$")).click()
    for item in items:
        page.locator(".lm-Menu-itemLabel", has_text=re.compile(rf"^{re.escape(item)}$")).click()


def go_to_first_cell(page) -> None:
    """A click in the notebook's left margin, then Esc, Shift+Home, Esc: the first cell active and on screen
    (TEACHING.md gives these steps)."""
    page.locator(f"{CURRENT} .jp-Notebook").click(position={"x": 5, "y": 5})
    for key in ("Escape", "Shift+Home", "Escape"):
        page.keyboard.press(key)
    time.sleep(0.5)
    top = page.evaluate(f"document.querySelector('{CURRENT} .jp-WindowedPanel-outer').scrollTop")
    active = page.evaluate(f"Array.from(document.querySelectorAll('{CURRENT} .jp-Cell'))"
                           ".findIndex(c => c.classList.contains('jp-mod-active'))")
    assert (active, top <= 20) == (0, True), f"not at the first cell: cell {active} active, scrolled {top} px"


def present(page, name: str) -> None:
    """Presentation mode at 1280x720 from the first cell: text sizes checked, sections measured."""
    page.set_viewport_size({"width": 1280, "height": 720})
    command(page, "View", "Appearance", "Presentation Mode")
    page.locator(".jp-LabShell.jp-mod-presentationMode").wait_for(state="attached")
    go_to_first_cell(page)
    time.sleep(0.5)
    page.screenshot(path=str(ARTIFACTS / f"{Path(name).stem}-presenting.png"))
    sizes = page.evaluate(TEXT_SIZES)
    MEASURES.setdefault(name, {}).update(sizes)
    assert sizes["body"] >= SMALLEST_BODY_PX, f"{name}: body text {sizes['body']} px when presenting"
    assert sizes["code"] >= SMALLEST_CODE_PX, f"{name}: code {sizes['code']} px when presenting"


def stop_presenting(page) -> None:
    command(page, "View", "Appearance", "Presentation Mode")
    page.locator(".jp-LabShell.jp-mod-presentationMode").wait_for(state="detached")
    page.set_viewport_size({"width": 1920, "height": 1080})


def widgets_fit(page, name: str) -> None:
    """Every widget fits its output area with the file browser open and at 150 % zoom; text >= 16 px."""
    for label, (w, h, browser_open) in NARROW.items():
        page.set_viewport_size({"width": w, "height": h})
        if browser_open:
            page.locator(".jp-SideBar .lm-TabBar-tab[data-id='filebrowser']").click()
        time.sleep(1)
        fit = page.evaluate(WIDGET_FIT)
        slug = "file-browser" if browser_open else "zoom150"
        first = page.locator(f"{CURRENT} .jp-OutputArea-output > .jupyter-widgets").first
        first.scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / f"{Path(name).stem}-{slug}.png"))
        if browser_open:
            page.locator(".jp-SideBar .lm-TabBar-tab[data-id='filebrowser']").click()
        MEASURES.setdefault(name, {})[f"smallest widget text, {label}"] = fit["smallest_px"]
        assert not fit["overflow"], f"{name} at {label}: {fit['overflow']}"
        assert fit["smallest_px"] >= SMALLEST_WIDGET_PX, f"{name} at {label}: widget text {fit['smallest_px']} px"
    page.set_viewport_size({"width": 1920, "height": 1080})


GLYPHS = r"""async ([chars, family]) => {
    await document.fonts.load(`32px ${family}`, chars.join(''));
    await document.fonts.ready;
    const c = document.createElement('canvas');
    c.width = 40; c.height = 40;
    const ctx = c.getContext('2d', {willReadFrequently: true});
    ctx.font = `32px ${family}`;
    const picture = ch => { ctx.clearRect(0, 0, 40, 40); ctx.fillText(ch, 2, 32);
        const d = ctx.getImageData(0, 0, 40, 40).data; let h = 0;
        for (let i = 3; i < d.length; i += 4) h = (h * 31 + d[i]) >>> 0; return h; };
    const missing = [picture('\u{10FFFD}'), picture('\u{E000}'), picture(' ')];
    return chars.filter(ch => missing.includes(picture(ch)));
}"""


def every_vocabulary_entry_renders(page) -> None:
    """Each tang-char entry, as the widgets label it, is drawn with a glyph of the notebook's font stack."""
    from kvlib.notebook.fonts import char_label
    from kvlib.tools.loading import load_tokenizer
    from kvlib.tools.integrity import DATA_DIR, verified_path

    tok = load_tokenizer(verified_path("tang-char.tokenizer.json", DATA_DIR))
    labels = sorted({char_label(t) for t in tok.itos if t not in ("\n", "<unk>")})
    family = page.evaluate(f"getComputedStyle(document.querySelector('{CURRENT} .jp-RenderedHTMLCommon')).fontFamily")
    missing = [label for label in page.evaluate(GLYPHS, [labels, family]) if not label.startswith("U+")]
    MEASURES["vocabulary glyphs"] = {"drawn": len(labels) - len(missing), "of": len(labels)}
    assert not missing, f"{len(missing)} vocabulary entries have no glyph in the browser: {missing[:20]}"


def screenshots(page, name: str) -> None:
    for size, (w, h) in SIZES.items():
        page.set_viewport_size({"width": w, "height": h})
        time.sleep(0.5)
        page.screenshot(path=str(ARTIFACTS / f"{Path(name).stem}-{size}.png"))
    page.set_viewport_size({"width": 1920, "height": 1080})


def saved_widgets_show(page, name: str) -> None:
    """Before anything runs, the saved widget state draws the widgets (no "model not found")."""
    nb = json.loads((ROOT / "notebooks" / name).read_text(encoding="utf-8"))
    if "widgets" not in nb.get("metadata", {}):
        return
    time.sleep(2)
    text = output_text(page)
    assert "Error displaying widget" not in text, f"{name}: widgets before Run All: {text[:300]!r}"


INTERACT = {"prompt box": notebook_01, "temperature slider": notebook_02,
            "cache step": lambda page, name: step_widget(page, name, "Step -> cache picture"),
            "engine step": lambda page, name: step_widget(page, name, "engine Step -> block pool", 4),
            "speculative round": lambda page, name: step_widget(page, name, "speculative Round -> tokens", 4, "Round")}


@pytest.mark.parametrize("notebook", [nb.name for nb in NOTEBOOKS] or ["(none)"])
def test_notebook_runs_in_jupyterlab(lab, browser, notebook):
    started = time.monotonic()
    page = open_notebook(lab, browser, notebook)
    try:
        saved_widgets_show(page, notebook)
        run_all(page)
        check_notebook_ran(lab, page, notebook)
        screenshots(page, notebook)
        present(page, notebook)
        interaction = catalog.by_file(notebook).interaction
        if interaction:  # the widgets answer in the presenting view
            INTERACT[interaction](page, notebook)
        stop_presenting(page)
        if page.locator(f"{CURRENT} .jp-OutputArea-output > .jupyter-widgets").count():
            widgets_fit(page, notebook)
        if notebook.startswith("01"):
            every_vocabulary_entry_renders(page)
    except BaseException:
        page.screenshot(path=str(ARTIFACTS / f"{Path(notebook).stem}-failure.png"))
        raise
    finally:
        page.close()
        lab.shutdown_sessions()
    print(f"\n{notebook}: {time.monotonic() - started:.1f} s in the browser")
