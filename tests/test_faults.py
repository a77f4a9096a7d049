"""Faults: a run killed (SIGKILL) at random points resumes exactly; half-written
checkpoints and torn metrics lines are never read; the engine pool survives a
Stockfish process killed mid-analysis.

"Exactly": after `resume=<run dir>` the metrics rows (time/* and mem/* aside) and
the final weights equal those of an uninterrupted run with the same seed.
"""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from rookworld.checkpoint import (
    LATEST,
    MANIFEST,
    CheckpointError,
    MetricsFile,
    is_complete,
    latest_checkpoint,
    save_checkpoint,
)
from rookworld.config import ConfigError, compose
from rookworld.files import atomic_write_text
from rookworld.train import build_engine, build_parts, resolve_resume, run

# State that a resume must restore: Adam moments and a large lr (weights move a lot),
# a cosine schedule (scheduler state), the adaptive KL controller (its coefficient)
# and a reference that is synced every 3 steps (saved with the checkpoint).
STATEFUL = ["optim=adamw_cosine", "optim.schedule.warmup_steps=1", "optim.lr=0.01", "kl=adaptive", "reference.sync_every=3",
            "reference.sync_alpha=0.5", "checkpoint_every=1", "eval_every=2",
            "guard.kl.threshold=1000"]
VOLATILE = ("time/", "mem/")


def comparable(run_dir: Path) -> list[dict]:
    """metrics.jsonl rows without the timing and memory keys."""
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)}
            for r in MetricsFile(Path(run_dir) / "metrics.jsonl").read()]


def final_weights(run_dir: Path) -> dict:
    return load_file(str(latest_checkpoint(run_dir) / "model" / "model.safetensors"))


def assert_same_run(a: Path, b: Path) -> None:
    ra, rb = comparable(a), comparable(b)
    assert [r["step"] for r in ra] == [r["step"] for r in rb]
    for x, y in zip(ra, rb, strict=True):
        assert x == y, f"step {x['step']}: " + str({k: (x[k], y.get(k)) for k in x
                                                     if x[k] != y.get(k)})
    wa, wb = final_weights(a), final_weights(b)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


# ---------------------------------------------------------------- checkpoint files

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
    from rookworld.model import save_policy
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
    "state: 64 bytes flipped": lambda c: _flip(c / "state.pt", (c / "state.pt").stat().st_size // 2),
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


# ----------------------------------------------------------- resume, in process

def crash_at(monkeypatch, step: int, start) -> None:
    """start() raises a simulated crash in the update of `step`, after the checkpoints
    before it; the real update is back afterwards."""
    from rookworld import engine as engine_mod
    real_update = engine_mod.GRPOEngine.update

    def crashing(self, batch, s):
        if s == step:
            raise RuntimeError("simulated crash")
        return real_update(self, batch, s)

    monkeypatch.setattr(engine_mod.GRPOEngine, "update", crashing)
    with pytest.raises(RuntimeError, match="simulated crash"):
        start()
    monkeypatch.setattr(engine_mod.GRPOEngine, "update", real_update)


def _save_run_config(cfg, run_dir: Path) -> None:
    (run_dir / ".hydra").mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, run_dir / ".hydra" / "config.yaml")


@pytest.fixture
def one_thread():
    """One torch thread: on a shared 2-core machine, fewer threads is faster and steadier."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_resume_after_a_crash_equals_an_uninterrupted_run(tiny_overrides, tmp_path, monkeypatch,
                                                          one_thread):
    """A crash (exception) at step 3 of 4 with checkpoints every 2 steps and evaluations
    every step; resume continues from checkpoint 2, and the rows (metrics.jsonl,
    examples.jsonl) written after it are not repeated."""
    overrides = tiny_overrides + STATEFUL + ["steps=4", "logger=console", "checkpoint_every=2",
                                             "eval_every=1"]
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    run(compose(overrides), whole)

    cfg = compose(overrides)
    _save_run_config(cfg, broken)
    crash_at(monkeypatch, 3, lambda: run(cfg, broken))
    assert latest_checkpoint(broken).name == "step-000002"

    args = tiny_overrides + ["steps=4", f"resume={broken}", "logger=console"]
    resumed_cfg, run_dir = resolve_resume(compose(args), args)
    assert run_dir == broken.resolve() and resumed_cfg.optim.lr == 0.01  # the run's config
    result = run(resumed_cfg, run_dir)
    assert result.outcome.status == "success"
    assert_same_run(whole, broken)
    # side files too: the examples of step 2, written after checkpoint 2, are not repeated
    for name in ("examples.jsonl", "eval_samples.jsonl"):
        texts = [(broken / name).read_text(), (whole / name).read_text()]
        assert texts[0] == texts[1] and texts[0], name


def test_a_run_killed_before_its_first_checkpoint_starts_over_cleanly(tiny_overrides,
                                                                     tmp_path):
    cfg = compose(tiny_overrides + ["steps=1", "logger=console"])
    _save_run_config(cfg, tmp_path)
    MetricsFile(tmp_path / "metrics.jsonl").append({"step": -1, "eval/reward": 0.5})
    (tmp_path / "examples.jsonl").write_text('{"step": -1, "task": "P"}\n')
    args = tiny_overrides + [f"resume={tmp_path}", "logger=console"]
    resumed, run_dir = resolve_resume(compose(args), args)
    assert run(resumed, run_dir).outcome.status == "success"
    rows = MetricsFile(tmp_path / "metrics.jsonl").read()
    evals = [r for r in rows if "eval/reward" in r]
    assert [r["step"] for r in evals] == [-1, 1] and evals[0]["eval/reward"] != 0.5
    assert '"task": "P"}' not in (tmp_path / "examples.jsonl").read_text()


@pytest.mark.parametrize("line", ["123", "null", '{"step": "x"}', "[1]"])
def test_a_metrics_line_that_is_not_a_row_is_named(tmp_path, line):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "reward/mean": 1}\n' + line + "\n")
    with pytest.raises(ValueError, match="metrics.jsonl, line 2: not a metrics row"):
        MetricsFile(path).read()


def test_a_full_disk_while_checkpointing_is_recorded_and_resumable(tiny_overrides, tmp_path,
                                                                   monkeypatch, one_thread):
    import errno

    from rookworld import checkpoint as ckpt_mod
    overrides = tiny_overrides + ["steps=3", "checkpoint_every=1"]
    cfg = compose(overrides)
    _save_run_config(cfg, tmp_path)
    real_save = torch.save

    def disk_fills_at_checkpoint_2(obj, path, *a, **k):
        if Path(path).parent.name == ".tmp-step-000002":
            Path(path).write_bytes(b"\0" * 1000)  # part of the file made it to disk
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, path, *a, **k)

    monkeypatch.setattr(ckpt_mod.torch, "save", disk_fills_at_checkpoint_2)
    with pytest.raises(CheckpointError, match="step-000002 .* failed \\(No space left on device"):
        run(cfg, tmp_path)
    monkeypatch.setattr(ckpt_mod.torch, "save", real_save)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) \
        == [LATEST, "step-000001"]  # no temporary directory left behind
    outcome = json.loads((tmp_path / "outcome.json").read_text())
    assert outcome["status"] == "error" and outcome["step"] == 2
    assert f"resume={tmp_path.resolve()}" in outcome["reason"] and outcome["initial_eval"]
    assert "No space left on device" in (tmp_path / "error.txt").read_text()
    args = [o for o in tiny_overrides if not o.startswith("steps=")] + [f"resume={tmp_path}"]
    resumed, run_dir = resolve_resume(compose(args), args)  # the run's own 3 steps
    assert run(resumed, run_dir).outcome.status == "success"
    assert latest_checkpoint(tmp_path).name == "step-000003"


def test_resume_reads_the_runs_own_config_even_if_hydra_overwrote_it(tiny_overrides, tmp_path):
    """`resume=X hydra.run.dir=X` makes Hydra rewrite X/.hydra/config.yaml with the
    resuming command's config; run_config.yaml keeps the run's own."""
    cfg = compose(tiny_overrides + ["steps=1", "optim.lr=0.003", "dry_run=true"])
    run(cfg, tmp_path)
    _save_run_config(compose(["model=tiny_random", "steps=1"]), tmp_path)  # the overwrite
    args = ["model=tiny_random", "steps=2", f"resume={tmp_path}"]
    resumed, _ = resolve_resume(compose(args), args)
    assert resumed.optim.lr == 0.003 and resumed.model.n_embd == 32 and resumed.steps == 2
    assert resumed.data.train == cfg.data.train and resumed.resume == str(tmp_path.resolve())


def test_a_run_saved_before_a_setting_existed_resumes_with_its_value(tiny_overrides, tmp_path,
                                                                     capsys):
    cfg = compose(tiny_overrides + ["steps=1", "kl=adaptive", "dry_run=true"])
    run(cfg, tmp_path)
    saved = OmegaConf.load(tmp_path / "run_config.yaml")
    del saved["anchor"], saved["optim"]["eps"]  # a setting, and a key of a node, added later
    del saved["reference"]["device"]  # a key of a settings group without a class
    del saved["prompt_filter"]  # a setting whose default is not what the run did
    (tmp_path / "run_config.yaml").write_text(OmegaConf.to_yaml(saved))
    args = ["model=tiny_random", f"resume={tmp_path}", "kl=warmup_fixed"]
    resumed, _ = resolve_resume(compose(args), args)
    assert resumed.anchor.coef == 0.0 and resumed.optim.eps == cfg.optim.eps
    assert cfg.prompt_filter.oversample == 2 and resumed.prompt_filter.oversample == 1
    # a node of another class keeps its own keys: no warmup_steps in the run's adaptive KL
    assert resumed.kl._target_ == cfg.kl._target_ and "warmup_steps" not in resumed.kl
    out = capsys.readouterr().out
    assert "predates setting(s) anchor, prompt_filter, optim.eps;" in out
    assert "but prompt_filter.oversample=1.0: what the run did before they existed" in out
    from rookworld.config import instantiate
    build_engine(resumed, build_parts(resumed), instantiate(resumed.reward))  # builds as before


def test_resume_without_steps_keeps_the_runs_own_total(tiny_overrides, tmp_path):
    cfg = compose(tiny_overrides + ["steps=7", "dry_run=true"])
    run(cfg, tmp_path)
    args = ["model=tiny_random", f"resume={tmp_path}", "optim.lr=0.5"]
    resumed, _ = resolve_resume(compose(args), args)  # the default steps (20) is not asked for
    assert resumed.steps == 7 and resumed.optim.lr == cfg.optim.lr  # lr=0.5 reported, ignored


@pytest.mark.slow  # three runs in subprocesses: ~30 s
def test_resuming_a_finished_run_changes_nothing_unless_steps_rise(tiny_overrides, tmp_path):
    run_dir = tmp_path / "run"
    first = _train(tiny_overrides + ["steps=2", f"hydra.run.dir={run_dir}"], tmp_path)
    assert first.wait(300) == 0
    first.stdout.close()
    before = {p.name: p.read_bytes() for p in (run_dir / "outcome.json", run_dir / "metrics.jsonl")}
    for extra in ([], ["steps=1"], ["steps=2"]):
        p = subprocess.run([sys.executable, "-m", "rookworld.train", f"resume={run_dir}", *extra],
                           cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
        assert p.returncode == 0 and "already finished its 2 steps" in p.stdout, p.stderr[-2000:]
        assert before == {n: (run_dir / n).read_bytes() for n in before}
    # a resume that fails (every checkpoint corrupted) names the file and keeps the record
    damaged = tmp_path / "damaged"
    shutil.copytree(run_dir, damaged)
    for ckpt in (damaged / "checkpoints").glob("step-*"):
        CORRUPTIONS["weights: 64 bytes flipped mid-file"](ckpt)
    p = subprocess.run([sys.executable, "-m", "rookworld.train", f"resume={damaged}", "steps=3"],
                       cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 1 and "model.safetensors does not match its manifest" in p.stderr
    assert (damaged / "outcome.json").read_bytes() == before["outcome.json"]
    p = subprocess.run([sys.executable, "-m", "rookworld.train", f"resume={run_dir}", "steps=3"],
                       cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads((run_dir / "outcome.json").read_text())["step"] == 3
    # every resume wrote into the run: its Hydra record is kept there, no dated folder left
    assert not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").iterdir())
    assert len(list((run_dir / ".hydra-resumes").iterdir())) >= 1
    assert not (run_dir / "train.log").exists() or (run_dir / "train.log").read_text()


def test_a_kl_failure_exits_with_its_own_code(tiny_overrides, tmp_path):
    from rookworld.train import EXIT_CODES
    over = [o for o in tiny_overrides if not o.startswith("steps=")]
    # weight decay moves the policy even when every group's rewards tie (zero advantages)
    p = subprocess.run([sys.executable, "-m", "rookworld.train", *over, "steps=3",
                        "optim.lr=1e-2", "optim.weight_decay=0.1", "guard.kl.threshold=1e-9",
                        "guard.kl.window=1", f"hydra.run.dir={tmp_path / 'run'}"],
                       cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    outcome = json.loads((tmp_path / "run" / "outcome.json").read_text())
    assert outcome["status"] == "kl_failure" and p.returncode == EXIT_CODES["kl_failure"] == 3


def test_weights_blown_up_by_a_huge_lr_end_as_a_nan_failure(tiny_overrides, tmp_path):
    from rookworld.train import EXIT_CODES
    over = [o for o in tiny_overrides if not o.startswith("steps=")]
    p = subprocess.run([sys.executable, "-m", "rookworld.train", *over, "steps=3",
                        "optim.lr=1e9", "eval_every=0", f"hydra.run.dir={tmp_path / 'run'}"],
                       cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    outcome = json.loads((tmp_path / "run" / "outcome.json").read_text())
    assert outcome["status"] == "nan_failure" and "lower optim.lr" in outcome["reason"]
    assert p.returncode == EXIT_CODES["nan_failure"] == 4


@pytest.mark.parametrize("setting, message", [
    ("data.train={tmp}", "rookworld: data.train={tmp}: data source {tmp}: not a data file, "
                         "nor a dataset folder"),
    ("data.train=/nonexistent.jsonl", "rookworld: data.train=/nonexistent.jsonl: data source "
                                      "/nonexistent.jsonl does not exist"),
    ("hydra.run.dir=/proc/x/run", "rookworld: hydra.run.dir=/proc/x/run: cannot create that "
                                  "directory"),
    ("sampler.top_p=0", "rookworld: cannot build rookworld.sampling.per_task_settings: "
                        "sampler.top_p must be in (0, 1]")])
def test_a_bad_setting_ends_in_one_line_naming_it(tiny_overrides, tmp_path, setting, message):
    empty = tmp_path / "empty"
    empty.mkdir()
    setting, message = (x.replace("{tmp}", str(empty)) for x in (setting, message))
    args = [o for o in tiny_overrides if not o.startswith("data.train=")] \
        if setting.startswith("data.train=") else list(tiny_overrides)
    if not setting.startswith("hydra.run.dir="):
        args.append(f"hydra.run.dir={tmp_path / 'run'}")
    p = subprocess.run([sys.executable, "-m", "rookworld.train", *args, setting],
                       cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 1 and message in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_prompts_that_do_not_split_over_the_ranks_are_refused_before_loading(
        tiny_overrides, monkeypatch):
    from rookworld.config import validate
    monkeypatch.setenv("WORLD_SIZE", "2")
    validate(compose(tiny_overrides + ["prompts_per_step=4"]))
    with pytest.raises(ConfigError, match="3 prompts per step do not split over 2 ranks"):
        validate(compose(tiny_overrides + ["prompts_per_step=3"]))


# ------------------------------------------------------------ SIGKILL, real CLI

def _env():
    return dict(os.environ, HYDRA_FULL_ERROR="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")


def _train(args, cwd) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rookworld.train", *args], cwd=cwd,
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def _done_steps(run_dir: Path) -> int:
    """Training steps whose metrics row is in the file."""
    rows = MetricsFile(run_dir / "metrics.jsonl").read()
    return 1 + max((r["step"] for r in rows if "reward/mean" in r), default=-1)


def _kill_at(proc: subprocess.Popen, run_dir: Path, steps_done: int, delay: float) -> None:
    deadline = time.monotonic() + 300
    while _done_steps(run_dir) < steps_done:
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.monotonic() < deadline, "training did not reach the kill point"
        time.sleep(0.02)
    time.sleep(delay)  # anywhere in the next step: sampling, update, eval or checkpoint
    assert proc.poll() is None, "the run finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    proc.stdout.close()


@pytest.mark.slow
def test_sigkill_at_random_points_then_resume_is_exact(tiny_overrides, tmp_path):
    """Three kills at random steps and random moments within the step."""
    steps = 8
    args = tiny_overrides + STATEFUL + [f"steps={steps}"]
    whole = tmp_path / "whole"
    p = _train(args + [f"hydra.run.dir={whole}"], tmp_path)
    out, _ = p.communicate(timeout=600)
    assert p.returncode == 0, out[-3000:]

    rng = random.Random(20261122)
    for k, kill_after in enumerate(sorted(rng.sample(range(steps - 2), 3))):
        run_dir = tmp_path / f"killed{k}"
        proc = _train(args + [f"hydra.run.dir={run_dir}"], tmp_path)
        _kill_at(proc, run_dir, kill_after, rng.uniform(0.0, 0.5))
        done = _done_steps(run_dir)
        ckpt = latest_checkpoint(run_dir)
        saved = int(ckpt.name.removeprefix("step-")) if ckpt else 0
        assert saved >= done - 1, f"lost {done - saved} steps with checkpoint_every=1"
        p = _train([f"resume={run_dir}", f"steps={steps}",
                    f"hydra.run.dir={tmp_path / f'resume{k}'}"], tmp_path)
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0, out[-3000:]
        assert json.loads((run_dir / "outcome.json").read_text())["status"] == "success"
        assert_same_run(whole, run_dir)


@pytest.mark.slow
def test_three_processes_started_together_write_identical_weights(tiny_overrides, tmp_path):
    """Same seed, no ROOKWORLD_* settings, a loaded machine: the same weights (the CPU
    matrix library is a fixed choice, not a timing race)."""
    env = {k: v for k, v in _env().items() if not k.startswith("ROOKWORLD_")}
    procs = [subprocess.Popen(
        [sys.executable, "-m", "rookworld.train", *tiny_overrides, *STATEFUL, "steps=3",
         f"hydra.run.dir={tmp_path / str(i)}"], cwd=tmp_path, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(3)]
    for p in procs:
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0, out[-3000:]
    assert_same_run(tmp_path / "0", tmp_path / "1")
    assert_same_run(tmp_path / "0", tmp_path / "2")


# ------------------------------------------------------------- the engine pool

def _cpu_ticks(pid: int) -> int:
    """User plus system CPU clock ticks the process has used (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def test_engine_pool_survives_a_process_killed_mid_analysis():
    from rookworld.chess_tasks.engine import EnginePool, find_engine
    try:
        find_engine()
    except FileNotFoundError:
        pytest.skip("no stockfish installed")
    fen = "r1bqkb1r/pppp1ppp/2n2n2/4p3/2B1P3/5N2/PPPP1PPP/RNBQK2R w KQkq - 4 4"
    with EnginePool(processes=1, depth=14) as reference:
        expected = reference.analyse(fen)
    with EnginePool(processes=1, depth=14) as pool:
        victim, got = pool.pids()[0], {}
        idle = _cpu_ticks(victim)
        worker = threading.Thread(target=lambda: got.update(a=pool.analyse(fen)))
        worker.start()
        deadline = time.monotonic() + 60
        while _cpu_ticks(victim) == idle and time.monotonic() < deadline:
            time.sleep(0.005)  # kill once the engine is searching, however fast the host
        assert worker.is_alive(), "the analysis finished before the kill: raise the depth"
        os.kill(victim, signal.SIGKILL)
        worker.join(120)
        assert got["a"] == expected  # retried on a fresh process, same label
        assert pool.restarts == 1 and pool.pids()[0] != victim
        assert pool.analyse(fen) is got["a"]  # and cached


# ---------------------------------------------------------------- sweeps

SEARCH = ["-m", "hparams_search=grpo_stability", "hydra.sweeper.params=null", "batch_size=4"]


def _study(tmp_path: Path):
    import optuna
    db = tmp_path / "multirun" / "grpo_stability" / "optuna.db"
    return optuna.load_study(study_name="grpo_stability", storage=f"sqlite:///{db}").trials


@pytest.mark.slow
def test_sweep_trial_that_crashes_is_recorded_with_its_reason_and_the_rest_run(tiny_overrides,
                                                                             tmp_path):
    """A grid of three trials; the middle budget does not fit the model's 320 positions."""
    base = [o for o in tiny_overrides if not o.startswith("sampler.max_new_tokens=")]
    p = _train(SEARCH + base + ["steps=1", "hydra/sweeper/sampler=grid",
                                "sampler.max_new_tokens=choice(16,400,24)"], tmp_path)
    out, _ = p.communicate(timeout=900)
    assert p.returncode == 0, out[-3000:]
    trials = {t.params["sampler.max_new_tokens"]: t for t in _study(tmp_path)}
    assert sorted(trials) == [16, 24, 400]
    assert [trials[k].state.name for k in (16, 24, 400)] == ["COMPLETE", "COMPLETE", "FAIL"]
    crashed = trials[400].user_attrs  # FAIL, with its reason; never "Best parameters"
    assert crashed["outcomes"] == ["error"] and trials[400].value is None
    assert "max_new_tokens (400) exceeds" in crashed["reason"]
    assert "Best parameters" in out and "'sampler.max_new_tokens': 400" not in out.split(
        "Best parameters")[1]
    assert (Path(crashed["run_dir"]) / "error.txt").exists()
    for ok in (trials[16], trials[24]):
        assert ok.user_attrs["outcomes"] == ["success"]


@pytest.mark.slow
def test_sweep_killed_mid_trial_then_rerun_resumes_the_study(tiny_overrides, tmp_path):
    args = SEARCH + tiny_overrides + ["steps=3", "hydra.sweeper.n_trials=2"]
    p = _train(args, tmp_path)
    victim = tmp_path / "multirun" / "grpo_stability" / "trial-1"
    _kill_at(p, victim, 1, 0.0)  # the sweep (and with it trial 1) dies during trial 1
    before = _study(tmp_path)
    assert [t.state.name for t in before] == ["COMPLETE", "RUNNING"]
    p = _train(args, tmp_path)  # the same command again
    out, _ = p.communicate(timeout=900)
    assert p.returncode == 0, out[-3000:]
    after = _study(tmp_path)
    assert [t.number for t in after] == [0, 1, 2, 3]  # resumed: numbering goes on
    assert after[0].value == before[0].value and after[0].state.name == "COMPLETE"
    assert [t.state.name for t in after[2:]] == ["COMPLETE", "COMPLETE"]
    killed = after[1]  # marked FAIL by rookworld.sweeps.callbacks.FailStaleTrials
    assert killed.state.name == "FAIL"
    assert "without reporting" in killed.user_attrs["reason"]
    assert killed.system_attrs["fail_reason"] == killed.user_attrs["reason"]


def children(pid: int) -> set[int]:
    """The pids of pid's descendants (from /proc)."""
    kids = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids |= {int(c) for c in (task / "children").read_text().split()}
        except OSError:
            pass
    return kids | {g for k in kids for g in children(k)}


def running(pid: int) -> bool:
    """Whether pid runs (a zombie has ended; only its parent has not reaped it)."""
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


@pytest.mark.slow
def test_killing_a_joblib_sweep_stops_its_workers(tiny_overrides, tmp_path):
    """SIGKILL to the driver of a 2-worker joblib sweep: its loky workers end within
    seconds instead of training on for minutes, and a rerun fails their trials."""
    args = SEARCH + tiny_overrides + ["steps=30", "hydra.sweeper.n_trials=2",
                                      "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
                                      "hydra.sweeper.n_jobs=2"]
    p = _train(args, tmp_path)
    trial = tmp_path / "multirun" / "grpo_stability" / "trial-0"
    deadline = time.monotonic() + 300
    while _done_steps(trial) < 1 and time.monotonic() < deadline:
        time.sleep(0.5)
    workers = children(p.pid)
    assert workers, "the joblib launcher started no worker process"
    p.kill()
    p.wait()
    deadline = time.monotonic() + 30
    while any(running(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.5)
    alive = [w for w in workers if running(w)]
    for w in alive:  # do not leave them behind if the test fails
        os.kill(w, signal.SIGKILL)
    assert not alive, f"workers {alive} outlived the sweep process by 30 s"


def test_a_second_run_into_a_locked_directory_is_refused_until_the_holder_dies(
        tiny_overrides, tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from rookworld.checkpoint import RunLock\n"
         f"with RunLock({str(tmp_path)!r}):\n    print('held', flush=True); time.sleep(300)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        cfg = compose(tiny_overrides + ["steps=1", "dry_run=true"])
        with pytest.raises(ConfigError, match=f"{tmp_path} is in use by another run "
                                              f"\\(pid {holder.pid} on "):
            run(cfg, tmp_path)
        assert not (tmp_path / "data_report.json").exists()  # refused before writing
    finally:
        holder.kill()  # SIGKILL: the kernel releases the lock
        holder.wait()
    assert run(cfg, tmp_path).outcome.status == "success"


def test_resume_keeps_the_cpu_matmul_its_checkpoints_were_made_with(
        tiny_overrides, tmp_path, monkeypatch, capsys, one_thread):
    from rookworld import forward_matmul
    if not forward_matmul.ONEDNN:
        pytest.skip("torch built without oneDNN")
    monkeypatch.setattr(forward_matmul, "CPU_MATMUL", forward_matmul.CPU_MATMUL)  # restored afterwards
    monkeypatch.setenv("ROOKWORLD_CPU_MATMUL", "onednn")
    run(compose(tiny_overrides + STATEFUL + ["steps=3"]), tmp_path / "whole")
    cut = tmp_path / "cut"
    crash_at(monkeypatch, 2, lambda: run(compose(tiny_overrides + STATEFUL + ["steps=3"]), cut))
    # the same config resumed where `auto` or the environment now means another library
    monkeypatch.setenv("ROOKWORLD_CPU_MATMUL", "mkl")
    args = tiny_overrides + ["steps=3", f"resume={cut}"]
    resumed, run_dir = resolve_resume(compose(args), args)
    assert run(resumed, run_dir).outcome.status == "success"
    assert "made with cpu_matmul=onednn; it continues with that" in capsys.readouterr().out
    assert_same_run(tmp_path / "whole", cut)


def test_resume_is_exact_with_running_advantage_statistics(tiny_overrides, tmp_path,
                                                           monkeypatch, one_thread):
    """EMA normalisation and the adaptive baseline keep running statistics: they travel in
    the checkpoint, so a crash at step 2 and a resume equal an uninterrupted run."""
    overrides = tiny_overrides + STATEFUL + ["steps=3", "advantage=adaptive_baseline",
                                             "algorithm.advantage.normalize=ema",
                                             "algorithm.advantage.momentum=0.5"]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    from rookworld import engine as engine_mod
    real_score = engine_mod.GRPOEngine.score

    def varied(self, rows, texts, step):  # a random model's rewards all tie: spread them
        rewards, scored = real_score(self, rows, texts, step)
        return rewards + torch.tensor([len(t) % 5 / 10 for t in texts]), scored

    monkeypatch.setattr(engine_mod.GRPOEngine, "score", varied)
    run(compose(overrides), whole)
    rows = comparable(whole)
    assert any("adv/running_mean/P" in r for r in rows)
    assert any(r.get("adv/abs_mean", 0) > 0 for r in rows)  # the advantages are not all 0
    crash_at(monkeypatch, 2, lambda: run(compose(overrides), cut))
    args = tiny_overrides + ["steps=3", f"resume={cut}"]
    resumed, run_dir = resolve_resume(compose(args), args)
    assert run(resumed, run_dir).outcome.status == "success"
    assert_same_run(whole, cut)


def test_resume_is_exact_with_the_prompt_filter(tiny_overrides, tmp_path, monkeypatch,
                                                one_thread):
    """The filter picks a step's prompts by the policy's greedy answers: the resumed
    policy picks what the uninterrupted one picked. Rewards from the answers' characters,
    so that answers, and so picks, differ."""
    from rookworld.rewards.base import Scored
    from rookworld.rewards.continuous import ContinuousReward

    monkeypatch.setattr(ContinuousReward, "__call__",
                        lambda self, s, c: Scored(sum(map(ord, c)) % 97 / 96, {}))
    overrides = tiny_overrides + STATEFUL + ["steps=3", "prompt_filter.oversample=2",
                                             "reward=continuous"]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    run(compose(overrides), whole)
    rows = [r for r in comparable(whole) if "filter/greedy_reward_kept" in r]
    assert len(rows) == 3
    assert any(r["filter/greedy_reward_kept"] < r["filter/greedy_reward_drawn"] for r in rows)
    crash_at(monkeypatch, 2, lambda: run(compose(overrides), cut))
    args = tiny_overrides + ["steps=3", f"resume={cut}"]
    resumed, run_dir = resolve_resume(compose(args), args)
    assert run(resumed, run_dir).outcome.status == "success"
    assert_same_run(whole, cut)
