"""Hydra callbacks for Optuna sweeps (registered under hydra.callbacks by hparams_search).

A trial whose process was killed (SIGKILL, OOM, a lost node) never reports back, so the
study keeps it RUNNING forever. On a rerun of the same sweep command,
`FailStaleTrials.on_multirun_start` marks such trials FAIL, with the reason in the trial's
`fail_reason` system attribute (Optuna's own key for trials failed by its heartbeat) and in
its `reason` user attribute, before the sweeper asks for new trials.

Only for SQLite storage, which serves one sweep process at a time (README): there a RUNNING
trial at start-up can only be a dead one. On a shared server (PostgreSQL) other workers'
trials are RUNNING while they work, so nothing is touched there; a dead worker's trial stays
RUNNING and `rookworld.sweeps.report` lists it as such.
"""

from __future__ import annotations

import optuna
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, flag_override

from .storage import open_storage

STALE_REASON = ("its process ended without reporting a result (killed or crashed hard); "
                "marked FAIL when the sweep was run again")


def fail_stale_trials(url: str, study_name: str) -> list[int]:
    """Mark every RUNNING trial of `study_name` in SQLite storage `url` FAIL; returns their
    numbers (nothing for other storage, or when the study does not exist yet)."""
    if not url.startswith("sqlite"):
        return []
    storage = open_storage(url)
    try:
        study_id = storage.get_study_id_from_name(study_name)
    except KeyError:
        return []
    failed = []
    try:
        for t in storage.get_all_trials(study_id, deepcopy=False,
                                        states=(optuna.trial.TrialState.RUNNING,)):
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, t.number)
            storage.set_trial_system_attr(trial_id, "fail_reason", STALE_REASON)
            storage.set_trial_user_attr(trial_id, "reason", STALE_REASON)
            if storage.set_trial_state_values(trial_id, optuna.trial.TrialState.FAIL):
                failed.append(t.number)
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


class ContinueSampling(Callback):
    """hydra.callbacks entry: a rerun of a sweep continues its study instead of repeating
    it. The sampler's seed is the configured one plus the trials the study already holds,
    so a rerun draws new start-up points (with a fixed seed, TPE's random start-up
    trials came out the same at every rerun) while the same command on the same study
    still proposes the same points."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        sweeper = config.hydra.sweeper
        url, name = sweeper.get("storage"), sweeper.get("study_name")
        sampler = sweeper.get("sampler") or {}
        if not url or not name or sampler.get("seed") is None:
            return
        done = trial_count(str(url), str(name))
        if done:
            with flag_override(sampler, ["readonly", "struct"], [False, False]):
                sampler.seed = int(sampler.seed) + done
            print(f"[rookworld] study {name} holds {done} trials: sampler seed "
                  f"{sampler.seed} for this run's new ones")
