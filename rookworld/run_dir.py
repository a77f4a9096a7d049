"""Atomic checkpoints and the metrics file.

A checkpoint directory `checkpoints/step-XXXXXX` holds `model/` (safetensors,
config, tokenizer), `ref/` when the reference drifts (periodic sync), and
`state.pt` (optimiser, scheduler, KL controller, guards, RNG states, next step)
loaded with `torch.load(weights_only=True)`: nothing is unpickled. Each is
written to a temporary directory and renamed into place, and `latest` is
updated by rename, so a kill never leaves a half-written checkpoint that
would be loaded: `latest_checkpoint` only ever returns a complete `step-*`
directory (leftover `.tmp-step-*` / `.step-*.old` directories and a torn or
stale `latest` pointer are ignored). `manifest.json` holds the size and sha256
of every other file; a resume loads the newest checkpoint whose files match it,
names each file that does not, and stops with a clear error when none matches.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pickle
import random
import shutil
import sys
import time
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from .errors import ConfigError
from .files import apply_umask, atomic_write_text, replace_dir, sha256_file
from .redact import redact

LATEST = "latest"
MANIFEST = "manifest.json"  # {"files": {relative path: {"bytes": n, "sha256": hex}}}
WEIGHTS, WEIGHTS_INDEX = "model.safetensors", "model.safetensors.index.json"
RUN_CONFIG = "run_config.yaml"  # the run's own config (secrets masked), read by `resume=`
DISK_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}  # a full disk, a quota, a size limit


class RunDirTaken(ConfigError):
    """The run directory holds a run or is locked by a live one: refused before this
    command wrote anything there."""


def ensure_writable(run_dir: Path) -> None:
    """Create run_dir and prove a file can be written there, before anything runs."""
    probe = Path(run_dir) / ".write-probe"
    try:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"run directory {run_dir} is not writable ({e.strerror}); "
                          "set hydra.run.dir (or hydra.sweep.dir) to a writable place") from e


class RunLock:
    """An exclusive lock on a run directory (flock on `<run_dir>/.lock`, released by the
    kernel when the process ends, even by SIGKILL): a second run into the same directory
    is refused at once, naming the directory and the holder, instead of interleaving its
    rows and overwriting the first run's weights."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / ".lock"
        self.fd: int | None = None

    def __enter__(self) -> RunLock:
        import fcntl
        import socket
        import time

        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunDirTaken(f"run directory {self.path.parent} is in use by another run "
                              f"({holder}); wait for it to end, or pick another directory "
                              "(hydra.run.dir=...)") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since "
                      f"{time.strftime('%Y-%m-%d %H:%M:%S')}".encode(), 0)
        self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor releases the lock
            self.fd = None


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": list(random.getstate()[1])}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate((3, tuple(int(x) for x in state["python"]), None))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class CheckpointError(RuntimeError):
    """A checkpoint could not be written, or none of a run's can be trusted."""


def save_checkpoint(run_dir: Path, next_step: int, engine, extra: dict) -> Path:
    """Write checkpoint `next_step` (steps 0..next_step-1 are done) atomically."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{next_step:06d}"
    tmp = root / f".tmp-step-{next_step:06d}"
    for stale in [*root.glob(".tmp-step-*"), *root.glob(".step-*.old"),
                  *root.glob(".old-step-*")]:  # a killed save's copy moved aside (.old-step-*)
        shutil.rmtree(stale, ignore_errors=True)
    try:
        _write_checkpoint(tmp, next_step, engine, extra)
    except Exception as e:  # noqa: BLE001 - which of them is the disk's: below
        if not is_write_failure(e):  # a programming error stays itself
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(
            f"writing checkpoint {final.name} into {root} failed "
            f"({getattr(e, 'strerror', None) or e}); its "
            "temporary directory was removed and the earlier checkpoints are intact. Free "
            f"space, then continue with resume={Path(run_dir).resolve()}") from e
    replace_dir(tmp, final)  # re-saving a step after a resume: the old one moved aside first
    atomic_write_text(root / LATEST, final.name)
    return final


def _write_checkpoint(tmp: Path, next_step: int, engine, extra: dict) -> None:
    engine.model.save_pretrained(tmp / "model", safe_serialization=True)
    engine.policy.tokenizer.save_pretrained(tmp / "model")
    if engine.ref is not None and engine.settings.reference.sync_every:
        engine.ref.save_pretrained(tmp / "ref", safe_serialization=True)
    state = {"next_step": next_step, "engine": engine.state_dict(), "rng": rng_state(), **extra}
    torch.save(state, tmp / "state.pt")
    write_manifest(tmp)


def disk_full_error(e: BaseException) -> OSError | None:
    """The OSError of a full disk (or quota, or size limit) that e is or was raised from
    (`raise ... from`), if any; an error raised while handling one is itself."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, OSError) and e.errno in DISK_FULL:
            return e
        seen.add(id(e))
        e = e.__cause__
    return None


def is_write_failure(e: Exception) -> bool:
    """Whether a checkpoint write failed at the disk (full, a size limit): torch raises
    RuntimeError, safetensors SafetensorError, the tokenizers library a plain Exception
    naming the OS error."""
    return isinstance(e, (OSError, RuntimeError, SafetensorError)) or "os error" in str(e)


def write_manifest(directory: Path) -> None:
    """Seal a checkpoint directory: its files' sizes and sha256 in MANIFEST (written last,
    so a directory with a manifest is whole), each file synced to disk; `verify` checks it."""
    apply_umask(directory)
    atomic_write_text(directory / MANIFEST, json.dumps({"files": {
        str(f.relative_to(directory)): {"bytes": f.stat().st_size, "sha256": sha256_file(f)}
        for f in sorted(directory.rglob("*")) if f.is_file()}}, indent=1))
    for f in directory.rglob("*"):
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())


def step_of(path: Path) -> int:
    """A `step-*` checkpoint's step (the steps done before it), -1 for another name."""
    try:
        return int(path.name.removeprefix("step-"))
    except ValueError:
        return -1


def is_complete(path: Path) -> bool:
    """A checkpoint directory with its state and weights (one file or an index) in place."""
    return (path / "state.pt").is_file() and any(
        (path / "model" / name).is_file() for name in (WEIGHTS, WEIGHTS_INDEX))


def verify(path: Path) -> str | None:
    """None when every file of the checkpoint matches its manifest, else what does not
    (naming the file)."""
    try:
        files = json.loads((path / MANIFEST).read_text())["files"]
        assert isinstance(files, dict) and files
    except (OSError, ValueError, KeyError, TypeError, AssertionError):
        return f"{path / MANIFEST} is missing or unreadable"
    for rel, want in files.items():
        f = path / rel
        if not f.is_file():
            return f"{f} is missing"
        if f.stat().st_size != want.get("bytes") or sha256_file(f) != want.get("sha256"):
            return f"{f} does not match its manifest (size or sha256 differ: corrupted)"
    return None


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete `step-*` checkpoint of a run whose files match its manifest,
    or None when the run has none. Not read from the `latest` pointer alone: a kill
    between the rename of a checkpoint and the pointer update leaves the pointer one
    checkpoint behind, and a hand-edited or torn pointer must not send a resume back
    to step 0. A checkpoint that fails verification is named and skipped; when every
    one fails, CheckpointError says which files."""
    root = Path(run_dir) / "checkpoints"
    done = [p for p in root.glob("step-*") if step_of(p) >= 0 and is_complete(p)] \
        if root.is_dir() else []
    bad = []
    for path in sorted(done, key=step_of, reverse=True):
        problem = verify(path)
        if problem is None:
            if bad:
                print(f"[rookworld] resuming from {path.name}, the newest checkpoint that "
                      "verifies", flush=True)
            return path
        bad.append(problem)
        print(f"[rookworld] checkpoint {path.name} skipped: {problem}", flush=True)
    if bad:
        raise CheckpointError(
            f"no checkpoint in {root} verifies: " + "; ".join(bad)
            + ". Delete the damaged checkpoints (the run restarts from the newest one left, "
            "or from step 0) or start a new run.")
    return None


def read_weights(directory: Path) -> dict:
    """Every tensor of a safetensors checkpoint, one file or shards named by its index."""
    directory = Path(directory)
    if (directory / WEIGHTS).is_file():
        return load_file(str(directory / WEIGHTS))
    shards = json.loads((directory / WEIGHTS_INDEX).read_text())["weight_map"].values()
    return {k: v for name in sorted(set(shards)) for k, v in load_file(
        str(directory / name)).items()}


def load_weights(model, directory: Path) -> None:
    """Load safetensors weights into an existing model (rookworld's GPT-2:
    `gpt2.GPT2LMHeadModel.load_weights`; any other: by state-dict name, where a tied
    matrix may be absent); anything that does not fit raises ValueError."""
    weights = read_weights(directory)
    if hasattr(model, "load_weights"):
        model.load_weights(weights, str(directory))
        return
    own = model.state_dict(keep_vars=True)
    stored = {own[k].data_ptr() for k in weights if k in own}
    missing = sorted(k for k in set(own) - set(weights) if own[k].data_ptr() not in stored)
    unexpected = sorted(set(weights) - set(own))
    wrong = sorted(k for k in set(own) & set(weights) if own[k].shape != weights[k].shape)
    if missing or unexpected or wrong:
        raise ValueError(f"{directory}: weights do not fit the model: missing {missing}, "
                         f"unexpected {unexpected}, wrong shape {wrong}")
    with torch.no_grad():
        for k, v in weights.items():
            own[k].copy_(v)


def load_checkpoint(path: Path, engine) -> dict:
    """Restore model, reference, optimiser, scheduler, KL state; return the state dict."""
    try:
        state = torch.load(Path(path) / "state.pt", weights_only=True)
    except pickle.UnpicklingError as e:
        raise ValueError(f"{Path(path) / 'state.pt'} holds objects other than tensors and "
                         "plain data; refusing to unpickle it (torch.load weights_only=True). "
                         "Delete this checkpoint or resume from another run.") from e
    load_weights(engine.model, Path(path) / "model")
    if engine.ref is not None and (Path(path) / "ref").exists():
        load_weights(engine.ref, Path(path) / "ref")
    engine.load_state_dict(state["engine"])
    set_rng_state(state["rng"])
    return state


class MetricsFile:
    """JSON lines, one row per step (and per evaluation); each row is written with a
    single write and fsync, so a kill leaves at most one torn last line, which
    `read` skips."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def append(self, row: dict) -> None:
        """Append one row; a write that fails (a full disk) is cut back off the file, so
        that it leaves no torn line, and raises OSError naming the file."""
        data = memoryview((redact(json.dumps(row, default=float)) + "\n").encode())
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            size = os.fstat(fd).st_size
            try:
                while data:
                    data = data[os.write(fd, data):]
                os.fsync(fd)
            except OSError as e:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, size)
                raise OSError(e.errno, e.strerror, str(self.path)) from e
        finally:
            os.close(fd)

    def read(self) -> list[dict]:
        """The rows; a torn last line (a kill mid-write: it lacks its closing newline) is
        skipped, while any other line that is not JSON (the file was damaged) is an error
        naming it."""
        if not self.path.exists():
            return []
        rows = []
        text = self.path.read_text()
        lines = text.splitlines()
        for n, line in enumerate(lines, 1):
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                if n == len(lines) and not text.endswith("\n"):  # cut short by a kill
                    continue
                raise ValueError(f"{self.path}, line {n}: not JSON, and not a line a kill "
                                 "could have cut short (only an unterminated last line can "
                                 f"be): {line[:80]!r}; repair or remove that line, then run "
                                 "again") from None
            if not isinstance(row, dict) or not isinstance(row.get("step", -1), int):
                raise ValueError(f"{self.path}, line {n}: not a metrics row (a JSON object "
                                 f"with an integer step): {line[:80]!r}")
            rows.append(row)
        return rows

    def truncate_to(self, next_step: int) -> None:
        """Keep only rows of steps before next_step (used on resume), atomically."""
        keep = [r for r in self.read() if r.get("step", -1) < next_step]
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in keep))


def fold_into(new_dir: Path, run_dir: Path) -> None:
    """A resume writes into the run it continues: the directory Hydra made for the
    resuming command (holding only its .hydra/ record) moves into the run as
    .hydra-resumes/<name> and goes away, instead of leaving a dated folder per resume."""
    new_dir = new_dir.resolve()
    if new_dir == run_dir.resolve() or not new_dir.is_dir() \
            or {p.name for p in new_dir.iterdir()} - {".hydra"}:
        return
    dest = run_dir / ".hydra-resumes" / new_dir.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    if (new_dir / ".hydra").is_dir() and not dest.exists():
        shutil.move(new_dir / ".hydra", dest)  # copied where the run is on another filesystem
    import logging
    for h in logging.getLogger().handlers:  # train.log goes to the run's directory too
        if isinstance(h, logging.FileHandler) and Path(h.baseFilename).parent == new_dir:
            h.close()
            h.baseFilename = str(run_dir / Path(h.baseFilename).name)
    shutil.rmtree(new_dir, ignore_errors=True)


def set_aside_error(run_dir: Path) -> None:
    """A resume that trains moves the error.txt of the attempt it continues to
    .hydra-resumes/error-<time>.txt, so the run's own error.txt is always its latest
    attempt's and none sits beside a later success."""
    error = run_dir / "error.txt"
    if not error.is_file():
        return
    dest = run_dir / ".hydra-resumes" / time.strftime("error-%Y-%m-%d_%H-%M-%S.txt")
    dest.parent.mkdir(parents=True, exist_ok=True)
    n = 1
    while dest.exists():
        dest = dest.with_name(f"{dest.stem.split('.')[0]}.{n}.txt")
        n += 1
    os.replace(error, dest)


def named_dirs(argv: list[str], keys: tuple[str, ...]) -> list[tuple[str, str]]:
    """(key as typed, value) of each `key=value` on the command line that names one of keys
    with a literal path (no interpolation)."""
    return [(key, value) for key, _, value in (arg.partition("=") for arg in argv)
            if key.lstrip("+") in keys and value and "${" not in value]


def make_output_dirs(argv: list[str]) -> None:
    """Create a run or sweep directory named on the command line before Hydra does, so
    that one that cannot be made ends in a line naming the setting, not a traceback
    from inside Hydra."""
    for key, value in named_dirs(argv, ("hydra.run.dir", "hydra.sweep.dir")):
        try:
            Path(value).expanduser().mkdir(parents=True, exist_ok=True)
        except OSError as e:
            sys.exit(f"rookworld: {key}={value}: cannot create that directory "
                     f"({e.strerror or e}); pick a writable place")
