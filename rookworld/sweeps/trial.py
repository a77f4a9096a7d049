"""What one sweep job does and records.

A job (one Optuna trial) trains `sweep.replicas` runs of its config with seeds
seed, seed+1, ..., aggregates their outcomes and returns the objective: the
mean over replicas of each replica's objective, where a replica that did not
succeed (or whose objective is not finite) counts as `sweep.failed_objective`.
It never raises for a failed replica and never returns NaN.

The Hydra Optuna sweeper has no path for user attributes, so the job writes
them itself: it opens the study's storage, finds its own RUNNING trial (by the
trial number that `tag` passed in as `sweep.trial`, else by its parameters) and
sets the attributes below before the sweeper records the objective. Read them
with plain Optuna: `optuna.load_study(study_name=..., storage=...).trials[i].user_attrs`.

    outcomes          ["success", "kl_failure", ...], one per replica
    seeds             [seed, seed+1, ...]
    success_rate, kl_failure_rate, nan_failure_rate, error_rate   shares of replicas
    objective         the value returned to Optuna
    final_eval        final held-out eval metrics, mean over successful replicas ({} if none)
    run_dir           the trial's output directory
    replicas          per replica: seed, status, step, reason, objective, run_dir, final_eval

The same dict is written to `<run_dir>/trial.json`.

A trial with an `error` replica (a setting this trial drew that cannot run, a crash) did
not measure its point: the job records its attributes plus `reason`, then raises
TrialFailed, so that Optuna stores the trial as FAIL (kept out of "Best parameters" and out
of the study's success rates). KL and NaN failures are results: such a trial is COMPLETE,
and each failed replica adds sweep.failed_objective to its mean.
"""

from __future__ import annotations

import json
import math
import os
import socket
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import optuna
from omegaconf import DictConfig, OmegaConf, open_dict

from ..files import atomic_write_text
from ..guards import OUTCOMES
from .storage import HEARTBEAT_S, open_storage

TRIAL_KEY = "sweep.trial"  # the fixed parameter carrying the Optuna trial number into the job


def tag(config: DictConfig | None, trial: optuna.trial.Trial) -> None:
    """Sweeper `custom_search_space` hook, run by the sweep process as it asks each trial:
    pass the trial number to the job as the single-valued parameter `sweep.trial` (the
    sampler never sees it), so the job finds its own trial unambiguously and its output
    directory is named after it; and keep the trial's heartbeat from this process until the
    trial is told (`AskedTrials`)."""
    trial.suggest_int(TRIAL_KEY, trial.number, trial.number)
    url = OmegaConf.select(config, "hydra.sweeper.storage") if config is not None else None
    if url:
        interval = float(OmegaConf.select(config, "sweep.heartbeat_s", default=HEARTBEAT_S))
        asked_trials(str(url), interval).add(trial.study.study_name, trial.number)


class AskedTrials:
    """The sweep process's heartbeat for every trial it asked for, until the trial is told
    (COMPLETE or FAIL): a trial whose job has not started yet (queued behind others, or on a
    cluster) or has ended while the sweeper waits for the rest of its batch stays alive
    while this process lives, and falls silent when it dies, so that the stale-trial checks
    (rookworld.sweeps.callbacks) fail exactly the trials of dead processes. The first beat
    is recorded as the trial is asked; a daemon thread with its own connection beats every
    interval_s seconds."""

    def __init__(self, url: str, interval_s: float):
        self.storage = open_storage(url)
        self.interval_s = interval_s
        self.ids: set[int] = set()
        self.lock = threading.Lock()
        threading.Thread(target=self._beat, name="asked-trials-heartbeat", daemon=True).start()

    def add(self, study_name: str, number: int) -> None:
        study_id = self.storage.get_study_id_from_name(study_name)
        trial_id = self.storage.get_trial_id_from_study_id_trial_number(study_id, number)
        self.storage.record_heartbeat(trial_id)
        with self.lock:
            self.ids.add(trial_id)

    def _beat(self) -> None:
        while True:
            time.sleep(self.interval_s)
            with self.lock:
                ids = list(self.ids)
            for trial_id in ids:
                try:
                    if self.storage.get_trial(trial_id).state.is_finished():
                        with self.lock:
                            self.ids.discard(trial_id)
                    else:
                        self.storage.record_heartbeat(trial_id)
                except Exception:  # noqa: BLE001,S112 - a missed beat; the next one retries
                    continue


_ASKED: dict[str, AskedTrials] = {}


def asked_trials(url: str, interval_s: float) -> AskedTrials:
    """This process's `AskedTrials` for the storage at `url` (one thread per storage)."""
    if url not in _ASKED:
        _ASKED[url] = AskedTrials(url, interval_s)
    return _ASKED[url]


@dataclass(frozen=True)
class StudyRef:
    """The Optuna study a job belongs to."""

    storage: str
    study_name: str


def study_ref(hydra_cfg: DictConfig) -> StudyRef | None:
    """The study from the Hydra config of a running job; None when the sweeper is not
    Optuna's or keeps the study in memory (then only trial.json is written)."""
    sweeper = hydra_cfg.get("sweeper") or {}
    if "optuna" not in str(sweeper.get("_target_", "")).lower() or not sweeper.get("storage"):
        return None
    return StudyRef(str(sweeper.storage), str(sweeper.study_name))


def summarize(replicas: list[dict], failed_objective: float) -> dict:
    """Per-replica results -> the trial's outcome counts, rates and objective.

    replicas: dicts with seed, status (one of guards.OUTCOMES), objective, final_eval, run_dir.
    A replica whose status is not success, or whose objective is not finite, counts
    as failed_objective.
    """
    n = len(replicas)
    counts = Counter(r["status"] for r in replicas)
    values = [r["objective"] if r["status"] == "success" and math.isfinite(r["objective"])
              else failed_objective for r in replicas]
    ok = [r["final_eval"] for r in replicas if r["status"] == "success" and r["final_eval"]]
    keys = set.intersection(*(set(e) for e in ok)) if ok else set()
    return {
        "outcomes": [r["status"] for r in replicas],
        "seeds": [r["seed"] for r in replicas],
        **{f"{s}_rate": counts[s] / n for s in OUTCOMES},
        "objective": sum(values) / n,
        "final_eval": {k: sum(e[k] for e in ok) / len(ok) for k in sorted(keys)},
        "replicas": replicas,
    }


def replica_config(cfg: DictConfig, index: int, study: StudyRef | None) -> DictConfig:
    """The trial's config for replica `index`: seed + index; a W&B logger joins the
    study's group as job type `trial` (unless the user set group or job type)."""
    out = cfg.copy()
    with open_dict(out):
        out.seed = cfg.seed + index
        wandb = (out.get("logger") or {}).get("wandb")
        if wandb is not None:
            trial = OmegaConf.select(cfg, TRIAL_KEY, default=None)
            if wandb.get("group") is None and study:
                wandb.group = study.study_name
            if wandb.get("job_type", "train") == "train":
                wandb.job_type = "trial"
            if wandb.get("name") is None and trial is not None:
                wandb.name = f"{wandb.get('group') or 'sweep'}-trial{trial}-seed{out.seed}"
    return out


def run_replica(cfg: DictConfig, run_dir: Path, run_fn: Callable) -> dict:
    """Train one replica in run_dir with run_fn(cfg, run_dir, multirun=True) -> RunResult;
    an exception (bad config or data for this trial) becomes an `error` outcome."""
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        r = run_fn(cfg, run_dir, multirun=True)
        status, step, reason, objective, final = (r.outcome.status, r.outcome.step,
                                                  r.outcome.reason, r.objective, r.final_eval)
        key = cfg.sweep.objective
        if status == "success" and key not in final:  # a misspelt key, or a measure not run
            status, reason = "error", (
                f"sweep.objective={key} is not a metric of the final evaluation (it has "
                f"{', '.join(sorted(final)[:8])}, ...); name one of them, or turn on what "
                "measures it (a strength measure needs strength=fast or full)")
            print(f"[rookworld] replica seed={cfg.seed}: {reason}", flush=True)
    except Exception as e:  # recorded as the replica's outcome, with its traceback on disk
        (run_dir / "error.txt").write_text(traceback.format_exc())
        status, step, reason, objective, final = "error", -1, f"{type(e).__name__}: {e}", \
            float(cfg.sweep.failed_objective), {}
        print(f"[rookworld] replica seed={cfg.seed} failed: {reason}", flush=True)
    return {"seed": int(cfg.seed), "status": status, "step": int(step), "reason": reason,
            "objective": float(objective), "run_dir": str(run_dir),
            "final_eval": {k: float(v) for k, v in final.items() if k.startswith("eval/")}}


def find_trial_id(storage: optuna.storages.RDBStorage, study_id: int, cfg: DictConfig) -> int:
    """This job's trial: by the number `tag` passed in, else the one RUNNING trial whose
    parameters all equal this job's config values."""
    number = OmegaConf.select(cfg, TRIAL_KEY, default=None)
    if number is None:
        running = storage.get_all_trials(study_id, deepcopy=False,
                                         states=(optuna.trial.TrialState.RUNNING,))
        matches = [t.number for t in running if t.params and all(
            OmegaConf.select(cfg, k, default=None) == v for k, v in t.params.items())]
        if len(matches) != 1:
            raise RuntimeError(f"{len(matches)} running trials match this job's parameters; "
                               "set hydra.sweeper.custom_search_space=rookworld.sweeps.trial.tag")
        number = matches[0]
    return storage.get_trial_id_from_study_id_trial_number(study_id, int(number))


_WATCHING = False  # a worker runs many jobs; one watcher thread is enough


def exit_with_parent() -> None:
    """In a job run by a worker process of the sweep (the joblib launcher's loky workers),
    end this process when that parent dies: a killed sweep driver must not leave workers
    training for minutes on trials nobody will record (their trials stay RUNNING and the
    next start of the sweep fails them). Jobs in the driver's own process (the basic
    launcher) or started by submitit are not children of this kind and keep running."""
    import multiprocessing

    global _WATCHING
    parent = multiprocessing.parent_process()
    if parent is None or _WATCHING:
        return
    _WATCHING = True
    ppid = os.getppid()

    def watch() -> None:  # polled: loky's parent sentinel does not report the parent's death
        while os.getppid() == ppid:
            time.sleep(1.0)
        print(f"[rookworld] the sweep process {ppid} ended; this worker stops", flush=True)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


JOB_ATTR = "rookworld_job"  # system attribute: the host and process of the trial's job


def job_identity() -> dict:
    """{"host", "pid"} of this process, recorded on the trial whose job it runs, so that a
    later start of the sweep can tell a live job (a submitit one outlives the sweep
    process) from a dead one without waiting out the grace period."""
    return {"host": socket.gethostname(), "pid": os.getpid()}


def job_alive(job: dict | None) -> bool | None:
    """Whether the recorded job's process lives: True or False on this host, None for a job
    on another host or none recorded (its heartbeat must tell). This process is never the
    job (a restarted sweep may reuse a dead job's pid)."""
    if not job or job.get("host") != socket.gethostname():
        return None
    if int(job["pid"]) == os.getpid():
        return False
    try:
        os.kill(int(job["pid"]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True


class Heartbeat:
    """While the job runs, record its trial's heartbeat every sweep.heartbeat_s seconds
    (HEARTBEAT_S when unset; a daemon thread with its own connection), so that a worker
    that dies leaves a trial that the other workers and the next sweep start can tell from
    a live one (rookworld.sweeps.callbacks)."""

    def __init__(self, study: StudyRef | None, cfg: DictConfig):
        self.study, self.cfg = study, cfg
        self.interval_s = float(OmegaConf.select(cfg, "sweep.heartbeat_s", default=HEARTBEAT_S))
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def __enter__(self) -> Heartbeat:
        if self.study is None:
            return self
        try:
            storage = open_storage(self.study.storage)
            trial_id = find_trial_id(
                storage, storage.get_study_id_from_name(self.study.study_name), self.cfg)
            storage.set_trial_system_attr(trial_id, JOB_ATTR, job_identity())
            storage.record_heartbeat(trial_id)
        except Exception as e:  # noqa: BLE001 - a job runs without a heartbeat rather than not at all
            print(f"[rookworld] no heartbeat for this trial ({type(e).__name__}: {e})",
                  flush=True)
            return self

        def beat() -> None:
            while not self.stop.wait(self.interval_s):
                try:
                    storage.record_heartbeat(trial_id)
                except Exception:  # noqa: BLE001,S112 - a missed beat; the next one retries
                    continue
            storage.engine.dispose()

        self.thread = threading.Thread(target=beat, name="trial-heartbeat", daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=10)


def record(study: StudyRef, cfg: DictConfig, attrs: dict) -> None:
    """Set attrs as user attributes on this job's RUNNING trial."""
    storage = open_storage(study.storage)
    trial_id = find_trial_id(storage, storage.get_study_id_from_name(study.study_name), cfg)
    for key, value in attrs.items():
        storage.set_trial_user_attr(trial_id, key, value)


class TrialFailed(RuntimeError):
    """A replica of the trial ended in an error: the trial is recorded FAIL."""


def run_trial(cfg: DictConfig, out_dir: Path, run_fn: Callable,
              study: StudyRef | None) -> float:
    """Run the trial's replicas (in out_dir itself when there is one, else in
    out_dir/seed-<s>), record the summary, return the objective; raise TrialFailed
    (after recording) when a replica ended in an error."""
    n = cfg.sweep.replicas
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"sweep.replicas must be an integer >= 1, got {n!r}")
    exit_with_parent()
    replicas = []
    with Heartbeat(study, cfg):
        for i in range(n):
            rcfg = replica_config(cfg, i, study)
            replicas.append(run_replica(
                rcfg, out_dir if n == 1 else out_dir / f"seed-{rcfg.seed}", run_fn))
    attrs = {**summarize(replicas, float(cfg.sweep.failed_objective)), "run_dir": str(out_dir)}
    errors = [f"seed {r['seed']}: {r['reason']}" for r in replicas if r["status"] == "error"]
    if errors:
        attrs["reason"] = "; ".join(errors)[:1000]
    atomic_write_text(out_dir / "trial.json", json.dumps(attrs, indent=2))
    if study:
        record(study, cfg, attrs)
    if errors:
        print(f"[rookworld] trial failed (recorded FAIL): {attrs['reason']}", flush=True)
        raise TrialFailed(attrs["reason"])
    print(f"[rookworld] trial outcomes={attrs['outcomes']} objective={attrs['objective']:.4f}",
          flush=True)
    return attrs["objective"]
