"""``python -m kvlib doctor``: each finding says what it checked; each failure comes with its fix."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kvlib.tools import doctor, integrity


def run_doctor(tmp_path, **env) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k != integrity.DATA_ENV} | env
    return subprocess.run([sys.executable, "-m", "kvlib", "doctor"], cwd=tmp_path, env=full, capture_output=True,
                          text=True, timeout=120)


def test_this_checkout_passes(tmp_path):
    out = run_doctor(tmp_path)
    assert out.returncode == 0, out.stdout
    assert "✗" not in out.stdout and f"✓ data: {integrity.find_data_dir()}" in out.stdout
    assert "✓ sha256: all" in out.stdout


def test_an_empty_data_folder_fails_with_the_fix(tmp_path):
    out = run_doctor(tmp_path, KVLIB_DATA=str(tmp_path))
    assert out.returncode == 1
    failed = [line for line in out.stdout.splitlines() if line.startswith("✗")]
    assert len(failed) == 1 and failed[0].startswith("✗ data:") and str(tmp_path) in failed[0]
    fix = out.stdout.splitlines()[out.stdout.splitlines().index(failed[0]) + 1]
    assert fix.strip().startswith("fix:") and integrity.DATA_ENV in fix


def test_a_changed_data_file_is_named(tmp_path, monkeypatch):
    import shutil

    for name in ("MANIFEST.json", "tang-char.tokenizer.json"):
        shutil.copyfile(integrity.DATA_DIR / name, tmp_path / name)
    (tmp_path / "tang-char.tokenizer.json").write_text("{}", encoding="utf-8")
    monkeypatch.setenv(integrity.DATA_ENV, str(tmp_path))
    sha = {f.topic: f for f in doctor.check_data()}["sha256"]
    assert sha.status == doctor.FAIL and "changed: tang-char.tokenizer.json; missing: " in sha.detail
    assert sha.fix


@pytest.mark.parametrize("kernel, lab, status", [("8.1.9", "3.0.17", doctor.OK), ("8.1.9", "1.1.11", doctor.FAIL),
                                                 ("7.8.5", "1.1.11", doctor.OK), ("8.1.9", None, doctor.FAIL)])
def test_widget_versions_of_kernel_and_front_end_must_pair(monkeypatch, kernel, lab, status):
    versions = {"ipywidgets": kernel, "jupyterlab_widgets": lab, "jupyterlab": "4.6.6"}
    monkeypatch.setattr(doctor, "installed", versions.get)
    [finding] = doctor.check_widgets("Jupyter")
    assert finding.status == status and (finding.fix != "") == (status == doctor.FAIL)


def test_colab_and_vs_code_draw_widgets_themselves(monkeypatch):
    monkeypatch.setattr(doctor, "installed", {"ipywidgets": "8.1.9"}.get)
    assert all(doctor.check_widgets(where)[0].status == doctor.OK for where in ("Colab", "VS Code"))


def test_a_library_older_than_its_range_fails_with_the_install_line(monkeypatch):
    monkeypatch.setattr(doctor, "declared_minimums", lambda: {"numpy": "1.24"})
    monkeypatch.setattr(doctor, "installed", {"numpy": "1.21.6"}.get)
    [finding] = doctor.check_libraries()
    assert finding.status == doctor.FAIL and finding.fix == "pip install 'numpy>=1.24'"


def test_versions_compare_by_their_numbers():
    assert doctor.release("2.13.0+cpu") == (2, 13, 0) and doctor.release("1.24") < doctor.release("1.26.4")
    assert doctor.release("10.0") > doctor.release("9.9.9")


def test_the_declared_ranges_are_read_from_the_installed_metadata():
    minimums = doctor.declared_minimums()
    assert {"torch", "numpy", "matplotlib", "ipywidgets"} <= minimums.keys()
    assert "jupyterlab" not in minimums  # an extra: Colab and VS Code bring their own front end


def test_a_notebook_whose_set_up_fails_shows_the_findings(monkeypatch, tmp_path):
    from kvlib.notebook import SetupFailed, setup

    monkeypatch.setattr(integrity, "DATA_DIR", tmp_path)
    monkeypatch.setenv(integrity.DATA_ENV, str(tmp_path))
    from kvlib.tools import loading
    monkeypatch.setattr(loading.load_pretrained, "__defaults__", ("tang-char", tmp_path))
    with pytest.raises(SetupFailed) as failed:
        setup("tang-char")
    lines = "\n".join(failed.value._render_traceback_())
    assert "set-up failed" in lines and "kvlib doctor" in lines and "✗ data:" in lines
