"""The notebooks in a real JupyterLab, driven by a real browser (headless Chromium via Playwright).

nbval re-executes cells but never touches a widget, so this test does what a teacher does: it
starts JupyterLab on a free loopback port with a temporary root and temporary settings (news and
update checks off), opens each notebook, runs all cells from the Run menu, and checks that every
code cell got an execution count, that no cell shows an error, and that a known output appears.
On notebook 2 it moves the temperature slider with the keyboard and checks that the poem changes;
on notebook 4 it presses Step three times and checks that the cache picture and the chosen
characters change. Screenshots go to ``artifacts/browser/``. The server is stopped by its PID.

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

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("0[1-6]_*.ipynb"))
ARTIFACTS = ROOT / "artifacts" / "browser"
CHROMIUM = Path("/usr/bin/chromium")
TOKEN = "kvlib-browser-test"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--lang=en-US"]
RUN_TIMEOUT_S = 300  # per notebook: a guard only; each runs in under a minute under nbval on an idle machine
CURRENT = ".jp-NotebookPanel:not(.lm-mod-hidden)"  # the notebook on show

# Text that must appear in each notebook's outputs once all cells ran (besides the last cell's RNG check).
KNOWN_OUTPUT = {
    "01": "57,603 poems in the corpus",
    "02": "p = 0.45: keeps [0]",
    "03": "punctuation at positions: [8, 16, 24, 32]",
    "04": "nbytes: 524,288 | equals 524,288: True",
    "05": "524,288",
    "06": "stream equals decode: True",
}
RNG_LINE = "global RNG untouched: True"


def _missing() -> str | None:
    if not CHROMIUM.exists():
        return f"{CHROMIUM} not found (apt-get install -y chromium fonts-noto-cjk)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -e .[test])"
    if not NOTEBOOKS:
        return "no notebooks/0[1-6]_*.ipynb to open"
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
        env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp / "config"), "JUPYTERLAB_SETTINGS_DIR": str(settings),
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
             *(["--allow-root"] if os.geteuid() == 0 else [])],
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


@pytest.fixture(scope="module")
def browser(lab, tmp_path_factory):
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=str(CHROMIUM), headless=True,
            args=CHROMIUM_FLAGS, viewport={"width": 1400, "height": 1600}, locale="en-US")
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
    known = KNOWN_OUTPUT.get(name[:2], RNG_LINE)
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


def move_temperature_slider(page, name: str) -> None:
    """Arrow keys on the temperature slider's handle, one press at a time, each time waiting until the
    explorer has redrawn for the new value, until the poem itself differs (a small step may draw the
    same characters from the same seed)."""
    slider = page.locator(f"{CURRENT} .widget-hslider").filter(
        has=page.locator(".widget-label", has_text=re.compile(r"^temperature$"))).first
    slider.scroll_into_view_if_needed()
    widget = outer_widget(slider)
    htmls = widget.locator(".widget-html-content")
    poem = lambda: htmls.nth(0).inner_text()  # noqa: E731  (the explorer's first HTML: the poem)
    shown = lambda: "\n".join(htmls.all_inner_texts())  # noqa: E731  (the poem and the settings line)
    readout = slider.locator(".widget-readout")
    before_poem, before_value = poem(), readout.inner_text()
    assert re.search(r"[\u4e00-\u9fff]", before_poem), f"no poem shown: {before_poem!r}"
    widget.screenshot(path=str(ARTIFACTS / f"{Path(name).stem}-slider-before.png"))
    handle = slider.locator(".noUi-handle")
    value, after_poem = before_value, before_poem
    for _ in range(16):
        handle.focus()
        page.keyboard.press("ArrowRight")
        value = wait_for_change(readout.inner_text, value, "the temperature readout")
        deadline = time.monotonic() + 60
        while f"temperature {value}," not in shown():  # the settings line follows the slider's value
            assert time.monotonic() < deadline, f"the explorer did not redraw for temperature {value}"
            time.sleep(0.2)
        after_poem = poem()
        if after_poem != before_poem:
            break
    assert float(value) > float(before_value)
    assert after_poem != before_poem, f"the poem did not change between temperature {before_value} and {value}"
    assert re.search(r"[\u4e00-\u9fff]", after_poem)
    widget.screenshot(path=str(ARTIFACTS / f"{Path(name).stem}-slider-after.png"))
    print(f"\n{name}: temperature {before_value} -> {value}; poem changed:\n  {before_poem!r}\n  {after_poem!r}")


def press_step_three_times(page, name: str) -> None:
    button = page.locator(f"{CURRENT} button.jupyter-button", has_text=re.compile(r"^\s*Step\s*$")).first
    button.scroll_into_view_if_needed()
    widget = outer_widget(button)
    status = lambda: "\n".join(widget.locator(".widget-html-content").all_inner_texts())  # noqa: E731
    picture = widget.locator("img").first
    length = lambda text: int(re.search(r"cache length (\d+)", text).group(1))  # noqa: E731
    text, png = status(), picture.screenshot()
    widget.screenshot(path=str(ARTIFACTS / f"{Path(name).stem}-step-0.png"))
    for k in range(1, 4):
        assert button.is_enabled()
        button.click()
        new_text = wait_for_change(status, text, f"the stepper's text after Step {k}")
        assert length(new_text) == length(text) + 1, (text, new_text)
        # The first line is the prompt and the characters chosen so far: one more token each Step.
        chosen_before, chosen_after = text.split("\n")[0].strip(), new_text.split("\n")[0].strip()
        assert chosen_after.startswith(chosen_before) and len(chosen_after) > len(chosen_before), (text, new_text)
        new_png = wait_for_change(picture.screenshot, png, f"the cache picture after Step {k}")
        widget.screenshot(path=str(ARTIFACTS / f"{Path(name).stem}-step-{k}.png"))
        text, png = new_text, new_png
    print(f"\n{name}: after three Steps: {text!r}")


@pytest.mark.parametrize("notebook", [nb.name for nb in NOTEBOOKS] or ["(none)"])
def test_notebook_runs_in_jupyterlab(lab, browser, notebook):
    started = time.monotonic()
    page = open_notebook(lab, browser, notebook)
    try:
        run_all(page)
        check_notebook_ran(lab, page, notebook)
        page.screenshot(path=str(ARTIFACTS / f"{Path(notebook).stem}.png"))
        if notebook.startswith("02"):
            move_temperature_slider(page, notebook)
        if notebook.startswith("04"):
            press_step_three_times(page, notebook)
    except BaseException:
        page.screenshot(path=str(ARTIFACTS / f"{Path(notebook).stem}-failure.png"))
        raise
    finally:
        page.close()
        lab.shutdown_sessions()
    print(f"\n{notebook}: {time.monotonic() - started:.1f} s in the browser")
