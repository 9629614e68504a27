"""Files that are never half-written and never silently changed.

Every shipped file under ``data/`` has its sha256 in ``data/MANIFEST.json``. Writers go through
:func:`atomic_write` (temporary file in the same folder, fsync, rename) so a crash leaves either the
old file or the new one, never a torn one.

Where the data is: :func:`data_places` lists the folders looked at, in order: the one named by the
``KVLIB_DATA`` environment variable (used alone when set), ``kvlib/data`` inside an installed wheel
(the build copies the repository's ``data/`` there), and ``data/`` beside the package in a checkout
or an editable install. ``DATA_DIR`` is the first that holds a manifest.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

MANIFEST_NAME = "MANIFEST.json"
DATA_ENV = "KVLIB_DATA"
PACKAGE_DIR = Path(__file__).resolve().parents[1]


def data_places() -> list[tuple[str, Path]]:
    """(how it was chosen, folder) for every place the shipped data may be, in the order looked at."""
    named = os.environ.get(DATA_ENV)
    if named:
        return [(f"the {DATA_ENV} environment variable", Path(named).expanduser())]
    return [("inside the installed package", PACKAGE_DIR / "data"),
            ("beside the package, in a checkout", PACKAGE_DIR.parent / "data")]


def find_data_dir() -> Path:
    """The first place of :func:`data_places` that holds a manifest (else the last one, to be reported)."""
    places = data_places()
    return next((folder for _, folder in places if (folder / MANIFEST_NAME).is_file()), places[-1][1])


def data_fix() -> str:
    """What to do when the shipped data is not found, one line."""
    if os.environ.get(DATA_ENV):
        return (f"point {DATA_ENV} at a folder that holds {MANIFEST_NAME} (a kvlib checkout's data/ folder), "
                f"or unset it to use the data installed with kvlib")
    return ("reinstall kvlib from the repository (pip install --force-reinstall <the repository or its wheel>), "
            f"or set {DATA_ENV} to a kvlib checkout's data/ folder")


def data_not_found() -> str:
    looked = "; ".join(f"{folder} ({how})" for how, folder in data_places())
    return f"kvlib's data (models, corpus, fonts) was not found: looked in {looked}. Fix: {data_fix()}"


DATA_DIR = find_data_dir()


class IntegrityError(RuntimeError):
    """A data file is missing or differs from the sha256 recorded for it."""


class DamagedFileError(IntegrityError, ValueError):
    """A data file that can be read (its sha256 may even match) but whose content is not what it should be."""


def check_regular_file(path: str | os.PathLike, what: str = "file") -> Path:
    """``path`` exists and is a regular file (after symlinks): never a FIFO, a device or a folder.

    Only ``stat`` is called, so a FIFO or ``/dev/zero`` is refused without being opened (opening a
    FIFO blocks; reading a device never ends).
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"a {what} path must be a str or a path, got {type(path).__name__}")
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise IntegrityError(f"{path} is missing (restore it with git, or rerun the command that makes it)") from None
    except OSError as e:
        raise IntegrityError(f"{path} cannot be read: {e.strerror}") from None
    if not stat.S_ISREG(mode):
        kind = ("a folder" if stat.S_ISDIR(mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(mode)
                else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode)
                else "not a regular file")
        raise DamagedFileError(f"{path} is {kind}; a {what} must be a regular file")
    return path


TMP_PATTERN = re.compile(r"^\.(?P<name>.+)\.[^.]+\.tmp$")


def remove_stale_temporaries(folder: str | os.PathLike, names=None, older_than: float = 0.0) -> list[Path]:
    """Delete what a killed :func:`atomic_write` left in ``folder`` (``.<name>.<random>.tmp``).

    ``names`` limits it to temporaries of those file names (other writers may share the folder);
    ``older_than`` (seconds) spares files still being written by a live process.
    """
    folder, removed = Path(folder), []
    if not folder.is_dir():
        return removed
    now = time.time()
    for p in folder.iterdir():
        m = TMP_PATTERN.match(p.name)
        if not m or (names is not None and m.group("name") not in names):
            continue
        try:
            if p.is_file() and not p.is_symlink() and now - p.stat().st_mtime >= older_than:
                p.unlink()
                removed.append(p)
        except FileNotFoundError:
            pass
    return removed


def sha256_file(path: str | os.PathLike) -> str:
    check_regular_file(path)
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
    if not os.path.lexists(path):
        return {}
    check_regular_file(path, "manifest")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        reason = "nested too deeply" if isinstance(e, RecursionError) else str(e)
        raise DamagedFileError(f"{path} is not valid JSON ({reason}); restore it with git") from None
    if not isinstance(manifest, dict):
        raise DamagedFileError(f"{path} must map file names to {{'sha256': ..., 'bytes': ...}}, got a "
                               f"{type(manifest).__name__}; restore it with git")
    for name, entry in manifest.items():
        if not isinstance(entry, dict) or "sha256" not in entry:
            raise DamagedFileError(f"{path}: the entry for {name!r} must be {{'sha256': ..., 'bytes': ...}}, "
                                   f"got {entry!r:.60}; restore it with git")
        sha = entry["sha256"]
        if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise DamagedFileError(f"{path}: the sha256 of {name!r} must be 64 hex digits, got {sha!r:.70}; "
                                   f"restore it with git")
        size = entry.get("bytes", 0)
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise DamagedFileError(f"{path}: the size ('bytes') of {name!r} must be an int >= 0, got {size!r:.40}; "
                                   f"restore it with git")
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


def is_inside(path: Path, folder: Path) -> bool:
    """Whether ``path`` names a place inside ``folder`` once its ``..`` are worked out (a name, not where a
    symlink there points: that is the regular-file check's business)."""
    return Path(os.path.normpath(os.path.abspath(path))).is_relative_to(os.path.normpath(os.path.abspath(folder)))


def verified_path(name: str, data_dir: Path = DATA_DIR) -> Path:
    """Return ``data_dir / name`` after checking it against the manifest."""
    if not isinstance(data_dir, (str, os.PathLike)) or not isinstance(name, str):
        raise TypeError(f"verified_path takes a file name (str) and a data folder (a path), got "
                        f"{type(name).__name__} and {type(data_dir).__name__}")
    data_dir = Path(data_dir)
    path = data_dir / name
    if not os.path.lexists(data_dir / MANIFEST_NAME):
        if data_dir == DATA_DIR:
            raise IntegrityError(data_not_found())
        raise IntegrityError(f"{data_dir} holds no {MANIFEST_NAME}, so {name} cannot be checked: "
                             f"a data folder needs the manifest that lists every file's sha256")
    if not is_inside(path, data_dir):
        raise IntegrityError(f"{name!r} leaves the data folder {data_dir}: a data file's name must be a path inside it")
    entry = read_manifest(data_dir).get(name)
    if entry is None:
        raise IntegrityError(f"{name} is not listed in {data_dir / MANIFEST_NAME}")
    if not os.path.lexists(path) or (path.is_symlink() and not path.exists()):
        raise IntegrityError(f"{path} is missing (the manifest expects it; restore it with git)")
    check_regular_file(path, "data file")
    actual = sha256_file(path)
    if actual != entry["sha256"]:
        raise IntegrityError(
            f"{path} is damaged or was changed: sha256 {actual[:12]}... but the manifest "
            f"records {entry['sha256'][:12]}... (restore it with git, or rerun the command that makes it)"
        )
    return path
