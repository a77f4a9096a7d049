"""The Optuna sweeper, ending a study that holds no completed trial with a message.

The Optuna plugin asks the study for its best trial once its trials have run; where none has
completed (every one failed, or the rest still run in other workers) Optuna raises
`ValueError: Record does not exist` with a traceback. The study and each trial's reason are
intact, so the sweep says so, names the report command and exits 1. Hydra finds this class
through the `hydra.plugins` entry point in pyproject.toml.
"""

from collections import Counter

import optuna
from hydra_plugins.hydra_optuna_sweeper.optuna_sweeper import OptunaSweeper

_STATE_WORDS = {"COMPLETE": "complete", "FAIL": "failed", "RUNNING": "running",
                "WAITING": "waiting", "PRUNED": "pruned"}


class RookworldOptunaSweeper(OptunaSweeper):
    """hydra-optuna-sweeper's OptunaSweeper, with a message for a study without a result."""

    def sweep(self, arguments: list[str]) -> None:
        try:
            return super().sweep(arguments)
        except ValueError:
            impl = self.sweeper
            message = no_completed_trial_message(impl.study_name, impl.storage, impl.sweep_dir)
            if message is None:
                raise
            raise SystemExit(message) from None


def no_completed_trial_message(study_name: str, storage, sweep_dir: str) -> str | None:
    """What to tell a user whose study has no completed trial; None where one has completed."""
    trials = optuna.load_study(study_name=study_name, storage=storage).get_trials(deepcopy=False)
    states = Counter(_STATE_WORDS.get(t.state.name, t.state.name.lower()) for t in trials)
    if states["complete"]:
        return None
    held = ", ".join(f"{n} {s}" for s, n in sorted(states.items())) or "no trials"
    return (f"no trial of study '{study_name}' has completed ({held}), so it has no best "
            f"trial yet; each trial's reason: python -m rookworld.sweeps.report {sweep_dir}")
