"""Optuna sweeps: what each trial records (`trial`), where studies live (`storage`),
and the study summary (`report`: `python -m rookworld.sweeps.report multirun/<study>`). The
Optuna sweeper the searches run under is hydra_plugins/rookworld_sweeper.py (Hydra loads
it in every app, so it lives outside this package).

Importing the package registers the `${study_storage:...}` config resolver that
conf/hparams_search/*.yaml use for their default storage.
"""

from . import storage  # noqa: F401  (registers the study_storage resolver)
