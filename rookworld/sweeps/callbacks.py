"""Hydra callbacks and the sampler of Optuna sweeps (registered by hparams_search).

A trial whose process was killed (SIGKILL, OOM, a lost node) never reports back, so the
study would keep it RUNNING forever. `FailStaleTrials` marks dead trials FAIL, with the
reason in the trial's `fail_reason` system attribute and its `reason` user attribute:
  at every start of the sweep command, by any worker, before new trials are asked
    (on_multirun_start): on SQLite, which serves one sweep process at a time, every
    RUNNING trial but those whose job outlived the sweep process that asked for it (a
    submitit job: its process lives on this host, or on another its heartbeat goes on);
    on a shared server (PostgreSQL), the RUNNING trials whose heartbeat stopped;
  before each trial a worker runs (on_job_start): the RUNNING trials whose heartbeat
    stopped, so the workers still alive fail a dead worker's trials as the sweep goes on.
A trial's job records a heartbeat every sweep.heartbeat_s seconds (rookworld.sweeps.trial);
one silent for sweep.grace_s seconds belongs to a dead process, while live trials are left
alone. A dead trial whose job did finish and record its result (its objective user
attribute, without a failure reason) is completed with that objective instead.

`EnqueueTrials.on_multirun_start` then queues the settings of `sweep.enqueue` that the
study does not hold yet, which the sweeper's next asks run first; workers started together
queue them once (`study_lock`).

`continuing_tpe` builds the sampler: TPE whose draws for a trial are seeded by the
configured seed and the trial's number, so that every trial of a study draws from its own
stream, whichever worker asks for it.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import optuna
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from .storage import (
    GRACE_S,
    StudyInUse,
    hold_sqlite_study,
    open_storage,
    release_sqlite_study,
    study_lock,
)
from .trial import JOB_ATTR, job_alive

STALE_REASON = ("its process ended without reporting a result (killed or crashed hard); "
                "marked FAIL by a later start of the sweep or by a worker still running")


def fail_stale_trials(url: str, study_name: str, only_silent: bool | None = None,
                      grace_s: int = GRACE_S) -> list[int]:
    """Mark the dead RUNNING trials of `study_name` FAIL; returns their numbers (nothing
    when the study does not exist yet). only_silent: only trials whose heartbeat is older
    than grace_s (default: on for every storage but SQLite); off: every RUNNING trial but
    those whose job (`trial.job_identity`) has a heartbeat within grace_s and, on this
    host, a live process."""
    storage = open_storage(url, grace_s=grace_s)
    try:
        study_id = storage.get_study_id_from_name(study_name)
    except KeyError:
        storage.engine.dispose()
        return []
    if only_silent is None:
        only_silent = not url.startswith("sqlite")
    failed = []
    try:
        stale = storage._get_stale_trial_ids(study_id)  # the query Optuna's own makes
        if only_silent:
            ids = stale
        else:  # no sweep process lives: a trial lives only in a job that outlived its own
            ids = []
            for t in storage.get_all_trials(study_id, deepcopy=False,
                                            states=(optuna.trial.TrialState.RUNNING,)):
                alive = job_alive(t.system_attrs.get(JOB_ATTR))
                trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, t.number)
                # a live pid whose heartbeat went silent is another process that reuses it
                if alive is False or trial_id in stale or (
                        alive is None and JOB_ATTR not in t.system_attrs):
                    ids.append(trial_id)
        for trial_id in ids:
            try:
                done = storage.get_trial(trial_id).user_attrs
                if "objective" in done and not done.get("reason"):
                    # its job finished and recorded its result, but the sweep process that
                    # would have reported it to Optuna was gone: the result counts
                    storage.set_trial_state_values(trial_id, optuna.trial.TrialState.COMPLETE,
                                                   [float(done["objective"])])
                    continue
                reason = done.get("reason") or STALE_REASON  # a failed job's own, if recorded
                storage.set_trial_system_attr(trial_id, "fail_reason", reason)
                storage.set_trial_user_attr(trial_id, "reason", reason)
                if storage.set_trial_state_values(trial_id, optuna.trial.TrialState.FAIL):
                    failed.append(storage.get_trial_number_from_id(trial_id))
            except optuna.exceptions.UpdateFinishedTrialError:
                pass  # another worker failed (or its job finished) it meanwhile
    finally:
        storage.engine.dispose()
    return failed


def settle_unlaunched(url: str, study_name: str, numbers: list[int], reason: str
                      ) -> dict[int, float | None]:
    """The trials of a batch whose launch raised (a config the launcher cannot compose, a
    killed joblib worker): number -> the objective its job recorded (a job that finished
    before the launcher failed: it counts), or None, after recording `reason` on the trial
    where its job recorded none. The sweeper then tells Optuna each result."""
    storage = open_storage(url)
    out: dict[int, float | None] = {}
    try:
        study_id = storage.get_study_id_from_name(study_name)
        for number in numbers:
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, number)
            attrs = storage.get_trial(trial_id).user_attrs
            if "objective" in attrs and not attrs.get("reason"):
                out[number] = float(attrs["objective"])
                continue
            out[number] = None
            if not attrs.get("reason"):
                storage.set_trial_user_attr(trial_id, "reason", reason)
                storage.set_trial_system_attr(trial_id, "fail_reason", reason)
    finally:
        storage.engine.dispose()
    return out


class FailStaleTrials(Callback):
    """hydra.callbacks entry: dead RUNNING trials become FAIL at every start of a sweep
    (on SQLite every RUNNING trial without a live job, the silent ones elsewhere) and before
    each of its trials (the silent ones), after sweep.grace_s seconds without a heartbeat.
    On SQLite
    the sweep process holds the study for its lifetime (`hold_sqlite_study`): a second one
    started on it stops with a message, before it could fail the first one's live trials."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        url = OmegaConf.select(config, "hydra.sweeper.storage")
        if url and str(url).startswith("sqlite:///"):
            try:
                hold_sqlite_study(_sqlite_path(str(url)))
            except StudyInUse as e:  # Hydra turns a callback's Exception into a warning
                raise SystemExit(f"rookworld: {e}") from None
        _fail_stale(config, only_silent=None)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        url = OmegaConf.select(config, "hydra.sweeper.storage")
        if url and str(url).startswith("sqlite:///"):
            release_sqlite_study(_sqlite_path(str(url)))

    def on_job_start(self, config: DictConfig, **kwargs) -> None:
        _fail_stale(config, only_silent=True)


def _sqlite_path(url: str) -> str:
    """The database file of a sqlite:/// URL (without its ?options)."""
    return url[len("sqlite:///"):].split("?", 1)[0]


def _fail_stale(config: DictConfig, only_silent: bool | None) -> None:
    sweeper = OmegaConf.select(config, "hydra.sweeper") or {}
    url, name = sweeper.get("storage"), sweeper.get("study_name")
    if not url or not name:
        return
    grace_s = int(OmegaConf.select(config, "sweep.grace_s", default=GRACE_S))
    failed = fail_stale_trials(str(url), str(name), only_silent=only_silent, grace_s=grace_s)
    if failed:
        print(f"[rookworld] study {name}: trials {failed} were left RUNNING by a process "
              "that died; marked FAIL", flush=True)


def _holds(trial: optuna.trial.FrozenTrial, point: dict) -> bool:
    """Whether `trial` was asked (or is queued) for `point`: its fixed or suggested values
    equal the point's on the point's keys (floats to rounding)."""
    values = trial.system_attrs.get("fixed_params") or trial.params
    return all(k in values and _same(values[k], v) for k, v in point.items())


def _same(a, b) -> bool:
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (a, b))
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0) if numbers else a == b


def searched_distributions(params, overrides=()) -> dict:
    """hydra.sweeper.params (name -> the sweeper's override syntax) and the command line's
    overrides after them -> name -> Optuna distribution, as the Optuna sweeper builds its
    search space: a command-line sweep override replaces a parameter's range, a plain value
    fixes it (then it is not searched)."""
    from hydra_plugins.hydra_optuna_sweeper._impl import create_params_from_overrides
    dists, fixed, _ = create_params_from_overrides([f"{k}={v}" for k, v in params.items()]
                                                   + list(overrides))
    return {k: d for k, d in dists.items() if k not in fixed}


def outside(point: dict, dists: dict) -> str:
    """Why `point` is not a setting of the search space `dists` ('' when it is): it must
    name exactly the searched parameters, each inside its distribution."""
    if set(point) != set(dists):
        return f"it must name every searched parameter ({', '.join(sorted(dists))}) and no other"
    for k, v in point.items():
        try:
            inside = dists[k]._contains(dists[k].to_internal_repr(v))
        except (ValueError, TypeError):
            inside = False
        if not inside:
            return f"{k}={v} lies outside its search space {dists[k]}"
    return ""


_LIVE = (optuna.trial.TrialState.WAITING, optuna.trial.TrialState.RUNNING,
         optuna.trial.TrialState.COMPLETE)


def enqueue_trials(url: str, study_name: str, directions: list[str],
                   points: list[dict]) -> list[dict]:
    """Queue each point (parameter name -> value) that no waiting, running or complete
    trial of the study holds, creating the study if needed; returns the points queued.
    A point whose trial failed (a killed process) is queued again. The study is locked
    meanwhile (PostgreSQL), so that workers started together queue a point once."""
    storage = open_storage(url)
    try:
        with study_lock(storage, study_name):  # workers started together queue a point once
            study = optuna.create_study(study_name=study_name, storage=storage,
                                        directions=directions, load_if_exists=True)
            trials = study.get_trials(deepcopy=False, states=_LIVE)
            added = []
            for point in points:
                if not any(_holds(t, point) for t in trials):
                    study.enqueue_trial(point)
                    added.append(point)
        return added
    finally:
        storage.engine.dispose()


class EnqueueTrials(Callback):
    """hydra.callbacks entry: before the sweeper asks its first trial, queue the points of
    `sweep.enqueue` the study does not hold yet (Optuna's enqueue_trial), so a study
    always holds them, its reference settings among them, whatever the sampler draws. A
    point must set exactly the searched parameters (hydra.sweeper.params), each inside its
    range, the command line's overrides included; one that does not (a search space
    changed on the command line, a searched parameter fixed there) is skipped with a
    note."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        sweeper = config.hydra.sweeper
        url, name = sweeper.get("storage"), sweeper.get("study_name")
        points = config.get("sweep", {}).get("enqueue") or []
        if not url or not name or not points:
            return
        direction = sweeper.get("direction") or "minimize"
        directions = [str(d) for d in direction] if OmegaConf.is_list(direction) \
            else [str(direction)]
        task = OmegaConf.select(config, "hydra.overrides.task", default=None) or []
        dists = searched_distributions(sweeper.get("params") or {}, list(task))
        kept = []
        for p in points:
            p = OmegaConf.to_container(p, resolve=True)
            why = outside(p, dists)
            if why:  # a search space of the user's own: the point is not a setting of it
                print(f"[rookworld] study {name}: sweep.enqueue point {p} not queued: {why}")
            else:
                kept.append(p)
        for point in enqueue_trials(str(url), str(name), directions, kept):
            print(f"[rookworld] study {name}: queued {point} (sweep.enqueue)")


def trial_seed(seed: int, number: int) -> int:
    """The seed of trial `number`'s draws: seed and number mixed by numpy's SeedSequence,
    so that different (seed, number) pairs get unrelated streams."""
    return int(np.random.SeedSequence([seed % 2**64, number]).generate_state(1)[0])


class TrialSeededTPESampler(optuna.samplers.BaseSampler):
    """Optuna's TPE sampler whose draws for trial n come from a TPESampler seeded with
    trial_seed(seed, n). A trial's number is unique in its study, whichever worker asks
    for it, so workers started together on one study draw different points; one worker
    on a fresh study gets the same trials for the same command, and a rerun (new trial
    numbers) new ones. Trials asked together (hydra.sweeper.n_jobs > 1) each keep their
    own sampler until they are told."""

    def __init__(self, seed: int, **tpe_kwargs):
        self.seed, self.tpe_kwargs = int(seed), tpe_kwargs
        optuna.samplers.TPESampler(seed=self.seed, **tpe_kwargs)  # bad options raise here
        self._by_trial: dict[int, optuna.samplers.TPESampler] = {}

    def sampler_for(self, number: int) -> optuna.samplers.TPESampler:
        """The TPE sampler that draws trial `number`'s parameters."""
        if number not in self._by_trial:
            with warnings.catch_warnings():  # TPE's option warnings came once, in __init__
                warnings.simplefilter("ignore")
                self._by_trial[number] = optuna.samplers.TPESampler(
                    seed=trial_seed(self.seed, number), **self.tpe_kwargs)
        return self._by_trial[number]

    def infer_relative_search_space(self, study, trial):
        return self.sampler_for(trial.number).infer_relative_search_space(study, trial)

    def sample_relative(self, study, trial, search_space):
        return self.sampler_for(trial.number).sample_relative(study, trial, search_space)

    def sample_independent(self, study, trial, param_name, param_distribution):
        return self.sampler_for(trial.number).sample_independent(
            study, trial, param_name, param_distribution)

    def before_trial(self, study, trial) -> None:
        self.sampler_for(trial.number).before_trial(study, trial)

    def after_trial(self, study, trial, state, values) -> None:
        self.sampler_for(trial.number).after_trial(study, trial, state, values)
        self._by_trial.pop(trial.number, None)

    def reseed_rng(self) -> None:
        for sampler in self._by_trial.values():
            sampler.reseed_rng()


def continuing_tpe(seed: int | None = None, **kwargs) -> optuna.samplers.BaseSampler:
    """hydra.sweeper.sampler._target_: TrialSeededTPESampler (TPE seeded by the configured
    seed and each trial's number); with seed null, Optuna's TPE sampler unseeded."""
    if seed is None:
        return optuna.samplers.TPESampler(seed=None, **kwargs)
    return TrialSeededTPESampler(seed, **kwargs)
