"""Integrity of what ships in ``data/`` and of how it is loaded.

- every shipped data file is in ``data/MANIFEST.json`` with the right sha256 and size, and nothing the
  manifest lists is missing;
- every loader checks a file's sha256 before reading it, and every checkpoint is read with
  ``torch.load(..., weights_only=True)`` (also checked in the source: no ``torch.load`` without it);
- the manifest machinery itself: atomic writes leave no temporary files, a damaged file is caught.

These tests read the shipped files but do not depend on their contents (the checkpoints may be
retrained); the tests that damage files work on copies in ``tmp_path``.
"""
from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import pytest
import torch

from kvlib.tools import corpus as data, integrity
from kvlib.tools.integrity import DATA_DIR, MANIFEST_NAME, IntegrityError, atomic_write, record, sha256_file, verified_path

ROOT = DATA_DIR.parent
KVLIB = ROOT / "kvlib"
NOT_IN_MANIFEST = {MANIFEST_NAME}  # plus licences and READMEs, which are text for people
MODELS = ("tang-char", "tang-bpe")


def shipped_files() -> list[str]:
    out = []
    for p in sorted(DATA_DIR.rglob("*")):
        if not p.is_file() or p.name.startswith("."):
            continue
        name = p.relative_to(DATA_DIR).as_posix()
        if name in NOT_IN_MANIFEST or p.name.startswith(("LICENSE", "README")):
            continue
        out.append(name)
    return out


# ---- the manifest matches data/ ----------------------------------------------------------------------

def test_every_shipped_data_file_is_in_the_manifest():
    manifest = integrity.read_manifest()
    unlisted = [name for name in shipped_files() if name not in manifest]
    assert not unlisted, f"data files without a manifest entry (run the command that makes them): {unlisted}"


@pytest.mark.parametrize("name", sorted(integrity.read_manifest()))
def test_every_manifest_entry_exists_with_its_sha256_and_size(name):
    entry = integrity.read_manifest()[name]
    path = DATA_DIR / name
    assert path.is_file(), f"{name} is in the manifest but missing from data/"
    assert path.stat().st_size == entry["bytes"]
    assert sha256_file(path) == entry["sha256"]


def test_no_half_written_files_in_data():
    assert not [p for p in DATA_DIR.rglob(".*.tmp")], "a temporary file from an interrupted write"


# ---- loaders check before they read ------------------------------------------------------------------

@pytest.fixture
def spies(monkeypatch):
    """Record every file whose sha256 is computed and every torch.load call's arguments."""
    hashed, loads = [], []
    real_hash, real_load = integrity.sha256_file, torch.load

    def hash_spy(path):
        hashed.append(Path(path).resolve())
        return real_hash(path)

    def load_spy(*args, **kwargs):
        loads.append((args, kwargs))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(integrity, "sha256_file", hash_spy)
    monkeypatch.setattr(torch, "load", load_spy)
    return hashed, loads


@pytest.mark.parametrize("name", MODELS)
def test_load_pretrained_checks_checkpoint_and_tokenizer_then_loads_weights_only(spies, name):
    from kvlib.tools.loading import load_pretrained

    hashed, loads = spies
    load_pretrained(name)
    assert (DATA_DIR / f"{name}.pt").resolve() in hashed
    assert (DATA_DIR / f"{name}.tokenizer.json").resolve() in hashed
    assert loads, "no checkpoint was loaded"
    for args, kwargs in loads:
        assert kwargs.get("weights_only") is True, f"torch.load{args} without weights_only=True"


def test_the_corpus_and_its_info_are_checked_before_reading(spies):
    hashed, _ = spies
    data.corpus_info()
    assert (DATA_DIR / data.INFO_FILE).resolve() in hashed
    hashed.clear()
    text = data.load_text()
    assert text.count("\n") == data.corpus_info()["poems"]["written"]
    assert (DATA_DIR / data.CORPUS_FILE).resolve() in hashed


def test_the_plot_font_is_checked_before_matplotlib_reads_it(spies):
    from kvlib.notebook import plots
    from kvlib.tools.fonts import FONT_FILE

    hashed, _ = spies
    plots.use_cjk_font()
    assert (DATA_DIR / FONT_FILE).resolve() in hashed


def test_training_resume_loads_its_state_weights_only(spies, tmp_path):
    from kvlib.tools.training import TrainConfig, train

    _, loads = spies
    poems = ["床前看月光，疑是地上霜。举头望山月，低头思故乡。"] * 40
    cfg = TrainConfig(steps=4, batch_size=2, block_size=8, n_layer=1, n_head=2, n_embd=16, warmup=1,
                      eval_every=2, eval_batches=1, save_every=2, seed=3,
                      out_dir=str(tmp_path / "out"), work_dir=str(tmp_path / "work"))
    train(cfg, poems=poems, progress=False)
    train(cfg, resume=True, poems=poems, progress=False)
    assert loads and all(kwargs.get("weights_only") is True for _, kwargs in loads)


# ---- the source never loads pickles freely -----------------------------------------------------------

def _calls(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield node


def _name(func: ast.AST) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return f"{_name(func.value)}.{func.attr}"
    return ""


@pytest.mark.parametrize("path", sorted(KVLIB.glob("*.py")), ids=lambda p: p.name)
def test_every_torch_load_in_kvlib_is_weights_only(path):
    for call in _calls(path):
        name = _name(call.func)
        if name.endswith("torch.load") or name == "load" and "torch" in ast.unparse(call.func):
            kw = {k.arg: k.value for k in call.keywords}
            assert "weights_only" in kw and isinstance(kw["weights_only"], ast.Constant) and \
                kw["weights_only"].value is True, f"{path.name}:{call.lineno}: {ast.unparse(call)}"
        assert not name.startswith(("pickle.", "marshal.", "shelve.", "dill.")), \
            f"{path.name}:{call.lineno}: {ast.unparse(call)}"


# ---- the manifest machinery ----------------------------------------------------------------------------

def test_atomic_write_leaves_the_old_file_when_the_writer_fails(tmp_path):
    target = tmp_path / "f.bin"
    target.write_bytes(b"old")

    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with atomic_write(target) as f:
            f.write(b"half of the new")
            raise Boom
    assert target.read_bytes() == b"old"
    assert list(tmp_path.iterdir()) == [target]


def test_record_then_verify_round_trip_and_damage_is_caught(tmp_path):
    for name in ("tang.json", MANIFEST_NAME):
        shutil.copyfile(DATA_DIR / name, tmp_path / name)
    (tmp_path / "extra.bin").write_bytes(b"\x00" * 100)
    record(tmp_path / "extra.bin", data_dir=tmp_path)
    assert verified_path("extra.bin", tmp_path) == tmp_path / "extra.bin"
    assert json.loads((tmp_path / MANIFEST_NAME).read_text())["extra.bin"]["bytes"] == 100
    (tmp_path / "extra.bin").write_bytes(b"\x00" * 99 + b"\x01")
    with pytest.raises(IntegrityError, match="extra.bin.*damaged or was changed"):
        verified_path("extra.bin", tmp_path)
    assert verified_path("tang.json", tmp_path)  # the other entries survived the rewrite


def test_special_files_are_refused_without_being_opened(tmp_path):
    """A FIFO would block open() forever and /dev/zero never ends: only stat is called, in a thread
    with a deadline so that a regression fails instead of hanging the suite."""
    import os
    import threading

    from kvlib.tools.integrity import DamagedFileError, check_regular_file

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    zero = tmp_path / "zero"
    zero.symlink_to("/dev/zero")
    outcomes = {}

    def attempt(path):
        try:
            check_regular_file(path)
        except DamagedFileError as e:
            outcomes[path] = str(e)

    for path in (fifo, zero, tmp_path):
        t = threading.Thread(target=attempt, args=(path,), daemon=True)
        t.start()
        t.join(timeout=10)
        assert not t.is_alive(), f"{path} blocked"
    assert "FIFO" in outcomes[fifo] and "a device" in outcomes[zero] and "a folder" in outcomes[tmp_path]
    (tmp_path / "ok").write_text("x")
    assert check_regular_file(tmp_path / "ok") == tmp_path / "ok"


def test_stale_temporaries_are_removed_by_name_and_age(tmp_path):
    import os
    import time

    from kvlib.tools.integrity import remove_stale_temporaries

    mine, theirs, fresh = (tmp_path / ".a.pt.x1.tmp", tmp_path / ".b.pt.y2.tmp", tmp_path / ".MANIFEST.json.z3.tmp")
    keep = tmp_path / "a.pt"
    for p in (mine, theirs, fresh, keep):
        p.write_text("x")
    old = time.time() - 3600
    os.utime(mine, (old, old))
    assert remove_stale_temporaries(tmp_path, ["a.pt"]) == [mine]
    assert remove_stale_temporaries(tmp_path, ["MANIFEST.json"], older_than=600) == []  # still being written?
    assert theirs.exists() and fresh.exists() and keep.exists()


# ---- where the data is found ----------------------------------------------------------------------------

def run_python(code: str, cwd: Path, **env) -> "subprocess.CompletedProcess":
    import os
    import subprocess
    import sys

    full = {k: v for k, v in os.environ.items() if k != integrity.DATA_ENV} | env
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=full, capture_output=True, text=True, timeout=120)


def test_the_checkout_finds_its_data_beside_the_package(monkeypatch):
    monkeypatch.delenv(integrity.DATA_ENV, raising=False)
    assert integrity.find_data_dir() == ROOT / "data"
    assert [how for how, _ in integrity.data_places()] == ["inside the installed package", "beside the package, in a checkout"]


def test_the_data_variable_is_the_only_place_looked_at_when_set(tmp_path, monkeypatch):
    monkeypatch.setenv(integrity.DATA_ENV, str(tmp_path))
    assert integrity.data_places() == [(f"the {integrity.DATA_ENV} environment variable", tmp_path)]
    assert integrity.find_data_dir() == tmp_path  # empty, but named on purpose: reported, never replaced


def test_a_data_variable_naming_an_empty_folder_lists_where_it_looked_and_the_fix(tmp_path):
    out = run_python("import kvlib; kvlib.load_pretrained('tang-char')", cwd=tmp_path, KVLIB_DATA=str(tmp_path))
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert "IntegrityError" in last and str(tmp_path) in last and integrity.DATA_ENV in last.split("Fix:")[1]


def test_a_data_variable_naming_a_copy_loads_from_the_copy(tmp_path):
    for name in ("MANIFEST.json", "tang-char.pt", "tang-char.tokenizer.json"):
        shutil.copyfile(DATA_DIR / name, tmp_path / name)
    code = "from kvlib.tools import integrity; import kvlib; kvlib.load_pretrained('tang-char'); print(integrity.DATA_DIR)"
    out = run_python(code, cwd=tmp_path, KVLIB_DATA=str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(tmp_path)


def test_a_folder_without_a_manifest_is_named_as_such(tmp_path):
    shutil.copyfile(DATA_DIR / "tang-char.pt", tmp_path / "tang-char.pt")
    with pytest.raises(IntegrityError, match=MANIFEST_NAME):
        verified_path("tang-char.pt", tmp_path)


@pytest.mark.parametrize("name", ["../secret.pt", "fonts/../../secret.pt", "/etc/passwd"])
def test_a_manifest_entry_outside_the_data_folder_is_refused(tmp_path, name):
    folder = tmp_path / "data"
    folder.mkdir()
    (tmp_path / "secret.pt").write_bytes(b"not data")
    manifest = {name: {"sha256": sha256_file(tmp_path / "secret.pt"), "bytes": 8}}
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest), encoding="utf-8")
    with pytest.raises(IntegrityError, match="leaves the data folder"):
        verified_path(name, folder)


def test_the_wheel_carries_the_data_and_the_classroom_css():
    """pyproject maps data/ to kvlib/data: every manifest entry and the CSS are package data."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    assert tool["package-dir"]["kvlib.data"] == "data"
    folders = {Path(name).parent.as_posix() for name in integrity.read_manifest()}
    packages = {("kvlib.data" + ("" if f == "." else "." + f.replace("/", "."))) for f in folders}
    assert packages <= set(tool["packages"]) and all(tool["package-data"][p] == ["*"] for p in packages)
    assert "kvlib.notebook.jupyterlab" in tool["packages"]
    code = {".".join(p.parent.relative_to(ROOT).parts) for p in KVLIB.rglob("*.py") if "__pycache__" not in p.parts}
    assert code <= set(tool["packages"]), f"packages a wheel would leave out: {sorted(code - set(tool['packages']))}"
