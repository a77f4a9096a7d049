"""Files written safely (atomic replacement, the user's umask), and telling a hub id from
a local path.

The bottom of the package (it imports nothing of rookworld): checkpoints, redaction, the
run's reports and the model files all write through it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path


def is_hub_id(path: str) -> bool:
    """True when path reads as a hub id `owner/name` (one slash, no leading /, . or ~)
    rather than a local path."""
    return not path.startswith(("/", ".", "~")) and path.count("/") == 1


def file_mode() -> int:
    """The mode the user's umask gives a new file (0666 & ~umask)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def apply_umask(directory: Path) -> None:
    """Give every file under directory the mode the user's umask asks for: safetensors
    (and mkstemp) write their files 0600 whatever the umask."""
    mode = file_mode()
    for f in Path(directory).rglob("*"):
        if f.is_file():
            os.chmod(f, mode)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    """Write text to path through a temporary file of its own (unique per writer, so that
    writers racing on one path, such as torchrun's ranks, each replace it whole)."""
    _atomic_write(path, text, "w")


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """atomic_write_text for bytes: path holds its old content or data, never a part."""
    _atomic_write(path, data, "wb")


def _atomic_write(path: Path, content: str | bytes, mode: str) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode) as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, file_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def replace_dir(tmp: Path, final: Path) -> None:
    """Put the finished directory tmp at final: the old final is moved aside first, so that
    at every moment one whole copy sits at final or at its `.old` name beside it (where a
    pretraining resume also looks after a kill, `pretrain.resume_state`)."""
    old = final.with_name(f".{final.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)
