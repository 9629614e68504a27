"""run.py, the set-up without make, and the Colab cell that starts every notebook."""
from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("0*.ipynb"))
FIND_SPEC = importlib.util.find_spec


def first_code_cell(path: Path) -> str:
    nb = json.loads(path.read_text(encoding="utf-8"))
    return "".join(next(c for c in nb["cells"] if c["cell_type"] == "code")["source"])


def run_py(*args, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(cwd / "run.py"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60)


def test_every_notebook_starts_with_the_same_colab_cell():
    cells = {first_code_cell(p) for p in NOTEBOOKS}
    assert len(cells) == 1, "the Colab cells differ between notebooks"
    [cell] = cells
    assert 'KVLIB_SOURCE = ""' in cell and '"google.colab" in sys.modules' in cell


class Recorder:
    """What the cell asks IPython to run (%pip), instead of running it."""

    last = None

    def __init__(self):
        self.magics, self.namespace = [], {}
        Recorder.last = self

    def run_line_magic(self, name, line, _stack_depth=1):
        self.magics.append((name, line.format(**self.namespace)))  # IPython expands {names} the same way


def run_cell(source: str, on_colab: bool, has_kvlib: bool, monkeypatch) -> Recorder:
    from IPython.core.inputtransformer2 import TransformerManager

    shell = Recorder()
    if on_colab:
        monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: FIND_SPEC(name, *a) if name != "kvlib" or has_kvlib else None)
    code = TransformerManager().transform_cell(source)
    shell.namespace["get_ipython"] = lambda: shell
    exec(compile(code, "<colab cell>", "exec"), shell.namespace)
    return shell


def test_the_colab_cell_does_nothing_elsewhere(monkeypatch):
    assert run_cell(first_code_cell(NOTEBOOKS[0]), on_colab=False, has_kvlib=True, monkeypatch=monkeypatch).magics == []


def test_a_kernel_without_kvlib_is_told_to_choose_the_venv(monkeypatch):
    with pytest.raises(SystemExit, match=r"has no kvlib: choose the project's \.venv"):
        run_cell(first_code_cell(NOTEBOOKS[0]), on_colab=False, has_kvlib=False, monkeypatch=monkeypatch)


def test_on_colab_the_cell_installs_kvlib_once_without_pinning_torch(monkeypatch):
    source = first_code_cell(NOTEBOOKS[0]).replace('KVLIB_SOURCE = ""', 'KVLIB_SOURCE = "git+https://example.org/k.git"')
    with pytest.raises(SystemExit, match="has no kvlib"):  # the fake install installs nothing
        run_cell(source, on_colab=True, has_kvlib=False, monkeypatch=monkeypatch)
    shell = Recorder.last
    assert shell.magics == [("pip", "install --quiet git+https://example.org/k.git")]
    assert run_cell(source, on_colab=True, has_kvlib=True, monkeypatch=monkeypatch).magics == []  # installed already


def test_on_colab_without_a_source_the_cell_says_what_to_set(monkeypatch):
    with pytest.raises(SystemExit, match="Set KVLIB_SOURCE"):
        run_cell(first_code_cell(NOTEBOOKS[0]), on_colab=True, has_kvlib=False, monkeypatch=monkeypatch)


def test_the_package_ranges_keep_a_torch_that_colab_already_has():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    for requirement in project["dependencies"]:
        assert "==" not in requirement, f"an exact pin in the package's own dependencies: {requirement}"
    lock = (ROOT / "requirements-lock.txt").read_text(encoding="utf-8").splitlines()
    for name in ("torch", "numpy", "matplotlib", "ipywidgets", "jupyterlab"):
        assert any(line.lower().startswith(f"{name}==") for line in lock), f"{name} is not locked"


def test_run_py_colab_fills_every_notebook_and_prints_the_links(tmp_path):
    shutil.copy(ROOT / "run.py", tmp_path / "run.py")
    (tmp_path / "notebooks").mkdir()
    for p in NOTEBOOKS[:2]:
        shutil.copy(p, tmp_path / "notebooks" / p.name)
    out = run_py("colab", "git+https://github.com/teacher/kvlib@spring", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    for p in NOTEBOOKS[:2]:
        assert "KVLIB_SOURCE = 'git+https://github.com/teacher/kvlib@spring'" in first_code_cell(tmp_path / "notebooks" / p.name)
    assert f"https://colab.research.google.com/github/teacher/kvlib/blob/spring/notebooks/{NOTEBOOKS[0].name}" in out.stdout


def test_run_py_names_its_commands_and_refuses_an_unknown_one():
    out = run_py("lba")
    assert out.returncode != 0 and "unknown command 'lba'" in out.stderr and "lab" in out.stderr
    assert run_py("colab", "not-a-source").returncode != 0


def test_make_targets_are_run_py_commands():
    import re

    make = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = re.search(r"^lab test .*:$", make, re.M).group(0).rstrip(":").split()
    run = (ROOT / "run.py").read_text(encoding="utf-8")
    assert all(f'"{t}":' in run for t in targets), "every make target must be a run.py command"


def load_run_py():
    spec = importlib.util.spec_from_file_location("run_py", ROOT / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_restore_refuses_while_jupyter_runs_on_this_folder(tmp_path, monkeypatch, capsys):
    """Restoring under a running JupyterLab loses the restore at its next autosave ("File Changed")."""
    run_py_module = load_run_py()
    server = {"pid": __import__("os").getpid(), "root_dir": str(ROOT / "notebooks"), "url": "http://localhost:8888/"}
    (tmp_path / "jpserver-1.json").write_text(json.dumps(server))
    (tmp_path / "jpserver-2.json").write_text(json.dumps(server | {"root_dir": str(tmp_path)}))  # another folder
    (tmp_path / "jpserver-3.json").write_text(json.dumps(server | {"pid": 2**22 + 12345}))      # a crashed server
    assert run_py_module.jupyter_servers_here(tmp_path) == [f"pid {server['pid']}, http://localhost:8888/"]
    monkeypatch.setattr(run_py_module, "jupyter_servers_here", lambda: ["pid 1, http://localhost:8888/"])
    calls = []
    monkeypatch.setattr(run_py_module, "run", lambda *command: calls.append(command))
    with pytest.raises(SystemExit, match="JupyterLab is running on this folder"):
        run_py_module.restore([])
    assert calls == []
    run_py_module.restore(["--force"])
    assert calls == [("git", "checkout", "--", "notebooks/")]
