"""Process faults, through the real CLI: exit codes and one-line errors, SIGKILL at
random points then resume, sweeps whose trials crash or whose driver is killed, and a
run directory held by another process.
"""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_faults import STATEFUL, _done_steps, _env, _train, assert_same_run

from rookworld.config import ConfigError, compose
from rookworld.run_dir import latest_checkpoint
from rookworld.train import run


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
    assert "max_new_tokens=400 (task P)" in crashed["reason"]
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
        [sys.executable, "-c", "import sys, time; from rookworld.run_dir import RunLock\n"
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



def test_a_skipped_non_finite_update_is_the_nan_guards_to_judge(tiny_overrides, tmp_path,
                                                                monkeypatch):
    """One update skipped for a non-finite loss whose KL reads NaN: the NaN guard allows up
    to three in a row, so the run ends in success; the KL guard (window 1) does not count
    the skipped step's NaN as drift."""
    from rookworld.engine import GRPOEngine
    update = GRPOEngine.update

    def nan_at_step_one(self, batch, step):
        m = update(self, batch, step)
        return m | {"kl/k3": float("nan"), "guard/nan_skipped": 1} if step == 1 else m

    monkeypatch.setattr(GRPOEngine, "update", nan_at_step_one)
    over = [o for o in tiny_overrides if not o.startswith("steps=")]
    result = run(compose(over + ["steps=3", "guard.kl.window=1", "eval_every=0"]),
                 tmp_path / "run")
    assert result.outcome.status == "success"


@pytest.mark.parametrize("target", ["nonexistent", "an empty directory", "a file",
                                    "a damaged run_config.yaml"])
def test_a_refused_resume_leaves_no_dated_folder(tmp_path, target):
    path = tmp_path / "target"
    message = f"rookworld: resume={path}: no run there ({path / 'run_config.yaml'} is missing)"
    if target == "an empty directory":
        path.mkdir()
    elif target == "a file":
        path.write_text("not a run\n")
    elif target == "a damaged run_config.yaml":
        path.mkdir()
        (path / "run_config.yaml").write_text("model: [unclosed\n")
        message = f"rookworld: resume={path}: {path / 'run_config.yaml'} is damaged (not " \
                  "readable as YAML: "
    p = subprocess.run([sys.executable, "-m", "rookworld.train", f"resume={path}"],
                       cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 1 and p.stderr.startswith(message), p.stderr[-2000:]
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").iterdir())


@pytest.mark.parametrize("held_by", ["a finished run", "a live run", "a bad setting"])
def test_a_refused_rerun_leaves_the_runs_hydra_record_as_it_was(tiny_overrides, tmp_path,
                                                                 held_by):
    """Hydra saves a command's .hydra record before the run is refused (the directory holds
    a run, a live run locks it, or a setting is refused before either is checked): the
    refusal puts the run's own record back."""
    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    for name in ("config.yaml", "hydra.yaml", "overrides.yaml"):
        (run_dir / ".hydra" / name).write_text(f"# the run's own {name}\n")
    holder, extra = None, []
    if held_by != "a live run":
        (run_dir / "outcome.json").write_text('{"status": "success", "step": 2}')
        extra = ["num_generations=1"] if held_by == "a bad setting" else []
    else:
        holder = subprocess.Popen(
            [sys.executable, "-c", "import sys, time; from rookworld.run_dir import RunLock\n"
             f"with RunLock({str(run_dir)!r}):\n    print('held', flush=True); time.sleep(300)"],
            stdout=subprocess.PIPE, text=True)
        assert holder.stdout.readline().strip() == "held"
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    try:
        p = subprocess.run([sys.executable, "-m", "rookworld.train", *tiny_overrides, "seed=9",
                            "steps=3", *extra, f"hydra.run.dir={run_dir}"], cwd=tmp_path,
                           env=_env(), capture_output=True, text=True, timeout=300)
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
            holder.stdout.close()
    refusal = {"a finished run": "already holds a run", "a live run": "is in use by another run",
               "a bad setting": "num_generations"}[held_by]
    assert p.returncode == 1 and refusal in p.stderr, p.stderr[-2000:]
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before
