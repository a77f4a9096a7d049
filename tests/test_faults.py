"""Resume after faults: a run that crashes or is killed resumes exactly, keeps its own
config and CPU matrix library, and a finished run resumed changes nothing.

"Exactly": after `resume=<run dir>` the metrics rows (time/* and mem/* aside) and
the final weights equal those of an uninterrupted run with the same seed. File faults
are in test_faults_checkpoint.py, process faults (SIGKILL, sweeps, exit codes) in
test_faults_processes.py.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file
from test_faults_checkpoint import CORRUPTIONS

from rookworld.config import ConfigError, compose
from rookworld.run_dir import LATEST, CheckpointError, MetricsFile, latest_checkpoint
from rookworld.train import build_engine, build_parts, resolve_resume, run

# State that a resume must restore: Adam moments and a large lr (weights move a lot),
# a cosine schedule (scheduler state), the adaptive KL controller (its coefficient)
# and a reference that is synced every 3 steps (saved with the checkpoint).
STATEFUL = ["optim=adamw_cosine", "optim.schedule.warmup_steps=1", "optim.lr=0.01", "kl=adaptive",
            "reference.sync_every=3", "reference.sync_alpha=0.5", "checkpoint_every=1",
            "eval_every=2", "guard.kl.threshold=1000"]
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

    from rookworld import run_dir as run_dir_mod
    overrides = tiny_overrides + ["steps=3", "checkpoint_every=1"]
    cfg = compose(overrides)
    _save_run_config(cfg, tmp_path)
    real_save = torch.save

    def disk_fills_at_checkpoint_2(obj, path, *a, **k):
        if Path(path).parent.name == ".tmp-step-000002":
            Path(path).write_bytes(b"\0" * 1000)  # part of the file made it to disk
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, path, *a, **k)

    monkeypatch.setattr(run_dir_mod.torch, "save", disk_fills_at_checkpoint_2)
    with pytest.raises(CheckpointError, match="step-000002 .* failed \\(No space left on device"):
        run(cfg, tmp_path)
    monkeypatch.setattr(run_dir_mod.torch, "save", real_save)
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
    assert "predates setting(s) optim.eps, anchor, prompt_filter;" in out
    assert "but prompt_filter.oversample=1.0: what the run did before they existed" in out
    from rookworld.config import instantiate
    build_engine(resumed, build_parts(resumed), instantiate(resumed.reward))  # builds as before


def test_resume_without_steps_keeps_the_runs_own_total(tiny_overrides, tmp_path):
    cfg = compose(tiny_overrides + ["steps=7", "dry_run=true"])
    run(cfg, tmp_path)
    args = ["model=tiny_random", f"resume={tmp_path}", "optim.lr=0.5"]
    resumed, _ = resolve_resume(compose(args), args)  # the default steps (20) is not asked for
    assert resumed.steps == 7 and resumed.optim.lr == cfg.optim.lr  # lr=0.5 reported, ignored


def test_a_resume_that_raises_steps_records_them_and_keeps_the_first_evaluation(
        tiny_overrides, tmp_path, monkeypatch):
    """The saved config says the new total (diff, report and a later resume read it); the
    loggers get the run's first evaluation as initial/* though this process never logged
    it; dry_run=true on a resume checks it and trains nothing."""
    from rookworld.loggers import ConsoleLogger

    summaries = []
    monkeypatch.setattr(ConsoleLogger, "finish",
                        lambda self, outcome, summary: summaries.append(summary))
    assert run(compose(tiny_overrides + ["logger=console", "steps=1"]), tmp_path).outcome \
        .status == "success"
    for extra in (["dry_run=true"], []):
        args = ["model=tiny_random", f"resume={tmp_path}", "steps=2", *extra]
        resumed, run_dir = resolve_resume(compose(args), args)
        result = run(resumed, run_dir)
    assert result.outcome.step == 2 and len(summaries) == 2  # the dry run finished nothing
    outcome = json.loads((tmp_path / "outcome.json").read_text())
    assert summaries[-1]["initial/eval/reward"] == outcome["initial_eval"]["eval/reward"]
    assert OmegaConf.load(tmp_path / "run_config.yaml").steps == 2


def test_a_tracker_that_fails_to_start_is_recorded_as_the_runs_error(tiny_overrides,
                                                                      tmp_path, monkeypatch):
    """wandb.init failing (a network, a key): the run records its outcome and error.txt, and
    the loggers that did start are finished, as for any other error."""
    from rookworld.loggers import ConsoleLogger, ExamplesFile

    finished = []
    monkeypatch.setattr(ConsoleLogger, "finish", lambda self, o, s: finished.append(o.status))

    def fail(self, run_dir, config):
        raise RuntimeError("the tracker could not start")
    monkeypatch.setattr(ExamplesFile, "start", fail)
    with pytest.raises(RuntimeError, match="could not start"):
        run(compose(tiny_overrides + ["logger=console"]), tmp_path)
    outcome = json.loads((tmp_path / "outcome.json").read_text())
    assert outcome["status"] == "error" and "could not start" in outcome["reason"]
    assert "could not start" in (tmp_path / "error.txt").read_text()
    assert finished == ["error"]  # the console logger started before it and is finished


@pytest.mark.slow  # three runs in subprocesses: ~30 s
def test_resuming_a_finished_run_changes_nothing_unless_steps_rise(tiny_overrides, tmp_path):
    run_dir = tmp_path / "run"
    first = _train(tiny_overrides + ["steps=2", f"hydra.run.dir={run_dir}"], tmp_path)
    assert first.wait(300) == 0
    first.stdout.close()
    before = {p.name: p.read_bytes() for p in (run_dir / "outcome.json", run_dir / "metrics.jsonl")}
    # the same command again, without resume=: refused before anything is written
    again = subprocess.run([sys.executable, "-m", "rookworld.train", *tiny_overrides, "steps=2",
                            f"hydra.run.dir={run_dir}"], cwd=tmp_path, env=_env(),
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 1 and "already holds a run" in again.stderr, again.stderr[-2000:]
    assert f"resume={run_dir}" in again.stderr
    assert before == {n: (run_dir / n).read_bytes() for n in before}
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


def test_resume_keeps_the_cpu_matmul_its_checkpoints_were_made_with(
        tiny_overrides, tmp_path, monkeypatch, capsys, one_thread):
    from rookworld.backends.fast_gpt2 import matmul as forward_matmul
    if not forward_matmul.ONEDNN:
        pytest.skip("torch built without oneDNN")
    # restored afterwards
    monkeypatch.setattr(forward_matmul, "CPU_MATMUL", forward_matmul.CPU_MATMUL)
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


def test_a_run_saved_by_an_older_layout_is_refused_with_a_clear_message(tiny_overrides,
                                                                         tmp_path):
    cfg = compose(tiny_overrides + ["steps=1", "dry_run=true"])
    run(cfg, tmp_path)
    saved = OmegaConf.load(tmp_path / "run_config.yaml")
    del saved["algorithm"]["_target_"]  # the algorithm node before it was a typed object
    (tmp_path / "run_config.yaml").write_text(OmegaConf.to_yaml(saved))
    args = ["model=tiny_random", f"resume={tmp_path}"]
    from rookworld.errors import ConfigError

    with pytest.raises(ConfigError, match="saved by an older rookworld"):
        resolve_resume(compose(args), args)


FILE_LIMIT = """
import resource, sys
from rookworld.config import compose
from rookworld.run_dir import CheckpointError, latest_checkpoint, save_checkpoint
from rookworld.train import build_engine, build_parts
from test_engine import LengthReward
run_dir = sys.argv[1]
cfg = compose(sys.argv[2:])
engine = build_engine(cfg, build_parts(cfg), LengthReward())
save_checkpoint(run_dir, 1, engine, {})
resource.setrlimit(resource.RLIMIT_FSIZE, (2048, resource.RLIM_INFINITY))  # the disk fills
try:
    save_checkpoint(run_dir, 2, engine, {})
except CheckpointError as e:
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    print("CheckpointError:", e)
    print("latest:", latest_checkpoint(run_dir).name)
"""


def test_a_file_size_limit_while_checkpointing_is_a_checkpoint_error(tiny_overrides, tmp_path):
    """A real file size limit (RLIMIT_FSIZE: writes past it fail with EFBIG, as on a full
    disk) makes torch and safetensors raise their own errors: the save still ends in a
    CheckpointError that says to resume, and leaves no temporary directory behind."""
    p = subprocess.run([sys.executable, "-c", FILE_LIMIT, str(tmp_path), *tiny_overrides],
                       cwd=Path(__file__).parent, env=_env(), capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "CheckpointError: writing checkpoint step-000002" in p.stdout, p.stdout
    assert f"resume={tmp_path.resolve()}" in p.stdout and "latest: step-000001" in p.stdout
    assert sorted(x.name for x in (tmp_path / "checkpoints").iterdir()) \
        == [LATEST, "step-000001"]


def test_a_run_killed_after_its_last_checkpoint_resumes_to_its_own_final_evaluation(
        tiny_overrides, tmp_path):
    """Killed between its last checkpoint and its outcome: a resume has no step left, and
    records the final evaluation the run logged (not its start evaluation); a resume asked
    for fewer steps than the checkpoint holds is refused."""
    cfg = compose(tiny_overrides + ["steps=2", "optim.lr=5e-2"])
    _save_run_config(cfg, tmp_path)
    assert run(cfg, tmp_path).outcome.status == "success"
    final = json.loads((tmp_path / "outcome.json").read_text())["final_eval"]
    for name in ("outcome.json", "eval_before_after.md"):  # what the kill kept from being
        (tmp_path / name).unlink()
    args = tiny_overrides + [f"resume={tmp_path}"]
    resumed, run_dir = resolve_resume(compose(args), args)
    result = run(resumed, run_dir)
    outcome = json.loads((tmp_path / "outcome.json").read_text())
    assert result.outcome.status == "success" and outcome["final_eval"] == final
    assert outcome["final_eval"] != outcome["initial_eval"]
    (tmp_path / "outcome.json").unlink()
    args = tiny_overrides + [f"resume={tmp_path}", "steps=1"]
    resumed, run_dir = resolve_resume(compose(args), args)
    with pytest.raises(ConfigError, match="step-000002.*pass steps=2 or more"):
        run(resumed, run_dir)
    assert not (tmp_path / "outcome.json").exists()  # refused before it recorded anything


@pytest.mark.parametrize("name", ["metrics.jsonl", "examples.jsonl"])
def test_a_resume_names_a_damaged_log_line_and_keeps_the_file(tiny_overrides, tmp_path, name):
    cfg = compose(tiny_overrides + ["steps=2", "checkpoint_every=1", "logger=console"])
    _save_run_config(cfg, tmp_path)
    assert run(cfg, tmp_path).outcome.status == "success"
    (tmp_path / "outcome.json").unlink()
    path = tmp_path / name
    path.write_text("X" + path.read_text())  # its first row damaged on disk
    before = path.read_bytes()
    args = tiny_overrides + [f"resume={tmp_path}", "steps=3"]
    resumed, run_dir = resolve_resume(compose(args), args)
    with pytest.raises(ConfigError, match=f"{name}, line 1: not JSON"):
        run(resumed, run_dir)
    assert path.read_bytes() == before
    assert not (tmp_path / "outcome.json").exists()  # refused before it recorded anything


def test_sigterm_records_the_outcome_and_says_how_to_resume(tiny_overrides, tmp_path):
    """SIGTERM (a scheduler's preemption, `docker stop`) ends the run with outcome.json,
    one line naming resume= and exit code 143; the resume then finishes the run."""
    import signal
    import time

    run_dir = tmp_path / "run"
    proc = _train(tiny_overrides + ["steps=40", "checkpoint_every=1",
                                    f"hydra.run.dir={run_dir}"], tmp_path)
    deadline = time.time() + 240
    while time.time() < deadline and not (run_dir / "checkpoints" / "step-000002").exists():
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 143, out[-2000:]
    assert f"stopped by SIGTERM; continue with resume={run_dir.resolve()}" in out
    outcome = json.loads((run_dir / "outcome.json").read_text())
    assert outcome["status"] == "error" and "SIGTERM" in outcome["reason"]
    resumed = subprocess.run([sys.executable, "-m", "rookworld.train", f"resume={run_dir}"],
                             cwd=tmp_path, env=_env(), capture_output=True, text=True,
                             timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert json.loads((run_dir / "outcome.json").read_text())["status"] == "success"
    # the stopped attempt's error.txt went with the resume's record: none beside success
    assert not (run_dir / "error.txt").exists()
    assert "Stopped" in next((run_dir / ".hydra-resumes").glob("error-*.txt")).read_text()


def test_a_resume_folds_its_record_into_a_run_on_another_filesystem(tmp_path, monkeypatch):
    """The run on one filesystem, the resuming command's dated folder on another: every
    rename between them fails with EXDEV, so the record is copied and the folder removed."""
    import errno

    from rookworld.run_dir import fold_into
    run_dir, new_dir = tmp_path / "run", tmp_path / "outputs" / "2030-01-01_00-00-00"
    run_dir.mkdir()
    (new_dir / ".hydra").mkdir(parents=True)
    (new_dir / ".hydra" / "overrides.yaml").write_text(f"- resume={run_dir}\n")

    def cross_device(src, dst, *a, **k):
        raise OSError(errno.EXDEV, "Invalid cross-device link", str(src), None, str(dst))

    monkeypatch.setattr(os, "replace", cross_device)
    monkeypatch.setattr(os, "rename", cross_device)
    fold_into(new_dir, run_dir)
    kept = run_dir / ".hydra-resumes" / new_dir.name / "overrides.yaml"
    assert kept.read_text() == f"- resume={run_dir}\n" and not new_dir.exists()


@pytest.mark.parametrize("text, why", [
    ("", "empty"), ("model: [unclosed\nsteps: 3\n", "not readable as YAML"),
    ("- 1\n- 2\n", "not a run's config: no model, data, steps"),
    ("seed: 3\n", "not a run's config: no model, data, steps")])
def test_a_damaged_run_config_is_refused_naming_the_file(tiny_overrides, tmp_path, text, why):
    cfg = compose(tiny_overrides + ["steps=1", "dry_run=true"])
    run(cfg, tmp_path)
    (tmp_path / "run_config.yaml").write_text(text)
    args = ["model=tiny_random", f"resume={tmp_path}"]
    with pytest.raises(ConfigError) as refused:
        resolve_resume(compose(args), args)
    assert f"{tmp_path / 'run_config.yaml'} is damaged ({why}" in str(refused.value)


DISK_FILLS = """
import resource, runpy, sys
from rookworld.run_dir import MetricsFile
append, when = MetricsFile.append, sys.argv.pop(1)
UNLIMITED = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)

def append_as_the_disk_fills(self, row):
    # full: the disk fills at the first row, 10 bytes of it fit and nothing after;
    # freed: at step 1's row, and space is freed right after
    at = (-1, "eval/reward") if when == "full" else (1, "reward/mean")
    if self.path.name != "metrics.jsonl" or (row.get("step"), at[1] in row) != (at[0], True):
        return append(self, row)
    size = self.path.stat().st_size if self.path.exists() else 0
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + 10, resource.RLIM_INFINITY))
    try:
        return append(self, row)
    finally:
        if when == "freed":
            resource.setrlimit(resource.RLIMIT_FSIZE, UNLIMITED)

MetricsFile.append = append_as_the_disk_fills
sys.argv[0] = "rookworld.train"
runpy.run_module("rookworld.train", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("when", ["full", "freed"])
def test_a_full_disk_while_logging_ends_in_one_line_and_resumes(tiny_overrides, tmp_path, when):
    """A real file size limit (RLIMIT_FSIZE) hit while metrics.jsonl is appended to: one
    line naming the file and resume=, no traceback and no torn line; outcome.json and
    error.txt where space allows (freed right after), else a line for each; the resume
    finishes the run."""
    run_dir = tmp_path / "run"
    p = subprocess.run([sys.executable, "-c", DISK_FILLS, when, *tiny_overrides, "steps=3",
                        "checkpoint_every=1", f"hydra.run.dir={run_dir}"], cwd=tmp_path,
                       env=_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stderr[-3000:]
    assert p.stderr.strip().splitlines()[-1] == (
        f"rookworld: writing {run_dir.resolve() / 'metrics.jsonl'} failed (File too large); "
        f"free space, then continue with resume={run_dir.resolve()}"), p.stderr[-3000:]
    assert "Traceback" not in p.stdout + p.stderr, p.stderr[-3000:]
    text = (run_dir / "metrics.jsonl").read_text()
    assert text.endswith("\n") if text else when == "full"  # the failed row cut back off
    assert [r["step"] for r in MetricsFile(run_dir / "metrics.jsonl").read()] \
        == ([] if when == "full" else [-1, 0])
    if when == "full":
        assert "could not write error.txt (File too large)" in p.stderr
        assert "could not write outcome.json (File too large)" in p.stderr
        assert not (run_dir / "outcome.json").exists()
    else:
        outcome = json.loads((run_dir / "outcome.json").read_text())
        assert outcome["status"] == "error" and outcome["step"] == 1
        assert "File too large" in (run_dir / "error.txt").read_text()
    resumed = subprocess.run([sys.executable, "-m", "rookworld.train", f"resume={run_dir}"],
                             cwd=tmp_path, env=_env(), capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert json.loads((run_dir / "outcome.json").read_text())["status"] == "success"
    assert [r["step"] for r in MetricsFile(run_dir / "metrics.jsonl").read()
            if "reward/mean" in r] == [0, 1, 2]


def test_sigint_records_the_outcome_and_says_how_to_resume(tiny_overrides, tmp_path):
    """Ctrl-C (SIGINT) ends the run as SIGTERM does: outcome.json, error.txt, one line
    naming resume= and exit code 130, no KeyboardInterrupt traceback."""
    import signal
    import time

    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "rookworld.train", *tiny_overrides,
                             "steps=40", "checkpoint_every=1", f"hydra.run.dir={run_dir}"],
                            cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while time.time() < deadline and not (run_dir / "checkpoints" / "step-000001").exists():
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert err.strip().splitlines()[-1] == \
        f"rookworld: stopped by SIGINT; continue with resume={run_dir.resolve()}"
    assert "Traceback" not in out + err and "KeyboardInterrupt" not in out + err
    outcome = json.loads((run_dir / "outcome.json").read_text())
    assert outcome["status"] == "error" and "SIGINT" in outcome["reason"]
    assert "Stopped: stopped by SIGINT" in (run_dir / "error.txt").read_text()
    assert latest_checkpoint(run_dir) is not None
