"""The reference run's lines: read beside this run's, recorded anew on request, and complete for each notebook."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvlib.notebook.reference import FOLDER, RECORD_ENV, Reference

ROOT = Path(__file__).resolve().parents[2]


def test_a_line_is_printed_with_the_reference_runs_line_under_it(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(RECORD_ENV, raising=False)
    (tmp_path / "nb.json").write_text(json.dumps({"machine": "machine: quiet", "lines": {"loops": "7.4x"}}))
    ref = Reference("nb", tmp_path)
    ref.show("loops", "5.1x")
    ref.show("other", "2.0x")
    assert capsys.readouterr().out.splitlines() == [
        "this run:      5.1x", "reference run: 7.4x", "this run:      2.0x", "reference run: none recorded for this line"]
    assert ref.describe() == "reference run: machine: quiet"


def test_recording_writes_every_line_with_this_machine(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(RECORD_ENV, "1")
    ref = Reference("nb", tmp_path)
    ref.show("a", "1.5x")
    ref.show("b", "3 ms")
    saved = json.loads((tmp_path / "nb.json").read_text())
    assert saved["lines"] == {"a": "1.5x", "b": "3 ms"} and saved["machine"].startswith("machine: ")
    assert "reference run:" not in capsys.readouterr().out


@pytest.mark.parametrize("name", ["", "../x", "a/b", 5])
def test_a_bad_notebook_name_is_refused(name):
    with pytest.raises((ValueError, TypeError), match="notebook"):
        Reference(name)


def test_every_line_a_notebook_shows_has_a_reference_figure():
    """A key a notebook passes to ``ref.show`` must be recorded in its reference file (run the notebooks with
    KVLIB_RECORD_REFERENCE=1 on a quiet machine after adding one)."""
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        code = "\n".join("".join(c["source"]) for c in json.loads(nb.read_text(encoding="utf-8"))["cells"]
                         if c["cell_type"] == "code")
        keys = set(re.findall(r"""ref\.show\(\s*f?["']([^"'{}]+)["']""", code))
        if "Reference(" not in code:
            continue
        saved = json.loads((FOLDER / f"{nb.stem}.json").read_text(encoding="utf-8"))
        assert keys and keys <= set(saved["lines"]), f"{nb.name}: no reference figure for {sorted(keys - set(saved['lines']))}"
