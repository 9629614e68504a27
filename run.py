"""Set up and run kvlib with nothing but Python: the same commands on Linux, macOS and Windows.

    python run.py lab        make .venv (exact tested versions), then open JupyterLab on notebooks/
    python run.py test       the same set-up, then every test
    python run.py restore    after class: the committed notebooks back
    python run.py doctor     what is wrong with this set-up, and the one-line fix
    python run.py colab SOURCE   where Colab installs kvlib from (a git+https address), in every notebook

Run it with the Python you want the venv made from (3.10 or newer; 3.11 is the tested one), for
example ``python3.11 run.py lab`` on Linux or macOS and ``py -3.11 run.py lab`` on Windows. It uses
only the standard library, so it works before anything is installed; ``make`` calls it too.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
LOCK = ROOT / "requirements-lock.txt"
LAB_SETTINGS = ROOT / "notebooks" / "jupyterlab-settings.json"
INPUTS = [ROOT / "pyproject.toml", LOCK, LAB_SETTINGS]  # a change to any of them redoes the set-up
EXTRAS = "lab,test,bench,data,server"
# The unit tests load only the plugin they use (xdist) and take pyproject's addopts without nbval's
# options: nbval's Jupyter imports and hypothesis's rewriting would cost every worker seconds.
UNIT_ARGS = ["--disable-plugin-autoload", "-p", "xdist.plugin", "-o", "addopts=-ra --import-mode=importlib"]


def venv_python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def run(*command, **kwargs) -> None:
    print("+", " ".join(str(c) for c in command), flush=True)
    code = subprocess.call([str(c) for c in command], cwd=ROOT, **kwargs)
    if code:
        sys.exit(code)


def fingerprint() -> str:
    h = hashlib.sha256(sys.version.encode())
    for path in INPUTS:
        h.update(path.read_bytes())
    return h.hexdigest()


def setup() -> Path:
    """Make ``.venv`` and install the project with the locked versions (skipped when nothing changed)."""
    if sys.version_info < (3, 10):
        sys.exit(f"kvlib needs Python 3.10 or newer; this is {sys.version.split()[0]} ({sys.executable}). "
                 "Run this file with a newer Python, e.g. python3.11 run.py ... or py -3.11 run.py ...")
    stamp = VENV / ".installed"
    python = venv_python()
    if python.exists() and stamp.exists() and stamp.read_text() == fingerprint():
        return python
    if not python.exists():
        run(sys.executable, "-m", "venv", VENV)
    run(python, "-m", "pip", "install", "--upgrade", "pip")
    run(python, "-m", "pip", "install", "-c", LOCK, "-e", f".[{EXTRAS}]")
    target = VENV / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(LAB_SETTINGS, target)  # no news pop-up, widget state saved with the notebooks
    stamp.write_text(fingerprint())
    return python


def lab(args: list[str]) -> None:
    """JupyterLab on notebooks/; extra arguments go to JupyterLab (e.g. --no-browser, --port 8899)."""
    run(setup(), "-m", "kvlib.tools.lab", ROOT / "notebooks", *args)


def test(args: list[str]) -> None:
    """The unit tests on every core, then the notebooks and the browser test one at a time."""
    python = setup()
    run(python, "-m", "pytest", "-n", "auto", "--dist", "worksteal", *UNIT_ARGS, "tests",
        "--ignore=tests/test_browser.py", *args)
    run(python, "-m", "pytest", "notebooks", "tests/test_browser.py", *args)


def notebooks(args: list[str]) -> None:
    """Re-execute every notebook in place (after retraining or a library change)."""
    run(setup(), "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute", "--inplace",
        *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "notebooks").glob("0*.ipynb")), *args)


def restore(args: list[str]) -> None:
    """The committed notebooks back (Run All and autosave rewrite their outputs).

    Not while a Jupyter server runs on this folder: its next autosave would write the old notebook back
    over the restored one ("File Changed"). ``--force`` restores anyway."""
    running = [] if "--force" in args else jupyter_servers_here()
    if running:
        sys.exit("JupyterLab is running on this folder (" + ", ".join(running) + "): its next autosave would write "
                 "the notebooks back. Stop it first (Ctrl+C twice in its terminal, or File > Shut Down), then run "
                 "python run.py restore again; or use python run.py restore --force and reload each open notebook "
                 "from disk (File > Reload Notebook from Disk) before saving anything.")
    run("git", "checkout", "--", "notebooks/")


def jupyter_servers_here(runtime_dir: Path | None = None) -> list[str]:
    """The Jupyter servers still running whose root folder is this checkout or inside it, as "pid N, URL"."""
    if runtime_dir is None:
        if not venv_python().exists():
            return []
        found = subprocess.run([str(venv_python()), "-m", "jupyter", "--runtime-dir"], capture_output=True, text=True)
        if found.returncode:
            return []
        runtime_dir = Path(found.stdout.strip())
    servers = []
    for info_file in sorted(Path(runtime_dir).glob("jpserver-*.json")):
        try:
            info = json.loads(info_file.read_text(encoding="utf-8"))
            root = Path(info["root_dir"]).resolve()
            os.kill(int(info["pid"]), 0)  # raises if that process is gone (a file left by a crash)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if root == ROOT or ROOT in root.parents:
            servers.append(f"pid {info['pid']}, {info.get('url', '')}".rstrip(", "))
    return servers


def wheel(args: list[str]) -> None:
    """A wheel with the data inside, in dist/: for Colab, lab machines, or pip install elsewhere."""
    run(setup(), "-m", "pip", "wheel", "--no-deps", "-w", ROOT / "dist", ROOT, *args)


def doctor(args: list[str]) -> None:
    """The doctor runs in .venv as it is, without a set-up first: the set-up may be what is broken."""
    if not venv_python().exists():
        sys.exit(f"there is no .venv in {ROOT} yet: run  python run.py setup  (or python run.py lab)")
    run(venv_python(), "-m", "kvlib", "doctor", *args)


COLAB_LINE = "KVLIB_SOURCE = "  # the line of every notebook's first cell that names where Colab installs from


def colab(args: list[str]) -> None:
    """Write SOURCE into every notebook's Colab cell; print the Colab links of a GitHub source."""
    if len(args) != 1 or not args[0].startswith(("git+https://", "https://")):
        sys.exit("usage: python run.py colab SOURCE, where SOURCE is the pip address of your copy of kvlib, "
                 "e.g. git+https://github.com/OWNER/REPO (a branch or tag may follow after @)")
    source = args[0]
    for path in sorted((ROOT / "notebooks").glob("0*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        cell = next(c for c in nb["cells"] if c["cell_type"] == "code")
        lines = [f"{COLAB_LINE}{source!r}\n" if line.startswith(COLAB_LINE) else line for line in cell["source"]]
        if lines == cell["source"] and not any(line.startswith(COLAB_LINE) for line in lines):
            sys.exit(f"{path.name}: its first code cell has no {COLAB_LINE!r} line")
        cell["source"] = lines
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"{path.name}: Colab installs kvlib from {source}")
    github = re.match(r"(?:git\+)?https://github\.com/([^/@]+/[^/@]+?)(?:\.git)?(?:@(.+))?$", source)
    if github:
        repo, ref = github.group(1), github.group(2) or "main"
        print("Open in Colab (after you push the notebooks):")
        for path in sorted((ROOT / "notebooks").glob("0*.ipynb")):
            print(f"  https://colab.research.google.com/github/{repo}/blob/{ref}/notebooks/{path.name}")


def kvlib_command(name: str):
    return lambda args: run(setup(), "-m", "kvlib", name, *args)


def clean(args: list[str]) -> None:
    for path in (VENV, ROOT / ".pytest_cache", ROOT / "dist"):
        shutil.rmtree(path, ignore_errors=True)


COMMANDS = {"setup": lambda args: setup(), "lab": lab, "test": test, "notebooks": notebooks, "restore": restore, "colab": colab,
            "wheel": wheel, "clean": clean, "doctor": doctor, "demo": kvlib_command("demo"),
            "bench": kvlib_command("bench")}


def main(argv: list[str]) -> None:
    if not argv or argv[0] not in COMMANDS:
        sys.exit(f"{__doc__}\nCommands: {', '.join(COMMANDS)}" + (f"\nunknown command {argv[0]!r}" if argv else ""))
    COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
