"""Optuna sweeps run end to end through Hydra: basic, joblib and submitit launchers, a rerun
of the same sweep, and several workers on one PostgreSQL study."""

import math
import os
import subprocess
import sys
import uuid
from pathlib import Path

import optuna
import pytest
from test_sweeps import SEARCH  # the sweep's config group, as the unit tests compose it

from rookworld.sweeps import report

optuna.logging.set_verbosity(optuna.logging.WARNING)


# ---- sweeps end to end -------------------------------------------------------------------

def _train(args, cwd, timeout=600):
    env = dict(os.environ, HYDRA_FULL_ERROR="1", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "rookworld.train", "-m", SEARCH, *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _trials(url, name="grpo_stability"):
    return optuna.load_study(study_name=name, storage=url).trials


def _assert_recorded(trials):
    for t in trials:
        a = t.user_attrs
        assert t.state.name == "COMPLETE" and math.isfinite(t.value), t
        assert len(a["outcomes"]) == 1 and a["run_dir"].endswith(f"trial-{t.number}")
        assert (Path(a["run_dir"]) / "metrics.jsonl").exists()


def test_sweep_mixed_outcomes_user_attrs_and_report(tiny_overrides, tmp_path):
    """Two trials on a grid over the KL threshold: one trips the guard at step 1, one not."""
    out = _train([*tiny_overrides, "batch_size=4", "hydra.sweeper.params=null",
                  "hydra/sweeper/sampler=grid", "guard.kl.threshold=choice(1e-12,1e6)",
                  "guard.kl.window=1", "optim.lr=0.01", "algorithm.entropy_coef=0.05",
                  "kl.beta=0"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "sweep.enqueue point" in out.stdout  # the defaults are no point of this grid
    study_dir = tmp_path / "multirun" / "grpo_stability"
    trials = _trials(f"sqlite:///{study_dir}/optuna.db")  # plain Optuna reads them back
    _assert_recorded(trials)
    by_threshold = {t.params["guard.kl.threshold"]: t for t in trials}
    failed, ok = by_threshold[1e-12], by_threshold[1e6]
    assert failed.user_attrs["outcomes"] == ["kl_failure"] and failed.value == -1.0
    assert failed.user_attrs["kl_failure_rate"] == 1.0 and failed.user_attrs["final_eval"] == {}
    assert ok.user_attrs["outcomes"] == ["success"] and ok.user_attrs["success_rate"] == 1.0
    assert ok.value == ok.user_attrs["final_eval"]["eval/reward"]
    text = report.main([str(study_dir)])
    assert "**Study success rate 50%** (1/2 runs)" in text and "KL-failure rate 50%" in text
    assert (study_dir / "kl.png").exists() and (study_dir / "params.png").exists()


@pytest.mark.slow
def test_joblib_parallel_trials_then_rerun_resumes_the_study(tiny_overrides, tmp_path):
    args = [*tiny_overrides, "steps=1", "batch_size=4", "hydra.sweeper.n_trials=2",
            "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "hydra.sweeper.n_jobs=2",
            "hydra.sweeper.params.num_generations='choice(2,4)'"]
    args = [a for a in args if a != "num_generations=2"]  # searched, not fixed
    for _ in range(2):
        out = _train(args, cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-3000:]
    study_dir = tmp_path / "multirun" / "grpo_stability"
    trials = _trials(f"sqlite:///{study_dir}/optuna.db")
    assert [t.number for t in trials] == [0, 1, 2, 3]
    _assert_recorded(trials)
    assert sorted(p.name for p in study_dir.glob("trial-*")) == [f"trial-{i}" for i in range(4)]


@pytest.mark.slow
def test_submitit_local_launcher(tiny_overrides, tmp_path):
    out = _train([*tiny_overrides, "steps=1", "batch_size=4", "hydra.sweeper.n_trials=2",
                  "hydra.sweeper.n_jobs=2", "hydra/launcher=submitit_local"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    study_dir = tmp_path / "multirun" / "grpo_stability"
    trials = _trials(f"sqlite:///{study_dir}/optuna.db")
    assert len(trials) == 2
    _assert_recorded(trials)
    assert (study_dir / ".submitit").is_dir()


def _fresh_database(url: str) -> str:
    """A new empty database on the server of `url` (workers then race to create Optuna's
    tables); the same database with a fresh study name if we may not create one."""
    import sqlalchemy as sa

    name = f"sweep_{uuid.uuid4().hex[:10]}"
    try:
        with sa.create_engine(url, isolation_level="AUTOCOMMIT").connect() as c:
            c.execute(sa.text(f"CREATE DATABASE {name}"))
    except sa.exc.SQLAlchemyError:
        return url
    return url.rsplit("/", 1)[0] + "/" + name


def pg_url() -> str:
    """The PostgreSQL server of ROOKWORLD_PG_URL; skips the test without one (fails it
    under ROOKWORLD_REQUIRE_PG, which CI sets)."""
    base = os.environ.get("ROOKWORLD_PG_URL")
    if not base:
        if os.environ.get("ROOKWORLD_REQUIRE_PG"):  # CI (.ci/run) starts a server: never skip
            pytest.fail("ROOKWORLD_REQUIRE_PG is set but ROOKWORLD_PG_URL is not")
        pytest.skip("ROOKWORLD_PG_URL not set (scripts/start_postgres.sh starts a server)")
    return base


@pytest.mark.postgres
@pytest.mark.slow
def test_parallel_workers_on_one_postgres_study(tiny_overrides, tmp_path):
    url, study, n_trials, workers = _fresh_database(pg_url()), f"w{uuid.uuid4().hex[:8]}", 2, 3
    env = dict(os.environ, HYDRA_FULL_ERROR="1", OMP_NUM_THREADS="1")
    procs = [subprocess.Popen(
        [sys.executable, "-m", "rookworld.train", "-m", SEARCH, *tiny_overrides, "steps=1",
         "batch_size=4", f"hydra.sweeper.n_trials={n_trials}", f"sweep.storage={url}",
         f"hydra.sweeper.study_name={study}"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(workers)]
    logs = [p.communicate(timeout=900)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n\n".join(x[-2000:] for x in logs)
    trials = _trials(url, study)
    assert sorted(t.number for t in trials) == list(range(n_trials * workers))
    _assert_recorded(trials)
    assert len({t.user_attrs["run_dir"] for t in trials}) == n_trials * workers


@pytest.mark.slow
def test_a_sweep_run_twice_holds_distinct_points(tiny_overrides, tmp_path):
    args = [*tiny_overrides, "steps=1", "batch_size=8", "eval_every=0",
            "hydra.sweeper.n_trials=3"]  # batch 8: every searched group size divides it
    args = [a for a in args if a != "num_generations=2"]  # searched, not fixed
    for _ in range(2):
        out = _train(args, cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-3000:]
    trials = _trials(f"sqlite:///{tmp_path}/multirun/grpo_stability/optuna.db")
    points = {tuple(sorted((k, v) for k, v in t.params.items() if k != "sweep.trial"))
              for t in trials}
    assert len(trials) == 6 and len(points) == 6


def test_a_sweep_whose_every_trial_fails_ends_in_a_message(tiny_overrides, tmp_path):
    """No trial completes (a final-evaluation key no run writes): the sweep names the study's
    state and the report command, instead of Optuna's traceback for a missing best trial."""
    out = _train([*tiny_overrides, "steps=1", "batch_size=4", "hydra.sweeper.params=null",
                  "hydra.sweeper.n_trials=1", "sweep.enqueue=[]", "sweep.objective=eval/nope"],
                 cwd=tmp_path)
    study_dir = tmp_path / "multirun" / "grpo_stability"
    assert out.returncode == 1, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "Record does not exist" not in out.stderr
    assert "no trial of study 'grpo_stability' has completed (1 failed)" in out.stderr
    assert "python -m rookworld.sweeps.report multirun/grpo_stability" in out.stderr
    assert [t.state.name for t in _trials(f"sqlite:///{study_dir}/optuna.db")] == ["FAIL"]
