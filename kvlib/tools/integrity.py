"""Files that are never half-written and never silently changed.

Every shipped file under ``data/`` has its sha256 in ``data/MANIFEST.json``. Writers go through
:func:`atomic_write` (temporary file in the same folder, fsync, rename) so a crash leaves either the
old file or the new one, never a torn one.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parents[2] / "data"
MANIFEST_NAME = "MANIFEST.json"


class IntegrityError(RuntimeError):
    """A data file is missing or differs from the sha256 recorded for it."""


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb"):
    """Open a temporary file beside ``path``; on success rename it over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_write(path) as f:
        f.write(data)


def write_json(path: str | os.PathLike, obj) -> None:
    write_bytes(path, (json.dumps(obj, ensure_ascii=False, indent=2) + "\n").encode("utf-8"))


def read_manifest(data_dir: Path = DATA_DIR) -> dict[str, dict]:
    path = Path(data_dir) / MANIFEST_NAME
    if not path.exists():
        return {}
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise IntegrityError(f"{path} is not valid JSON ({e}); restore it with git") from None
    if not isinstance(manifest, dict) or not all(isinstance(v, dict) and "sha256" in v for v in manifest.values()):
        raise IntegrityError(f"{path} must map file names to {{'sha256': ..., 'bytes': ...}}; restore it with git")
    return manifest


def record(*paths: str | os.PathLike, data_dir: Path = DATA_DIR) -> None:
    """Write the sha256 and size of ``paths`` (files inside ``data_dir``) into the manifest."""
    data_dir = Path(data_dir)
    manifest = read_manifest(data_dir)
    for p in paths:
        p = Path(p)
        name = p.resolve().relative_to(data_dir.resolve()).as_posix()
        manifest[name] = {"sha256": sha256_file(p), "bytes": p.stat().st_size}
    write_json(data_dir / MANIFEST_NAME, dict(sorted(manifest.items())))


def verified_path(name: str, data_dir: Path = DATA_DIR) -> Path:
    """Return ``data_dir / name`` after checking it against the manifest."""
    data_dir = Path(data_dir)
    path = data_dir / name
    entry = read_manifest(data_dir).get(name)
    if entry is None:
        raise IntegrityError(f"{name} is not listed in {data_dir / MANIFEST_NAME}")
    if not path.exists():
        raise IntegrityError(f"{path} is missing (the manifest expects it; restore it with git)")
    actual = sha256_file(path)
    if actual != entry["sha256"]:
        raise IntegrityError(
            f"{path} is damaged or was changed: sha256 {actual[:12]}... but the manifest "
            f"records {entry['sha256'][:12]}... (restore it with git, or rerun the command that makes it)"
        )
    return path
