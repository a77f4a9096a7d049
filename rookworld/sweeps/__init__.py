"""Optuna sweeps: what each trial records (`trial`), where studies live (`storage`),
the study summary (`report`: `python -m rookworld.sweeps.report multirun/<study>`) and the
Optuna sweeper the searches run under (`sweeper`).

Importing the package registers the `${study_storage:...}` config resolver that
conf/hparams_search/*.yaml use for their default storage.
"""

from . import storage  # noqa: F401  (registers the study_storage resolver)
