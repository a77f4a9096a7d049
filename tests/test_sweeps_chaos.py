"""Chaos on a shared study: three workers started together with the same command on one
PostgreSQL study, one of them SIGKILLed mid-trial while the others go on."""

import os
import re
import signal
import subprocess
import sys
import time
import uuid

import optuna
import pytest
from test_sweeps import SEARCH
from test_sweeps_end_to_end import _fresh_database, pg_url

from rookworld.sweeps.callbacks import STALE_REASON
from rookworld.sweeps.storage import open_storage
from rookworld.sweeps.trial import TRIAL_KEY

optuna.logging.set_verbosity(optuna.logging.WARNING)
GRACE_S = 4  # sweep.grace_s of the workers: a trial silent this long is dead
LAUNCH = re.compile(r"sweep\.trial=(\d+)")  # the sweeper's line for each job it launches


def _victim(logs, study_dir, storage, study):
    """(worker, trial) of a worker now training a drawn (not queued) trial, or None."""
    try:
        trials = {t.number: t for t in optuna.load_study(study_name=study, storage=storage).trials}
    except KeyError:  # no worker has created the study yet
        return None
    for w, log in enumerate(logs):
        launched = LAUNCH.findall(log.read_text())
        if not launched:
            continue
        n = int(launched[-1])
        t = trials.get(n)
        # run_config.yaml: written once the job records heartbeats and loads its data
        if t is not None and t.state.name == "RUNNING" and "fixed_params" not in t.system_attrs \
                and (study_dir / f"trial-{n}" / "run_config.yaml").exists():
            return w, n
    return None


@pytest.mark.postgres
@pytest.mark.slow
def test_three_workers_one_killed_mid_trial_leave_distinct_points_and_no_running_trial(
        tiny_overrides, tmp_path):
    url, study, n_trials = _fresh_database(pg_url()), f"chaos{uuid.uuid4().hex[:8]}", 5
    args = [a for a in tiny_overrides if a != "num_generations=2"]  # searched, not fixed
    cmd = [sys.executable, "-m", "rookworld.train", "-m", SEARCH, *args, "batch_size=8",
           "eval_every=0", f"hydra.sweeper.n_trials={n_trials}", f"sweep.storage={url}",
           f"hydra.sweeper.study_name={study}", "sweep.heartbeat_s=1", f"sweep.grace_s={GRACE_S}"]
    env = dict(os.environ, HYDRA_FULL_ERROR="1", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    logs = [tmp_path / f"worker{w}.log" for w in range(3)]
    procs = [subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log.open("w"),
                              stderr=subprocess.STDOUT, start_new_session=True) for log in logs]
    try:
        deadline, victim, storage = time.monotonic() + 300, None, open_storage(url)
        while victim is None and time.monotonic() < deadline:
            time.sleep(0.2)
            victim = _victim(logs, tmp_path / "multirun" / study, storage, study)
        assert victim is not None, "no worker trained a drawn trial within 300 s"
        w, killed = victim
        os.killpg(procs[w].pid, signal.SIGKILL)  # the worker's whole process group, mid-trial
        survivors = [p for i, p in enumerate(procs) if i != w]
        for p in survivors:
            p.wait(timeout=600)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    texts = [log.read_text() for log in logs]
    assert all(p.returncode == 0 for p in survivors), "\n\n".join(x[-3000:] for x in texts)

    trials = optuna.load_study(study_name=study, storage=url).trials
    states = {t.number: t.state.name for t in trials}
    assert set(states.values()) <= {"COMPLETE", "FAIL"}, states  # no RUNNING trial is left
    assert states[killed] == "FAIL"
    assert {t.user_attrs.get("reason") for t in trials if t.number == killed} == {STALE_REASON}
    assert all(t.user_attrs.get("reason") for t in trials if t.state.name == "FAIL")
    # failed by a worker still running (none was started again)
    assert any(f"trials [{killed}] were left RUNNING" in texts[i] for i in range(3) if i != w)
    assert len(trials) >= 2 * n_trials + 1
    points = [tuple(sorted((k, v) for k, v in t.params.items() if k != TRIAL_KEY))
              for t in trials]
    assert len(set(points)) == len(points), points  # no two trials share a point
    assert sum("fixed_params" in t.system_attrs for t in trials) == 1  # the queued defaults, once
