"""The reference run: what a quiet machine printed for each timed line, shown beside this run's figure.

A timing read on a busy laptop (a class's video call, a browser with forty tabs) can say little, and a
lesson should not depend on it. So each timed line a notebook prints goes through :meth:`Reference.show`,
which prints this run's line and, under it, the line the reference run printed, with its machine::

    ref = Reference("05_timing_and_memory")
    ref.show("loops at 120", f"cached (fast) ran {ratio:.1f}x as fast as recompute")

The reference figures are kept in ``kvlib/notebook/reference_runs/<notebook>.json`` (shipped with the
package). ``KVLIB_RECORD_REFERENCE=1 python run.py notebooks`` on a quiet machine records them again.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from ..tools.integrity import write_json
from ..tools.timing import describe_machine, machine

RECORD_ENV = "KVLIB_RECORD_REFERENCE"
FOLDER = Path(__file__).with_name("reference_runs")


class Reference:
    """The reference run's lines of one notebook, read at start; recorded anew when ``KVLIB_RECORD_REFERENCE=1``."""

    def __init__(self, notebook: str, folder: Path = FOLDER):
        if not isinstance(notebook, str) or not notebook or "/" in notebook or "\\" in notebook:
            raise ValueError(f"notebook must be a notebook's file name without .ipynb, got {notebook!r}")
        self.path = Path(folder) / f"{notebook}.json"
        self.recording = os.environ.get(RECORD_ENV) == "1"
        if self.recording:
            self.machine, self.lines = describe_machine(machine()), {}
        else:
            saved = json.loads(self.path.read_text(encoding="utf-8")) if self.path.is_file() else {}
            self.machine, self.lines = saved.get("machine"), dict(saved.get("lines", {}))

    def show(self, key: str, line: str) -> None:
        """Print this run's ``line``, then the reference run's line for ``key`` (or record ``line`` as it)."""
        if not isinstance(key, str) or not key:
            raise TypeError(f"key must be a non-empty str naming the line, got {key!r}")
        print(f"this run:      {line}")
        if self.recording:
            self.lines[key] = line
            write_json(self.path, {"machine": self.machine, "lines": self.lines})
        elif key in self.lines:
            print(f"reference run: {self.lines[key]}")
        else:
            print("reference run: none recorded for this line")

    def describe(self) -> str:
        """One line: which machine the reference figures come from."""
        return f"reference run: {self.machine}" if self.machine else "no reference run recorded for this notebook"
