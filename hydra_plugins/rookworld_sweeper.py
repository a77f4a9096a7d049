"""rookworld's Optuna sweeper: hydra-optuna-sweeper's, ending a study that holds no
completed trial with a message instead of a traceback.

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
