"""Optuna sweeps: the search space, what a trial records in its study, the report, and how
reruns and workers treat the trials a study holds (sampler seeds, dead and finished trials)."""

import json
from pathlib import Path

import optuna
import pytest
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra_plugins.hydra_optuna_sweeper._impl import create_params_from_overrides
from omegaconf import OmegaConf
from optuna.distributions import CategoricalDistribution, FloatDistribution

from rookworld.config import CONF_DIR, compose, instantiate, validate
from rookworld.guards import Outcome
from rookworld.sweeps import report
from rookworld.sweeps.storage import study_storage
from rookworld.sweeps.trial import (
    StudyRef,
    TrialFailed,
    record,
    replica_config,
    run_trial,
    study_ref,
    summarize,
    tag,
)
from rookworld.train import RunResult, build_parts

optuna.logging.set_verbosity(optuna.logging.WARNING)
SEARCH = "hparams_search=grpo_stability"


# ---- the search space -------------------------------------------------------------------

def _sweeper_cfg():
    with initialize_config_dir(config_dir=str(CONF_DIR)):
        return hydra_compose("train", overrides=[SEARCH], return_hydra_config=True)


def test_search_space_spans_lr_beta_entropy_and_group_size():
    cfg = _sweeper_cfg()
    sw = cfg.hydra.sweeper
    assert sw.direction == "maximize"
    assert sw.sampler._target_ == "rookworld.sweeps.callbacks.continuing_tpe"
    assert sw.sampler.seed is not None and sw.max_failure_rate == 1.0
    assert sw.custom_search_space == "rookworld.sweeps.trial.tag"
    assert cfg.sweep.objective == "eval/reward"
    assert cfg.kl._target_ == "rookworld.kl_schedule.FixedKL"
    dists, fixed, _ = create_params_from_overrides([f"{k}={v}" for k, v in sw.params.items()])
    assert not fixed
    lr = dists["optim.lr"]
    assert isinstance(lr, FloatDistribution) and lr.log and lr.high >= 1e-2
    assert dists["kl.beta"].low == 0.0 and dists["algorithm.entropy_coef"].low == 0.0
    gens = dists["num_generations"]
    assert isinstance(gens, CategoricalDistribution) and len(gens.choices) > 1
    for g in gens.choices:  # every choice divides the fixed batch and composes to a valid config
        assert g >= 2 and cfg.batch_size % g == 0
        validate(compose([SEARCH, f"num_generations={g}"]))
    for a in dists["advantage"].choices:  # each advantage option composes and builds
        build_parts(compose([SEARCH, f"advantage={a}"]))
    for k in dists["algorithm.kl_estimator"].choices:  # each penalty direction too
        build_parts(compose([SEARCH, f"algorithm.kl_estimator={k}"]))


def test_study_storage_defaults_to_sqlite_under_multirun(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    url = study_storage(None, "s1")
    assert url == f"sqlite:///{tmp_path}/multirun/s1/optuna.db"
    assert (tmp_path / "multirun" / "s1" / "optuna.db").exists()  # tables created
    assert study_storage("other/x.db", "s1") == f"sqlite:///{tmp_path}/other/x.db"
    assert study_storage(url, "ignored") == url


# ---- what a trial records ----------------------------------------------------------------

def _rep(seed, status, objective, final=None):
    return {"seed": seed, "status": status, "step": 3, "reason": "", "objective": objective,
            "run_dir": f"/r/{seed}", "final_eval": final or {}}


def test_summarize_hand_computed():
    reps = [_rep(0, "success", 0.5, {"eval/reward": 0.5, "eval/P/format": 1.0}),
            _rep(1, "kl_failure", -1.0),
            _rep(2, "success", float("nan"), {"eval/reward": 0.1}),  # not finite: counts failed
            _rep(3, "error", -1.0)]
    s = summarize(reps, failed_objective=-2.0)
    assert s["outcomes"] == ["success", "kl_failure", "success", "error"]
    assert s["seeds"] == [0, 1, 2, 3]
    assert (s["success_rate"], s["kl_failure_rate"], s["nan_failure_rate"], s["error_rate"]) \
        == (0.5, 0.25, 0.0, 0.25)
    assert s["objective"] == pytest.approx((0.5 - 2.0 - 2.0 - 2.0) / 4)  # -1.375
    assert s["final_eval"] == {"eval/reward": pytest.approx(0.3)}  # keys of both successes


def test_replica_config_seeds_and_wandb_group():
    cfg = compose(["logger=wandb", "seed=7", SEARCH, "sweep.trial=4"])
    r = replica_config(cfg, 2, StudyRef("sqlite:///x.db", "study_a"))
    assert r.seed == 9 and cfg.seed == 7  # the trial's config is not changed
    w = instantiate(r.logger.wandb)
    assert w.kwargs["group"] == "study_a" and w.kwargs["job_type"] == "trial"
    assert w.kwargs["name"] == "study_a-trial4-seed9"
    mine = compose(["logger=wandb", "logger.wandb.group=mine"])
    assert replica_config(mine, 0, StudyRef("u", "s")).logger.wandb.group == "mine"
    assert replica_config(compose(["logger=console"]), 1, None).seed == 1


def test_study_ref_only_for_optuna_with_storage():
    opt = "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"
    assert study_ref(OmegaConf.create({"sweeper": {"_target_": opt, "storage": "sqlite:///a",
                                                   "study_name": "s"}})) \
        == StudyRef("sqlite:///a", "s")
    assert study_ref(OmegaConf.create({"sweeper": {"_target_": opt, "storage": None,
                                                   "study_name": "s"}})) is None
    basic = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
    assert study_ref(OmegaConf.create({"sweeper": {"_target_": basic}})) is None


def _running(study, lr):
    return study.ask({"optim.lr": FloatDistribution(lr, lr)})  # single-valued: lr itself


def test_record_finds_its_trial_by_number_even_with_equal_params(tmp_path):
    url = f"sqlite:///{tmp_path}/s.db"
    study = optuna.create_study(study_name="s", storage=url, direction="maximize")
    t0, t1 = _running(study, 1e-3), _running(study, 1e-3)  # the same parameters
    tag(None, t0)
    tag(None, t1)
    assert t1.params == {"optim.lr": 1e-3, "sweep.trial": 1}
    record(StudyRef(url, "s"), OmegaConf.create({"sweep": {"trial": 1}, "optim": {"lr": 1e-3}}),
           {"outcomes": ["kl_failure"], "kl_failure_rate": 1.0})
    attrs = [t.user_attrs for t in optuna.load_study(study_name="s", storage=url).trials]
    assert attrs == [{}, {"outcomes": ["kl_failure"], "kl_failure_rate": 1.0}]


def test_record_without_tag_matches_the_one_running_trial_by_params(tmp_path):
    url = f"sqlite:///{tmp_path}/s.db"
    study = optuna.create_study(study_name="s", storage=url)
    _running(study, 1e-3), _running(study, 1e-3), _running(study, 2e-3)
    cfg = OmegaConf.create({"optim": {"lr": 2e-3}})
    record(StudyRef(url, "s"), cfg, {"outcomes": ["success"]})
    assert [t.user_attrs for t in study.trials] == [{}, {}, {"outcomes": ["success"]}]
    with pytest.raises(RuntimeError, match="2 running trials match"):
        record(StudyRef(url, "s"), OmegaConf.create({"optim": {"lr": 1e-3}}), {"x": 1})


def test_run_trial_replicas_in_seed_dirs_error_becomes_an_outcome(tmp_path):
    cfg = compose(["logger=none", "seed=10", "sweep.replicas=3", "sweep.failed_objective=-1"])
    seen = []

    def fake_run(c, run_dir, multirun):
        seen.append((c.seed, run_dir, multirun))
        if c.seed == 11:
            raise ValueError("bad data for this seed")
        status = "success" if c.seed == 10 else "kl_failure"
        return RunResult(Outcome(status, 5), run_dir, {}, {"eval/reward": 0.4, "time/x": 1.0},
                         0.4 if status == "success" else -1.0)

    with pytest.raises(TrialFailed, match="seed 11: ValueError: bad data for this seed"):
        run_trial(cfg, tmp_path, fake_run, study=None)  # an error replica fails the trial
    assert [(s, d.name, m) for s, d, m in seen] == [(10, "seed-10", True), (11, "seed-11", True),
                                                    (12, "seed-12", True)]
    saved = json.loads((tmp_path / "trial.json").read_text())  # recorded before it raised
    assert saved["objective"] == pytest.approx((0.4 - 1 - 1) / 3)
    assert saved["outcomes"] == ["success", "error", "kl_failure"]
    assert saved["replicas"][1]["reason"] == "ValueError: bad data for this seed"
    assert saved["final_eval"] == {"eval/reward": 0.4}  # eval/ keys only
    assert "bad data" in (tmp_path / "seed-11" / "error.txt").read_text()


def test_an_objective_the_final_evaluation_lacks_fails_the_trial_naming_it(tmp_path):
    """A misspelt sweep.objective (or a strength measure under strength=none) is an error
    with the reason, not a silent failed_objective on every successful replica."""
    cfg = compose(["logger=none", "sweep.objective=eval/rewrd"])

    def fake_run(c, run_dir, multirun):
        return RunResult(Outcome("success", 5), run_dir, {}, {"eval/reward": 0.4}, -1.0)

    with pytest.raises(TrialFailed, match="sweep.objective=eval/rewrd is not a metric"):
        run_trial(cfg, tmp_path, fake_run, study=None)
    assert json.loads((tmp_path / "trial.json").read_text())["outcomes"] == ["error"]


def test_run_trial_rejects_zero_replicas(tmp_path):
    with pytest.raises(ValueError, match="sweep.replicas"):
        run_trial(compose(["sweep.replicas=0"]), tmp_path, None, None)


# ---- the report --------------------------------------------------------------------------

def _fake_run_dir(root: Path, name: str, kl: list[float], threshold=0.5) -> str:
    d = root / name
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "config.yaml").write_text(
        f"guard:\n  kl:\n    estimator: k3\n    threshold: {threshold}\n")
    (d / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "kl/k3": v}) + "\n" for s, v in enumerate(kl)))
    return str(d)


def _hand_made_study(root: Path) -> str:
    url = f"sqlite:///{root}/optuna.db"
    study = optuna.create_study(study_name="hand", storage=url, direction="maximize")
    dists = {"optim.lr": FloatDistribution(1e-6, 1e-2, log=True),
             "num_generations": CategoricalDistribution([2, 4])}
    cases = [  # (lr, G, outcomes, objective)
        (1e-5, 2, ["success", "success"], 0.5),
        (1e-3, 4, ["success", "kl_failure"], -0.4),
        (1e-2, 4, ["kl_failure", "nan_failure"], -1.0),
    ]
    for n, (lr, g, outs, value) in enumerate(cases):
        tdir = _fake_run_dir(root, f"trial-{n}", [0.0])
        reps = [{"seed": s, "status": o, "step": 2, "reason": f"why {o}", "objective": value,
                 "final_eval": {}, "run_dir": _fake_run_dir(root, f"trial-{n}/seed-{s}",
                                                            [0.0, 0.01, 0.9 if o != "success"
                                                             else 0.02])}
                for s, o in enumerate(outs)]
        study.add_trial(optuna.trial.create_trial(
            params={"optim.lr": lr, "num_generations": g}, distributions=dists, value=value,
            user_attrs={"outcomes": outs, "replicas": reps, "run_dir": tdir}))
    study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL))
    # a trial whose setting could not run: FAIL, with its outcomes kept out of the rates
    study.add_trial(optuna.trial.create_trial(
        state=optuna.trial.TrialState.FAIL, user_attrs={
            "outcomes": ["error"], "reason": "seed 0: ConfigError: bad setting",
            "replicas": [{"seed": 0, "status": "error", "step": 0, "reason": "bad setting",
                          "objective": -1.0, "final_eval": {}, "run_dir": str(root)}]}))
    return url


def test_report_hand_made_study(tmp_path, capsys):
    _hand_made_study(tmp_path)
    text = report.main([str(tmp_path)])
    assert text == (tmp_path / "report.md").read_text() and text in capsys.readouterr().out
    # 6 replicas: 3 success, 2 kl_failure, 1 nan_failure
    assert "**Study success rate 50%** (3/6 runs)" in text
    assert "**KL-failure rate 33%** (2)" in text and "NaN-failure rate 17% (1)" in text
    assert "Best trial: #0, objective 0.5000" in text and "5 trials (complete 3, fail 2)" in text
    assert "| 3 | FAIL | no reason recorded |" in text
    assert "| 4 | FAIL | seed 0: ConfigError: bad setting |" in text
    assert "| 1 | COMPLETE | 0.001 | 4 | 1 | 1 | 0 | 0 | 50% | 50% | -0.4000 |" in text
    assert "| 2 | 1 | nan_failure | 2 | why nan_failure |" in text
    for png in ("params.png", "kl.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_from_storage_url_and_study_name(tmp_path):
    url = _hand_made_study(tmp_path)
    out = tmp_path / "elsewhere"
    text = report.main(["--storage", url, "--study", "hand", "--out", str(out)])
    assert (out / "report.md").exists() and (out / "kl.png").exists()
    assert "# Sweep report: hand" in text


# ---- a rerun and the trials a study holds ------------------------------------------------

def _draw(study):
    """Ask a trial and draw it the way the sweeper does: a float and a choice."""
    trial = study.ask()
    return trial, (trial.suggest_float("x", 0.0, 1.0), trial.suggest_categorical("g", [2, 4, 8]))


def test_workers_sharing_a_study_draw_distinct_points_that_one_worker_reproduces(tmp_path):
    """Each trial draws from a stream seeded by the sampler seed and its trial number: two
    workers with the same seed on one study draw different points, the same ones a single
    worker draws on a fresh study for the same trial numbers, and a rerun draws new ones."""
    from rookworld.sweeps.callbacks import continuing_tpe
    url = f"sqlite:///{tmp_path}/optuna.db"
    optuna.create_study(study_name="shared", storage=url)
    workers = [optuna.load_study(study_name="shared", storage=url, sampler=continuing_tpe(seed=0))
               for _ in range(2)]
    asked = [_draw(workers[0]), _draw(workers[1]), _draw(workers[1]), _draw(workers[0])]
    for study, (trial, _) in zip(workers * 2, asked):
        study.tell(trial, 0.0)
    points = {t.number: p for t, p in asked}
    assert sorted(points) == [0, 1, 2, 3] and len(set(points.values())) == 4

    alone = optuna.create_study(study_name="alone", storage=url, sampler=continuing_tpe(seed=0))
    first = [_draw(alone) for _ in range(2)]  # asked together, drawn after (n_jobs=2)
    for trial, _ in first:
        alone.tell(trial, 0.0)
    rerun = optuna.load_study(study_name="alone", storage=url, sampler=continuing_tpe(seed=0))
    later = [_draw(rerun) for _ in range(2)]
    assert [p for _, p in first + later] == [points[n] for n in range(4)]
    other_seed = optuna.create_study(sampler=continuing_tpe(seed=1))
    assert _draw(other_seed)[1] != points[0]


def _study_config(url: str, grace_s: int):
    return OmegaConf.create({"hydra": {"sweeper": {"storage": url, "study_name": "s"}},
                             "sweep": {"grace_s": grace_s}})


def test_a_worker_fails_trials_whose_heartbeat_stopped_before_its_next_trial(tmp_path):
    """A job's Heartbeat keeps its trial alive; a trial whose job died goes FAIL with its
    reason when a live worker starts its next trial (the shared-server path, on SQLite)."""
    import time

    from rookworld.sweeps.callbacks import STALE_REASON, FailStaleTrials
    from rookworld.sweeps.trial import Heartbeat
    url = f"sqlite:///{tmp_path}/s.db"
    study = optuna.create_study(study_name="s", storage=url, direction="maximize")
    alive, dead, unstarted = _running(study, 1e-3), _running(study, 1e-4), _running(study, 1e-5)
    for t in (alive, dead, unstarted):
        tag(None, t)

    def beat(t):
        return Heartbeat(StudyRef(url, "s"), OmegaConf.create(
            {"sweep": {"trial": t.number, "heartbeat_s": 0.1}}))

    with beat(dead):
        pass  # the dead trial's job beat once, then its process "died"
    with beat(alive):
        # the dead trial stays silent twice the grace period below, while the live one
        # beats every 0.1 s: only a 2 s stall of a busy machine could fail it
        time.sleep(4.0)
        FailStaleTrials().on_job_start(_study_config(url, grace_s=60))  # not silent long enough
        assert [t.state.name for t in study.get_trials()] == ["RUNNING"] * 3
        FailStaleTrials().on_job_start(_study_config(url, grace_s=2))
    trials = optuna.load_study(study_name="s", storage=url).trials
    assert [t.state.name for t in trials] == ["RUNNING", "FAIL", "RUNNING"]  # no beat yet: alive
    assert trials[1].user_attrs["reason"] == STALE_REASON
    assert trials[1].system_attrs["fail_reason"] == STALE_REASON


def test_a_dead_trial_whose_job_recorded_its_result_is_completed_with_it(tmp_path):
    from rookworld.sweeps.callbacks import fail_stale_trials
    url = f"sqlite:///{tmp_path}/s.db"
    study = optuna.create_study(study_name="s", storage=url, direction="maximize")
    finished, dead, failed = (_running(study, lr) for lr in (1e-3, 1e-4, 1e-5))
    for t in (finished, dead, failed):
        tag(None, t)
    finished.set_user_attr("objective", 0.25)  # recorded by its job before the driver died
    failed.set_user_attr("objective", -1.0)
    failed.set_user_attr("reason", "seed 0: ConfigError: bad")
    assert fail_stale_trials(url, "s") == [dead.number, failed.number]
    trials = optuna.load_study(study_name="s", storage=url).trials
    assert [(t.state.name, t.value) for t in trials] == [("COMPLETE", 0.25), ("FAIL", None),
                                                         ("FAIL", None)]
    assert trials[2].user_attrs["reason"] == "seed 0: ConfigError: bad"  # its job's own


def _sweep_config(url: str, heartbeat_s: float):
    return OmegaConf.create({"hydra": {"sweeper": {"storage": url, "study_name": "s"}},
                             "sweep": {"heartbeat_s": heartbeat_s}})


def test_a_sweep_process_keeps_the_trials_it_asked_for_alive_until_they_are_told(tmp_path):
    """A trial whose job has not started (or has ended while the sweeper waits for the rest
    of its batch) has no job heartbeat: the sweep process that asked for it beats for it,
    so no worker fails (or completes) it under the sweeper, until the sweeper tells it."""
    import time

    from rookworld.sweeps.callbacks import fail_stale_trials
    from rookworld.sweeps.trial import Heartbeat
    url = f"sqlite:///{tmp_path}/s.db"
    study = optuna.create_study(study_name="s", storage=url, direction="maximize")
    waiting, ended = _running(study, 1e-3), _running(study, 1e-4)
    for t in (waiting, ended):
        tag(_sweep_config(url, 0.2), t)
    with Heartbeat(StudyRef(url, "s"), OmegaConf.create(
            {"sweep": {"trial": ended.number, "heartbeat_s": 0.1}})):
        ended.set_user_attr("objective", 0.5)  # its job beat, recorded its result and ended
    time.sleep(3.0)  # ten beats, and three times the grace period below
    assert fail_stale_trials(url, "s", only_silent=True, grace_s=1) == []
    assert [t.state.name for t in study.get_trials()] == ["RUNNING", "RUNNING"]
    study.tell(ended, 0.5)  # the sweeper reports it: no error, and it keeps its value
    study.tell(waiting, 0.1)
    assert [t.value for t in study.get_trials()] == [0.1, 0.5]


def test_the_trials_of_a_dead_sweep_process_fail_even_before_their_jobs_start(tmp_path):
    """A sweep process that asked for a trial and died before its job began (a queued
    cluster job, a batch run one job at a time) leaves a heartbeat that stops: the trial
    fails after the grace period instead of staying RUNNING for ever."""
    import subprocess
    import sys
    import time

    from rookworld.sweeps.callbacks import STALE_REASON, fail_stale_trials
    url = f"sqlite:///{tmp_path}/s.db"
    optuna.create_study(study_name="s", storage=url, direction="maximize")
    driver = (
        "import optuna, sys\n"
        "from omegaconf import OmegaConf\n"
        "from rookworld.sweeps.trial import tag\n"
        "url = sys.argv[1]\n"
        "study = optuna.load_study(study_name='s', storage=url)\n"
        "cfg = OmegaConf.create({'hydra': {'sweeper': {'storage': url}},\n"
        "                        'sweep': {'heartbeat_s': 0.2}})\n"
        "tag(cfg, study.ask())\n")
    subprocess.run([sys.executable, "-c", driver, url], check=True, timeout=120)
    time.sleep(2.0)
    assert fail_stale_trials(url, "s", only_silent=True, grace_s=1) == [0]
    trial = optuna.load_study(study_name="s", storage=url).trials[0]
    assert trial.state.name == "FAIL" and trial.user_attrs["reason"] == STALE_REASON


def test_a_second_sweep_process_on_a_sqlite_study_stops_before_touching_it(tmp_path):
    """SQLite serves one sweep process at a time, and a start fails every RUNNING trial as
    dead: a second process started while the first lives stops with a message instead,
    and the first one's trial stays RUNNING; once the first has ended, a start goes on."""
    import subprocess
    import sys

    from rookworld.sweeps.callbacks import FailStaleTrials
    db = tmp_path / "s.db"
    url = f"sqlite:///{db}"
    study = optuna.create_study(study_name="s", storage=url, direction="maximize")
    _running(study, 1e-3)
    first = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\n"
         "from rookworld.sweeps.storage import hold_sqlite_study\n"
         "hold_sqlite_study(sys.argv[1]); print('held', flush=True); time.sleep(60)", str(db)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "held"
        config = _study_config(url, grace_s=1)
        with pytest.raises(SystemExit, match="another sweep process is running"):
            FailStaleTrials().on_multirun_start(config)
        assert [t.state.name for t in study.get_trials()] == ["RUNNING"]
    finally:
        first.kill()
        first.wait()
    FailStaleTrials().on_multirun_start(config)  # the first process is gone: its trial is dead
    FailStaleTrials().on_multirun_end(config)
    assert [t.state.name for t in study.get_trials()] == ["FAIL"]


def test_a_sqlite_start_keeps_the_trials_whose_jobs_outlived_the_dead_sweep_process(tmp_path):
    """A start on SQLite (no other sweep process lives) fails a RUNNING trial unless its job
    lives: its process on this host, or a heartbeat within grace_s on another host (a
    submitit job outlives a killed sweep process, and its result is recorded later)."""
    import subprocess
    import sys
    import time

    from rookworld.sweeps.callbacks import fail_stale_trials
    from rookworld.sweeps.storage import open_storage
    from rookworld.sweeps.trial import JOB_ATTR, job_identity
    url = f"sqlite:///{tmp_path}/s.db"
    study = optuna.create_study(study_name="s", storage=url, direction="maximize")
    trials = [_running(study, lr) for lr in (1e-3, 1e-4, 1e-5, 1e-6, 1e-7, 1e-8)]
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)
    here = job_identity()
    jobs = [{**here, "pid": live.pid}, {**here, "pid": int(ended.stdout)}, None,
            {"host": "elsewhere", "pid": 1}, {"host": "elsewhere", "pid": 1},
            here]  # the last: a dead job's pid that this (restarted) sweep process reuses
    storage = open_storage(url)
    ids = [storage.get_trial_id_from_study_id_trial_number(
        storage.get_study_id_from_name("s"), t.number) for t in trials]
    try:
        for trial_id, job in zip(ids, jobs):
            if job is not None:
                storage.set_trial_system_attr(trial_id, JOB_ATTR, job)
        storage.record_heartbeat(ids[4])  # the stale one: silent for twice the grace below
        time.sleep(2.0)
        for alive in (ids[0], ids[3]):  # this host's live job and the other host's beat on
            storage.record_heartbeat(alive)
        assert sorted(fail_stale_trials(url, "s", grace_s=1)) == [1, 2, 4, 5]
        states = [t.state.name for t in optuna.load_study(study_name="s", storage=url).trials]
        assert states == ["RUNNING", "FAIL", "FAIL", "RUNNING", "FAIL", "FAIL"]
    finally:
        live.kill()
        live.wait()
        storage.engine.dispose()


def test_a_batch_whose_launch_raises_fails_its_trials_with_the_reason(tmp_path):
    """A launch that raises (a searched group value Hydra cannot compose, a killed joblib
    worker) fails that batch's trials with the error as their reason, and the sweep goes on;
    a trial whose job recorded its objective before the error keeps it."""
    from types import SimpleNamespace

    from hydra.core.utils import JobStatus

    from hydra_plugins.rookworld_sweeper import BatchFailures
    url = f"sqlite:///{tmp_path}/s.db"
    study = optuna.create_study(study_name="s", storage=url, direction="maximize")
    done, lost, own = _running(study, 1e-3), _running(study, 1e-4), _running(study, 1e-5)
    done.set_user_attr("objective", 0.25)  # its job ended before the worker pool broke
    own.set_user_attr("reason", "seed 0: ConfigError: bad")

    class TerminatedWorkerError(RuntimeError):  # joblib's, by name
        pass

    class Broken:
        error = TerminatedWorkerError("A worker process terminated abruptly\nmore detail")

        def launch(self, job_overrides, initial_job_idx):
            raise self.error

    launcher = BatchFailures(Broken(), SimpleNamespace(storage=url, study_name="s"))
    overrides = [[f"optim.lr={t.params['optim.lr']}", f"sweep.trial={t.number}"]
                 for t in (done, lost, own)]
    returns = launcher.launch(overrides, initial_job_idx=0)
    assert [r.status for r in returns] == [JobStatus.COMPLETED, JobStatus.FAILED,
                                           JobStatus.FAILED]
    assert returns[0].return_value == 0.25
    trials = optuna.load_study(study_name="s", storage=url).trials
    reason = ("its batch could not be launched: TerminatedWorkerError: A worker process "
              "terminated abruptly")
    assert trials[1].user_attrs["reason"] == reason
    assert trials[1].system_attrs["fail_reason"] == reason
    assert trials[2].user_attrs["reason"] == "seed 0: ConfigError: bad"  # its job's own
    assert "reason" not in trials[0].user_attrs
    Broken.error = RuntimeError("no such partition")  # a launcher that cannot work: itself
    with pytest.raises(RuntimeError, match="no such partition"):
        launcher.launch(overrides, initial_job_idx=3)


def test_the_sweeper_leaves_every_other_error_as_it_is(monkeypatch, tmp_path):
    """Only Optuna's missing best trial becomes the message: another ValueError, or that one
    where the study cannot be read back, is raised as it is."""
    from types import SimpleNamespace

    from hydra_plugins.hydra_optuna_sweeper.optuna_sweeper import OptunaSweeper

    from hydra_plugins.rookworld_sweeper import RookworldOptunaSweeper

    sweeper = object.__new__(RookworldOptunaSweeper)  # the sweep itself is patched below
    sweeper.sweeper = SimpleNamespace(study_name="absent", sweep_dir="multirun/absent",
                                      storage=f"sqlite:///{tmp_path}/optuna.db")
    for error in ("An Optuna range sweep must contain at least one value.",
                  "Record does not exist."):  # no such study to read back
        def fail(self, arguments, error=error):
            raise ValueError(error)
        monkeypatch.setattr(OptunaSweeper, "sweep", fail)
        with pytest.raises(ValueError, match=error.rstrip(".")):
            sweeper.sweep([])
