"""JupyterLab as the notebooks expect it: ``python -m kvlib.tools.lab [folder]`` (what ``run.py lab`` runs).

JupyterLab reads ``custom/custom.css`` from its configuration folder when started with
``--LabApp.custom_css=True``. :func:`prepare` writes that folder inside the venv (the classroom CSS
of ``kvlib/notebook/jupyterlab/`` and the fallback fonts it names, each checked against the
manifest), so that the user's own ``~/.jupyter`` is left alone. The browser test starts its server
through the same two functions.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from .fonts import FALLBACK_FILES
from .integrity import PACKAGE_DIR, verified_path

NOTEBOOKS = PACKAGE_DIR.parent / "notebooks"  # in a checkout; an installed kvlib opens the current folder
CSS = Path(__file__).resolve().parents[1] / "notebook" / "jupyterlab" / "custom.css"
CONFIG_DIR = Path(sys.prefix) / "etc" / "kvlib-jupyter"


def prepare(config_dir: Path = CONFIG_DIR) -> dict[str, str]:
    """Write the custom CSS and its fonts under ``config_dir``; return the environment JupyterLab needs."""
    config_dir = Path(config_dir)
    custom = config_dir / "custom"
    custom.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(CSS, custom / "custom.css")
    for name in FALLBACK_FILES.values():
        shutil.copyfile(verified_path(name), custom / Path(name).name)
    return {"JUPYTER_CONFIG_DIR": str(config_dir)}


def arguments() -> list[str]:
    """The command-line options the notebooks rely on (the custom CSS; root allowed where one runs as root)."""
    return ["--LabApp.custom_css=True", *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else [])]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    env = {**os.environ, **prepare()}
    folder = [str(NOTEBOOKS)] if NOTEBOOKS.is_dir() else []
    command = [sys.executable, "-m", "jupyterlab", *arguments(), *(argv or folder)]
    if os.name == "nt":  # Windows has no exec: JupyterLab runs as a child until it stops
        return subprocess.call(command, env=env)
    os.execve(sys.executable, command, env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
