"""Hydra callbacks for Optuna sweeps (registered under hydra.callbacks by hparams_search).

A trial whose process was killed (SIGKILL, OOM, a lost node) never reports back, so the
study would keep it RUNNING forever. `FailStaleTrials.on_multirun_start` (every start of
the sweep command, by any worker) marks dead trials FAIL, with the reason in the trial's
`fail_reason` system attribute and its `reason` user attribute, before new trials are asked:
  SQLite, which serves one sweep process at a time (README): every RUNNING trial, since
    none can be alive at start-up;
  a shared server (PostgreSQL): the RUNNING trials whose heartbeat stopped. A trial's job
    records a heartbeat every HEARTBEAT_S seconds (rookworld.sweeps.trial); one silent for
    GRACE_S seconds belongs to a dead worker, while live workers' trials are left alone.
A dead trial whose job did finish and record its result (its objective user attribute,
without a failure reason) is completed with that objective instead.

`EnqueueTrials.on_multirun_start` then queues the settings of `sweep.enqueue` that the
study does not hold yet, which the sweeper's next asks run first.
"""

from __future__ import annotations

import math

import optuna
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from .storage import GRACE_S, open_storage

STALE_REASON = ("its process ended without reporting a result (killed or crashed hard); "
                "marked FAIL when the sweep was run again")


def fail_stale_trials(url: str, study_name: str, only_silent: bool | None = None,
                      grace_s: int = GRACE_S) -> list[int]:
    """Mark the dead RUNNING trials of `study_name` FAIL; returns their numbers (nothing
    when the study does not exist yet). only_silent: only trials whose heartbeat is older
    than grace_s (default: on for every storage but SQLite)."""
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
        if only_silent:  # the same query Optuna's own fail_stale_trials makes
            ids = storage._get_stale_trial_ids(study_id)
        else:
            ids = [storage.get_trial_id_from_study_id_trial_number(study_id, t.number)
                   for t in storage.get_all_trials(study_id, deepcopy=False,
                                                   states=(optuna.trial.TrialState.RUNNING,))]
        for trial_id in ids:
            try:
                done = storage.get_trial(trial_id).user_attrs
                if "objective" in done and not done.get("reason"):
                    # its job finished and recorded its result, but the sweep process that
                    # would have reported it to Optuna was gone: the result counts
                    storage.set_trial_state_values(trial_id, optuna.trial.TrialState.COMPLETE,
                                                   [float(done["objective"])])
                    continue
                storage.set_trial_system_attr(trial_id, "fail_reason", STALE_REASON)
                storage.set_trial_user_attr(trial_id, "reason", STALE_REASON)
                if storage.set_trial_state_values(trial_id, optuna.trial.TrialState.FAIL):
                    failed.append(storage.get_trial_number_from_id(trial_id))
            except optuna.exceptions.UpdateFinishedTrialError:
                pass  # another worker failed (or its job finished) it meanwhile
    finally:
        storage.engine.dispose()
    return failed


class FailStaleTrials(Callback):
    """hydra.callbacks entry: on a (re)run of a sweep, dead RUNNING trials become FAIL."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        sweeper = config.hydra.sweeper
        url, name = sweeper.get("storage"), sweeper.get("study_name")
        if not url or not name:
            return
        failed = fail_stale_trials(str(url), str(name))
        if failed:
            print(f"[rookworld] study {name}: trials {failed} were left RUNNING by a process "
                  "that died; marked FAIL")


def _holds(trial: optuna.trial.FrozenTrial, point: dict) -> bool:
    """Whether `trial` was asked (or is queued) for `point`: its fixed or suggested values
    equal the point's on the point's keys (floats to rounding)."""
    values = trial.system_attrs.get("fixed_params") or trial.params
    return all(k in values and _same(values[k], v) for k, v in point.items())


def _same(a, b) -> bool:
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (a, b))
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0) if numbers else a == b


def searched_distributions(params) -> dict:
    """hydra.sweeper.params (name -> the sweeper's override syntax) -> name -> Optuna
    distribution, as the Optuna sweeper parses them."""
    from hydra_plugins.hydra_optuna_sweeper._impl import create_params_from_overrides
    dists, _, _ = create_params_from_overrides([f"{k}={v}" for k, v in params.items()])
    return dists


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
    A point whose trial failed (a killed process) is queued again."""
    storage = open_storage(url)
    try:
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
    range; one that does not (a search space changed on the command line) is skipped with
    a note."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        sweeper = config.hydra.sweeper
        url, name = sweeper.get("storage"), sweeper.get("study_name")
        points = config.get("sweep", {}).get("enqueue") or []
        if not url or not name or not points:
            return
        direction = sweeper.get("direction") or "minimize"
        directions = [str(d) for d in direction] if OmegaConf.is_list(direction) \
            else [str(direction)]
        dists = searched_distributions(sweeper.get("params") or {})
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


def trial_count(url: str, study_name: str) -> int:
    """Trials the study holds (0 when it does not exist yet)."""
    storage = open_storage(url)
    try:
        return len(storage.get_all_trials(storage.get_study_id_from_name(study_name),
                                          deepcopy=False))
    except KeyError:
        return 0
    finally:
        storage.engine.dispose()


def continuing_tpe(seed: int | None = None, **kwargs) -> optuna.samplers.TPESampler:
    """hydra.sweeper.sampler._target_: Optuna's TPE sampler whose seed is the configured one
    plus the trials the study already holds, so a rerun of a sweep draws new start-up points
    (with a fixed seed, TPE's random start-up trials came out the same at every rerun),
    while a fresh study gets the same trials for the same command. The config itself is
    left as written (Hydra requires every job's sweeper config to equal the driver's)."""
    from hydra.core.hydra_config import HydraConfig

    sweeper = HydraConfig.get().sweeper
    url, name = sweeper.get("storage"), sweeper.get("study_name")
    held = trial_count(str(url), str(name)) if seed is not None and url and name else 0
    if held:
        print(f"[rookworld] study {name} holds {held} trials: sampler seed {seed + held} for "
              "this run's new ones")
    return optuna.samplers.TPESampler(seed=None if seed is None else seed + held, **kwargs)
