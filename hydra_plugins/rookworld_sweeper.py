"""rookworld's Optuna sweeper: hydra-optuna-sweeper's, ending a study that holds no
completed trial with a message instead of a traceback, and failing only the trials of a
batch whose launch raised (`BatchFailures`) instead of ending the sweep.

The Optuna plugin asks the study for its best trial once its trials have run; where none has
completed (every one failed, or the rest still run in other workers) Optuna raises
`ValueError: Record does not exist`. The study and each trial's reason are intact, so the
sweep says so, names the report command and exits 1. Hydra loads this module in every app
of the environment (the `hydra.plugins` entry point in pyproject.toml), so it imports
nothing of rookworld and Optuna only when a sweep ends that way.
"""

from collections import Counter

from hydra_plugins.hydra_optuna_sweeper.optuna_sweeper import OptunaSweeper

_STATE_WORDS = {"COMPLETE": "complete", "FAIL": "failed", "RUNNING": "running",
                "WAITING": "waiting", "PRUNED": "pruned"}


class RookworldOptunaSweeper(OptunaSweeper):
    """hydra-optuna-sweeper's OptunaSweeper, with a message for a study without a result."""

    def sweep(self, arguments: list[str]) -> None:
        impl = self.sweeper
        launcher = getattr(impl, "launcher", None)  # set by setup()
        if launcher is not None and not isinstance(launcher, BatchFailures):
            impl.launcher = BatchFailures(launcher, impl)
        try:
            return super().sweep(arguments)
        except ValueError as e:
            if "Record does not exist" not in str(e):  # another error: itself
                raise
            impl = self.sweeper
            try:
                message = no_completed_trial_message(impl.study_name, impl.storage,
                                                     impl.sweep_dir)
            except Exception:  # the study cannot be read back: Optuna's own error stands
                raise e from None
            if message is None:
                raise
            raise SystemExit(message) from None


# What fails one batch only, by class name (no launcher's package imported): a searched value
# Hydra cannot compose, a joblib worker killed, a submitit job that ended without a result.
BATCH_ERRORS = {"MissingConfigException", "ConfigCompositionException",
                "TerminatedWorkerError", "BrokenProcessPool", "UncompletedJobError"}


class BatchFailures:
    """The sweeper's launcher, with a launch that raises (a searched config-group value Hydra
    cannot compose, a joblib worker killed) failing only that batch's trials, each with the
    error as its reason, where the plugin would end the whole sweep and leave them RUNNING;
    a trial whose job finished and recorded its objective before the error keeps it."""

    def __init__(self, launcher, impl):
        self.launcher, self.impl = launcher, impl

    def __getattr__(self, name):
        return getattr(self.launcher, name)

    def launch(self, job_overrides, initial_job_idx):
        try:
            return self.launcher.launch(job_overrides, initial_job_idx)
        except Exception as e:
            if not any(c.__name__ in BATCH_ERRORS for c in type(e).__mro__):
                raise  # a launcher that cannot work at all (its setup, a bug) ends the sweep
            return self.failed_batch(list(job_overrides), e)

    def failed_batch(self, job_overrides: list, error: Exception) -> list:
        from hydra.core.utils import JobReturn, JobStatus

        first = (str(error).strip().splitlines() or [""])[0]  # Hydra's add the search path
        reason = f"its batch could not be launched: {type(error).__name__}: {first}"[:1000]
        numbers = [trial_number(o) for o in job_overrides]
        try:
            from rookworld.sweeps.callbacks import settle_unlaunched
            known = settle_unlaunched(self.impl.storage, self.impl.study_name,
                                      [n for n in numbers if n is not None], reason)
        except Exception:  # noqa: BLE001 - the study cannot be read: every trial fails
            known = {}
        print(f"[rookworld] {reason}; its trials are recorded FAIL, the sweep goes on",
              flush=True)
        returns = []
        for overrides, number in zip(job_overrides, numbers):
            value = known.get(number)
            returns.append(
                JobReturn(overrides=list(overrides), status=JobStatus.COMPLETED,
                          _return_value=value) if value is not None else
                JobReturn(overrides=list(overrides), status=JobStatus.FAILED,
                          _return_value=RuntimeError(reason)))
        return returns


def trial_number(overrides) -> int | None:
    """The Optuna trial number a job's overrides carry (`sweep.trial=N`), if any."""
    for o in overrides:
        key, _, value = str(o).partition("=")
        if key.lstrip("+") == "sweep.trial":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def no_completed_trial_message(study_name: str, storage, sweep_dir: str) -> str | None:
    """What to tell a user whose study has no completed trial; None where one has completed."""
    import optuna

    trials = optuna.load_study(study_name=study_name, storage=storage).get_trials(deepcopy=False)
    states = Counter(_STATE_WORDS.get(t.state.name, t.state.name.lower()) for t in trials)
    if states["complete"]:
        return None
    held = ", ".join(f"{n} {s}" for s, n in sorted(states.items())) or "no trials"
    return (f"no trial of study '{study_name}' has completed ({held}), so it has no best "
            f"trial yet; each trial's reason: python -m rookworld.sweeps.report {sweep_dir}")
