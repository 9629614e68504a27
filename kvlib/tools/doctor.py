"""``python -m kvlib doctor``: what is wrong with this set-up, and the one-line fix for each thing.

It checks, without loading a model: the Python (version, ``lzma``), PyTorch (version, CPU or CUDA
build), the other libraries against the ranges kvlib declares, where the data was found and whether
every file matches its sha256, the widget packages of the kernel and of the front end, the Chinese
fonts a browser on this machine can use, and which front end runs the kernel. A notebook whose
set-up fails shows this report instead of a traceback (:func:`kvlib.notebook.setup`).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata

from . import integrity

OK, NOTE, FAIL = "ok", "note", "fail"
MARK = {OK: "✓", NOTE: "!", FAIL: "✗"}


@dataclass(frozen=True)
class Finding:
    topic: str
    status: str      # OK, NOTE (works, but worth knowing) or FAIL (something will not work)
    detail: str
    fix: str = ""    # one line, for NOTE and FAIL

    def line(self) -> str:
        return f"{MARK[self.status]} {self.topic}: {self.detail}" + (f"\n    fix: {self.fix}" if self.fix else "")


def release(version: str) -> tuple[int, ...]:
    """The leading numbers of a version string: '2.13.0+cpu' -> (2, 13, 0)."""
    return tuple(int(n) for n in re.findall(r"\d+", version.split("+")[0])[:3])


def declared_minimums() -> dict[str, str]:
    """{package: lowest version} from kvlib's installed metadata (its ``>=`` ranges, extras left out)."""
    try:
        requires = metadata.requires("kvlib") or []
    except metadata.PackageNotFoundError:
        return {}
    found = {}
    for req in requires:
        m = re.match(r"\s*([A-Za-z0-9_.-]+)\s*>=\s*([0-9.]+)\s*(;.*)?$", req)
        if m and "extra" not in (m.group(3) or ""):
            found[m.group(1).lower()] = m.group(2)
    return found


def installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def check_python() -> list[Finding]:
    version = ".".join(map(str, sys.version_info[:3]))
    found = [Finding("Python", OK, f"{version} at {sys.executable}") if sys.version_info >= (3, 10) else
             Finding("Python", FAIL, f"{version} at {sys.executable}; kvlib needs 3.10 or newer",
                     "make the venv with Python 3.11: python3.11 run.py setup (Windows: py -3.11 run.py setup)")]
    try:
        import lzma  # noqa: F401  the corpus is .xz
        found.append(Finding("lzma", OK, "this Python reads .xz files (the corpus)"))
    except ImportError:
        found.append(Finding("lzma", FAIL, "this Python was built without lzma, so the corpus (tang.txt.xz) cannot be read",
                             "install liblzma's headers (Debian: apt-get install liblzma-dev) and rebuild this "
                             "Python (pyenv install 3.11), or use another Python"))
    return found


def check_libraries() -> list[Finding]:
    found = []
    for name, lowest in declared_minimums().items():
        have = installed(name)
        if have is None:
            found.append(Finding(name, FAIL, "not installed", f"pip install '{name}>={lowest}'"))
        elif release(have) < release(lowest):
            found.append(Finding(name, FAIL, f"{have}, older than the {lowest} kvlib needs", f"pip install '{name}>={lowest}'"))
        else:
            found.append(Finding(name, OK, have))
    if not found:
        found.append(Finding("kvlib", NOTE, "kvlib is not installed as a package here (run from a checkout?), "
                             "so its version ranges cannot be checked", "pip install -e . (or python run.py setup)"))
    return found


def check_torch() -> Finding:
    try:
        import torch
    except Exception as e:  # noqa: BLE001  a broken torch fails in many ways
        return Finding("PyTorch build", FAIL, f"import torch failed: {e}",
                       "pip install -c requirements-lock.txt torch (or python run.py setup)")
    if torch.version.cuda is None:
        return Finding("PyTorch build", OK, f"{torch.__version__}, CPU build (what the notebooks use)")
    gpu = torch.cuda.is_available()
    return Finding("PyTorch build", NOTE if not gpu else OK,
                   f"{torch.__version__}, a CUDA {torch.version.cuda} build" +
                   ("" if gpu else " on a machine without a usable GPU: it works, on the CPU, but its GPU libraries "
                                   "take several GB that kvlib never uses"),
                   "" if gpu else "optional: install a CPU-only torch from PyTorch's CPU index (the 'CPU' row of "
                                  "the install selector on pytorch.org)")


def check_data() -> list[Finding]:
    places = integrity.data_places()
    folder = integrity.find_data_dir()
    manifest = folder / integrity.MANIFEST_NAME
    if not manifest.is_file():
        return [Finding("data", FAIL, integrity.data_not_found().split(". Fix:")[0], integrity.data_fix())]
    how = next(how for how, f in places if f == folder)
    found = [Finding("data", OK, f"{folder} ({how})")]
    try:
        entries = integrity.read_manifest(folder)
    except integrity.IntegrityError as e:
        return found + [Finding("sha256", FAIL, str(e), "restore data/MANIFEST.json with git, or reinstall kvlib")]
    missing, changed = [], []
    for name in entries:
        try:
            integrity.verified_path(name, folder)
        except (integrity.IntegrityError, OSError):
            (changed if (folder / name).is_file() else missing).append(name)
    if missing or changed:
        named = "; ".join(f"{what}: {', '.join(names[:4])}{' ...' if len(names) > 4 else ''}"
                          for what, names in (("changed", changed), ("missing", missing)) if names)
        return found + [Finding("sha256", FAIL, f"{len(missing) + len(changed)} of {len(entries)} files do not match "
                                f"the manifest ({named})", "git checkout -- data/ in a checkout; else reinstall kvlib")]
    return found + [Finding("sha256", OK, f"all {len(entries)} files match the manifest")]


def front_end() -> str:
    """Which program runs this Python: Colab, VS Code, Jupyter (Lab or Notebook) or a terminal."""
    if "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ:
        return "Colab"
    if any(k.startswith("VSCODE_") for k in os.environ):
        return "VS Code"
    if "JPY_SESSION_NAME" in os.environ or "JPY_PARENT_PID" in os.environ:
        return "Jupyter"
    return "a terminal"


def check_widgets(where: str) -> list[Finding]:
    kernel = installed("ipywidgets")
    if kernel is None:
        return [Finding("widgets", FAIL, "ipywidgets is not installed in this kernel", "pip install 'ipywidgets>=8'")]
    if where in ("Colab", "VS Code"):
        return [Finding("widgets", OK, f"ipywidgets {kernel}; {where} draws the widgets with its own front end")]
    lab = installed("jupyterlab_widgets")
    want = {7: 1, 8: 3}.get(release(kernel)[0])  # ipywidgets 7 pairs with jupyterlab_widgets 1, 8 with 3
    if lab is None:
        if installed("jupyterlab") is None:
            return [Finding("widgets", NOTE, f"ipywidgets {kernel}, and no JupyterLab here to check its front end",
                            "pip install 'kvlib[lab]' for JupyterLab, or open the notebooks where widgets are drawn")]
        return [Finding("widgets", FAIL, f"ipywidgets {kernel} but JupyterLab has no widget front end "
                        "(jupyterlab_widgets): widget cells show nothing", "pip install jupyterlab_widgets")]
    if want is not None and release(lab)[0] != want:
        return [Finding("widgets", FAIL, f"ipywidgets {kernel} in the kernel needs jupyterlab_widgets {want}.x in "
                        f"JupyterLab, found {lab}: widget cells say 'Error displaying widget'",
                        f"pip install 'ipywidgets=={release(kernel)[0]}.*' 'jupyterlab_widgets=={want}.*' and "
                        "restart JupyterLab")]
    return [Finding("widgets", OK, f"ipywidgets {kernel} with jupyterlab_widgets {lab}")]


def check_fonts(where: str) -> Finding:
    """Text outside the plots is drawn by the browser, with the machine's fonts (the plots bring their own)."""
    if where == "Colab":
        return Finding("Chinese fonts", OK, "Colab's page is drawn by your own browser, with your machine's fonts")
    if sys.platform in ("darwin", "win32"):
        return Finding("Chinese fonts", OK, "macOS and Windows ship Chinese fonts that browsers use")
    if shutil.which("fc-list") is None:
        return Finding("Chinese fonts", NOTE, "fc-list is missing, so the browser's fonts cannot be listed",
                       "if prose or widgets show boxes instead of Chinese: apt-get install fonts-noto-cjk")
    listed = subprocess.run(["fc-list", ":lang=zh", "family"], capture_output=True, text=True, timeout=30).stdout
    families = sorted({line.split(",")[0].strip() for line in listed.splitlines() if line.strip()})
    if not families:
        return Finding("Chinese fonts", NOTE, "no font with Chinese characters here: a browser on this machine "
                       "shows boxes in the prose and the widgets (the plots bring their own font)",
                       "sudo apt-get install fonts-noto-cjk (Fedora: sudo dnf install google-noto-sans-cjk-fonts)")
    return Finding("Chinese fonts", OK, f"{len(families)} families, e.g. {', '.join(families[:2])}")


def check_front_end() -> Finding:
    where = front_end()
    checkout = integrity.PACKAGE_DIR.parent
    venv = checkout / ".venv"
    if venv.is_dir() and (checkout / "run.py").is_file() and os.path.realpath(sys.prefix) != os.path.realpath(venv):
        return Finding("front end", NOTE, f"{where}, running {sys.executable}, not this checkout's .venv",
                       "choose .venv as the kernel (VS Code: Select Kernel > Python Environments > .venv)")
    return Finding("front end", OK, where)


def diagnose() -> list[Finding]:
    """Every finding, in the order they are printed."""
    where = front_end()
    return [*check_python(), check_torch(), *check_libraries(), *check_data(), *check_widgets(where),
            check_fonts(where), check_front_end()]


def report(findings: list[Finding]) -> str:
    failed = sum(f.status == FAIL for f in findings)
    verdict = "everything kvlib needs is in place" if not failed else f"{failed} problem(s) to fix, each with its fix"
    return "\n".join([f"kvlib doctor: {verdict}", *(f.line() for f in findings)])


def main() -> int:
    findings = diagnose()
    print(report(findings))
    return 1 if any(f.status == FAIL for f in findings) else 0
