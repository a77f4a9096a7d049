"""File faults: half-written checkpoints and torn pointers are never read, a corrupted
checkpoint is named and the previous one used, torn metrics lines are skipped, racing
writers each replace a file whole, and written files follow the user's umask.
"""

import os
import shutil
import threading
from pathlib import Path

import pytest
import torch

from rookworld.config import compose
from rookworld.files import atomic_write_text
from rookworld.run_dir import (
    LATEST,
    MANIFEST,
    CheckpointError,
    MetricsFile,
    is_complete,
    latest_checkpoint,
    save_checkpoint,
)
from rookworld.train import build_engine, build_parts


@pytest.fixture
def tiny_engine(tiny_overrides):
    cfg = compose(tiny_overrides)
    parts = build_parts(cfg)
    from rookworld.config import instantiate
    return build_engine(cfg, parts, instantiate(cfg.reward))


def test_half_written_checkpoints_and_torn_pointer_are_ignored(tiny_engine, tmp_path):
    save_checkpoint(tmp_path, 1, tiny_engine, {})
    good = save_checkpoint(tmp_path, 2, tiny_engine, {})
    root = tmp_path / "checkpoints"
    # a kill mid-save leaves a temporary directory (here with a state but no weights) ...
    tmp = root / ".tmp-step-000003"
    shutil.copytree(good, tmp)
    (tmp / "model" / "model.safetensors").unlink()
    # ... a complete-looking name without weights cannot come from save_checkpoint,
    # but a hand-copied or half-deleted one must not be loaded either ...
    shutil.copytree(tmp, root / "step-000004")
    # ... and a torn or stale pointer
    for pointer in ("step-0000", "step-000004", "", "step-000003\n\x00"):
        (root / LATEST).write_text(pointer)
        assert latest_checkpoint(tmp_path) == good, repr(pointer)
    (root / LATEST).unlink()
    assert latest_checkpoint(tmp_path) == good
    assert not is_complete(root / "step-000004") and is_complete(good)
    # the next save removes leftovers of a killed save
    save_checkpoint(tmp_path, 3, tiny_engine, {})
    assert not tmp.exists() and latest_checkpoint(tmp_path).name == "step-000003"


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_written_files_follow_the_users_umask(tiny_engine, tmp_path, umask):
    from rookworld.policy import save_policy
    old = os.umask(umask)
    try:
        ckpt = save_checkpoint(tmp_path, 1, tiny_engine, {})
        save_policy(tiny_engine.policy, tmp_path / "exported")
    finally:
        os.umask(old)
    files = [f for d in (ckpt, tmp_path / "exported") for f in d.rglob("*") if f.is_file()]
    assert any(f.name == "model.safetensors" for f in files)
    assert {f.name: oct(f.stat().st_mode & 0o777) for f in files} \
        == {f.name: oct(0o666 & ~umask) for f in files}


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_writers_racing_on_one_file_each_replace_it_whole(tmp_path, umask):
    """torchrun's ranks write the run's side files (run_config.yaml, data_report.json) at
    the same moment: no writer may lose its temporary file to another."""
    path, errors = tmp_path / "run_config.yaml", []
    texts = [f"writer {i}\n" * 2000 for i in range(8)]

    def write(text):
        try:
            for _ in range(50):
                atomic_write_text(path, text)
        except OSError as e:
            errors.append(e)

    old = os.umask(umask)
    try:
        threads = [threading.Thread(target=write, args=(t,)) for t in texts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        os.umask(old)
    assert errors == []
    assert path.read_text() in texts and sorted(p.name for p in tmp_path.iterdir()) == [path.name]
    assert oct(path.stat().st_mode & 0o777) == oct(0o666 & ~umask)


def test_resaving_a_step_after_resume_replaces_it_whole(tiny_engine, tmp_path):
    first = save_checkpoint(tmp_path, 2, tiny_engine, {"marker": 1})
    with torch.no_grad():
        next(tiny_engine.model.parameters()).add_(1.0)
    again = save_checkpoint(tmp_path, 2, tiny_engine, {"marker": 2})
    assert again == first and sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) \
        == [LATEST, "step-000002"]
    state = torch.load(again / "state.pt", weights_only=True)
    assert state["marker"] == 2


def _flip(path: Path, offset: int, n: int = 64) -> None:
    data = bytearray(path.read_bytes())
    for i in range(offset, min(offset + n, len(data))):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


CORRUPTIONS = {  # name -> what it does to a checkpoint directory
    "weights: 64 bytes flipped mid-file": lambda c: _flip(
        c / "model" / "model.safetensors", (c / "model" / "model.safetensors").stat().st_size // 2),
    "weights: header bytes flipped": lambda c: _flip(c / "model" / "model.safetensors", 8, 16),
    "weights: truncated": lambda c: os.truncate(c / "model" / "model.safetensors", 100),
    "state: 64 bytes flipped": lambda c: _flip(
        c / "state.pt", (c / "state.pt").stat().st_size // 2),
    "state: emptied": lambda c: os.truncate(c / "state.pt", 0),
    "config: edited": lambda c: (c / "model" / "config.json").write_text("{}"),
    "tokenizer: deleted": lambda c: (c / "model" / "tokenizer.json").unlink(),
    "manifest: deleted": lambda c: (c / MANIFEST).unlink(),
    "manifest: garbage": lambda c: (c / MANIFEST).write_text("[1, 2"),
    "manifest: hash edited": lambda c: (c / MANIFEST).write_text(
        (c / MANIFEST).read_text().replace('"sha256": "', '"sha256": "0', 1)),
    "extra byte appended to state": lambda c: open(c / "state.pt", "ab").write(b"\0"),
}


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_a_corrupted_checkpoint_is_named_and_the_previous_one_used(tiny_engine, tmp_path,
                                                                  capsys, corruption):
    good = save_checkpoint(tmp_path, 1, tiny_engine, {})
    bad = save_checkpoint(tmp_path, 2, tiny_engine, {})
    CORRUPTIONS[corruption](bad)
    assert latest_checkpoint(tmp_path) == good
    assert "checkpoint step-000002 skipped" in capsys.readouterr().out
    CORRUPTIONS[corruption](good)  # with every checkpoint damaged, a clear error
    with pytest.raises(CheckpointError, match="no checkpoint in .* verifies.*step-000002"):
        latest_checkpoint(tmp_path)


def test_no_checkpoint_means_none(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    (tmp_path / "checkpoints" / ".tmp-step-000001").mkdir(parents=True)
    assert latest_checkpoint(tmp_path) is None


def test_metrics_file_skips_a_torn_last_line_and_truncates_atomically(tmp_path):
    mf = MetricsFile(tmp_path / "metrics.jsonl")
    for s in range(-1, 4):
        mf.append({"step": s, "reward/mean": s / 10})
    with open(mf.path, "a") as f:
        f.write('{"step": 4, "reward/me')  # a kill in the middle of a write
    assert [r["step"] for r in mf.read()] == [-1, 0, 1, 2, 3]
    mf.truncate_to(2)
    assert [r["step"] for r in mf.read()] == [-1, 0, 1]
    assert mf.path.read_text().endswith("\n") and not list(tmp_path.glob(".*.tmp"))



def test_a_damaged_metrics_line_before_the_last_is_named_not_dropped(tmp_path):
    """Only the last line can be torn by a kill: a line that is not JSON earlier in the file
    (damage on disk) is an error naming the file and line, and a resume's cut-back does not
    silently delete it."""
    mf = MetricsFile(tmp_path / "metrics.jsonl")
    for s in range(-1, 3):
        mf.append({"step": s, "eval/reward": s / 10})
    lines = mf.path.read_text().splitlines()
    lines[0] = "X" + lines[0]
    mf.path.write_text("\n".join(lines) + "\n")
    before = mf.path.read_bytes()
    with pytest.raises(ValueError, match="metrics.jsonl, line 1: not JSON"):
        mf.truncate_to(1)
    assert mf.path.read_bytes() == before


@pytest.mark.parametrize("name", ["metrics.jsonl", "eval_samples.jsonl"])
def test_a_damaged_last_line_that_ends_in_a_newline_is_named_not_dropped(tmp_path, name):
    """A kill's torn write never ends in a newline: a last line that is not JSON but ends
    in one is damage, named (by a resume too, which leaves the file as it is)."""
    from rookworld.config import ConfigError
    from rookworld.resume import check_resume
    mf = MetricsFile(tmp_path / name)
    for s in range(-1, 2):
        mf.append({"step": s, "values": {"eval/reward": [s / 10, 0.5]}})
    lines = mf.path.read_text().splitlines()
    lines[-1] = "X" + lines[-1][1:]  # its first byte damaged on disk
    mf.path.write_text("\n".join(lines) + "\n")
    before = mf.path.read_bytes()
    with pytest.raises(ValueError, match=f"{name}, line 3: not JSON"):
        mf.read()
    with pytest.raises(ConfigError, match=f"resume: .*{name}, line 3: not JSON"):
        check_resume(tmp_path, 3, (name,))
    assert mf.path.read_bytes() == before
    mf.path.write_bytes(before[:-1])  # the same line without its newline: torn, skipped
    assert [r["step"] for r in mf.read()] == [-1, 0]
