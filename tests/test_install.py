"""A plain install, as Colab, lab machines and ``pip install git+URL`` make it: a wheel built from the
repository, installed into a fresh venv outside the checkout, run from a folder that holds only a
notebook. It takes minutes (a venv with PyTorch), so it runs where ``KVLIB_INSTALL_TEST=1`` (CI sets it)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    os.environ.get("KVLIB_INSTALL_TEST") != "1",
    reason="builds a wheel and a fresh venv with PyTorch (minutes): set KVLIB_INSTALL_TEST=1 to run it")]


def run(*command, cwd, env=None, timeout=900) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("KVLIB_DATA", "VIRTUAL_ENV", "PYTHONPATH")}
    out = subprocess.run([str(c) for c in command], cwd=cwd, env=clean | (env or {}), capture_output=True,
                         text=True, timeout=timeout)
    return out


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(python of a fresh venv holding the wheel, a folder with only a copy of notebook 1)."""
    work = tmp_path_factory.mktemp("install")
    built = run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", work / "dist", ROOT, cwd=work)
    assert built.returncode == 0, built.stderr[-2000:]
    [wheel] = (work / "dist").glob("kvlib-*.whl")
    base = getattr(sys, "_base_executable", sys.executable)
    assert run(base, "-m", "venv", work / "venv", cwd=work).returncode == 0
    python = work / "venv" / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    done = run(python, "-m", "pip", "install", "-q", "-c", ROOT / "requirements-lock.txt", wheel, "nbconvert",
               "ipykernel", cwd=work)
    assert done.returncode == 0, done.stderr[-2000:]
    folder = work / "class"
    folder.mkdir()
    shutil.copy(ROOT / "notebooks" / "01_next_character.ipynb", folder)
    return python, folder


def test_the_wheel_finds_its_data_inside_the_package(installed):
    python, folder = installed
    code = ("import kvlib; from kvlib.tools import integrity; m, t = kvlib.load_pretrained('tang-char'); "
            "print(integrity.DATA_DIR); print(t.vocab_size)")
    out = run(python, "-c", code, cwd=folder)
    assert out.returncode == 0, out.stderr[-2000:]
    where, vocab = out.stdout.split()
    assert Path(where).parts[-2:] == ("kvlib", "data") and "site-packages" in where and int(vocab) > 7000


def test_the_doctor_passes_there_and_names_the_fix_for_an_empty_data_folder(installed, tmp_path):
    python, folder = installed
    ok = run(python, "-m", "kvlib", "doctor", cwd=folder)
    assert ok.returncode == 0 and "✗" not in ok.stdout, ok.stdout
    empty = run(python, "-m", "kvlib", "doctor", cwd=folder, env={"KVLIB_DATA": str(tmp_path)})
    assert empty.returncode == 1
    assert f"✗ data: kvlib's data (models, corpus, fonts) was not found: looked in {tmp_path}" in empty.stdout
    assert "fix: point KVLIB_DATA at a folder that holds MANIFEST.json" in empty.stdout


def test_notebook_1_runs_from_a_folder_that_holds_only_the_notebook(installed):
    python, folder = installed
    out = run(python, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute", "--output", "executed.ipynb",
              "01_next_character.ipynb", cwd=folder, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    nb = json.loads((folder / "executed.ipynb").read_text(encoding="utf-8"))
    errors = [o for c in nb["cells"] for o in c.get("outputs", []) if o["output_type"] == "error"]
    assert not errors
    last = "".join("".join(o.get("text", "")) for o in nb["cells"][-1]["outputs"])
    assert "global RNG untouched: True" in last
