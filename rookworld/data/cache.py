"""Validated splits kept by content, so that a rerun skips validation.

The bundled train split (100,000 rows) takes a minute or more to validate on two cores
and under ten seconds to read back. A file's samples and defect report are kept under
ROOKWORLD_DATA_CACHE (default ~/.cache/rookworld/data; `off` disables it), keyed by the
file's bytes, its name, the load settings, the source of the code that validates
(rookworld/data/, rookworld/chess_tasks/) and python-chess's version: any change to one
of them validates again. The entries are pickles written by this code into the user's own
cache, the same trust as the native kernels' build cache; an unreadable entry is validated
again and replaced.
Processes that miss the same entry at once (parallel sweep trials, test workers) take turns
on a lock beside it: the first validates, the others read its entry.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import tempfile
from collections.abc import Callable
from functools import cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent
CODE_DIRS = (PACKAGE / "data", PACKAGE / "chess_tasks")


def cache_dir() -> Path | None:
    """Where entries go, or None when ROOKWORLD_DATA_CACHE is `off`."""
    setting = os.environ.get("ROOKWORLD_DATA_CACHE", "")
    if setting.lower() == "off":
        return None
    return Path(setting) if setting else Path.home() / ".cache" / "rookworld" / "data"


@cache
def code_digest() -> str:
    h = hashlib.sha256()
    for path in sorted(p for d in CODE_DIRS for p in d.rglob("*.py")):
        h.update(path.relative_to(PACKAGE).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def entry_path(root: Path, path: Path, settings: tuple) -> Path:
    import chess  # its rules validate the rows: another version validates again

    key = f"{code_digest()}\0{chess.__version__}\0{path}\0{settings!r}\0"
    h = hashlib.sha256(key.encode())
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return root / f"samples-{h.hexdigest()[:32]}.pkl"


def _read(entry: Path, kind: type, say: bool = True) -> object | None:
    """The entry's value, or None when it is missing, torn or of another type (said when
    `say`)."""
    try:
        with open(entry, "rb") as f:
            value = pickle.load(f)
        if isinstance(value, kind):
            return value
        raise TypeError(f"holds a {type(value).__name__}")
    except FileNotFoundError:
        return None
    except Exception as e:  # a torn or foreign entry: validate again and replace it
        if say:
            print(f"[rookworld] data cache entry {entry} unreadable ({type(e).__name__}: {e}); "
                  "validating the data again", flush=True)
        return None


@contextlib.contextmanager
def _turn(entry: Path):
    """An exclusive flock on `<entry>.lock` while held; nothing where it cannot be taken
    (a read-only cache, a system without flock): each process then validates on its own."""
    fd = None
    try:
        import fcntl
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(entry.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
    except (ImportError, OSError):
        if fd is not None:
            os.close(fd)
        fd = None
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)  # closing the descriptor releases the lock


def cached(path: Path, settings: tuple, load: Callable[[], object], kind: type) -> object:
    """load()'s result for the file at path under settings: read back from the cache when
    an entry of type `kind` is there, else computed and stored (best effort: a cache that
    cannot be written only costs the next run the validation again). A process that misses
    waits while another validates the same entry, then reads it."""
    root = cache_dir()
    if root is None:
        return load()
    entry = entry_path(root, path, settings)
    value = _read(entry, kind)
    if value is not None:
        return value
    with _turn(entry):
        value = _read(entry, kind, say=False)  # written while this process waited its turn
        return value if value is not None else _store(root, entry, load())


def _store(root: Path, entry: Path, value: object) -> object:
    tmp = None
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".tmp", dir=root)
        with os.fdopen(fd, "wb") as f:
            pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, entry)
        tmp = None
    except OSError as e:
        print(f"[rookworld] could not cache the validated data in {root} "
              f"({e.strerror or e}); the next run validates again", flush=True)
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
    return value
