"""Run outcomes and the guards that decide them.

Outcomes: `success`, `kl_failure` (the chosen estimator's mean KL over the last
`window` steps above `threshold`), `nan_failure` (more than `max_consecutive`
non-finite updates in a row; each one is skipped and the learning rate backed
off), `error` (an exception, recorded with its message). Nothing is inferred
from a crash: the training loop records the outcome it stopped with.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from .grpo import KL_DIRECTIONS, KL_ESTIMATORS

OUTCOMES = ("success", "kl_failure", "nan_failure", "error")


@dataclass
class Outcome:
    status: str
    step: int
    reason: str = ""

    def __post_init__(self):
        if self.status not in OUTCOMES:
            raise ValueError(f"unknown outcome {self.status!r}")


# the KL metrics a run logs: each per-token estimator and each full_<direction>
GUARD_ESTIMATORS = (*KL_ESTIMATORS, *(f"full_{d}" for d in KL_DIRECTIONS))


class KLGuard:
    """Trips when mean(kl/<estimator>) over the last `window` steps exceeds `threshold`.

    estimator: k1, k2, k3 (per-token, completion tokens only, measured every step) or
    full_forward, full_reverse, full_symmetric (logged when the penalty is a full_* one);
    threshold: nats per token; window: steps averaged (1 = any single step).
    """

    def __init__(self, estimator: str = "k3", threshold: float = 1.0, window: int = 5):
        if estimator not in GUARD_ESTIMATORS:
            raise ValueError(f"guard.kl.estimator must be one of {', '.join(GUARD_ESTIMATORS)}, "
                             f"got {estimator!r}")
        if not threshold > 0:
            raise ValueError(f"guard.kl.threshold must be > 0, got {threshold}")
        if window < 1:
            raise ValueError(f"guard.kl.window must be >= 1, got {window}")
        self.estimator, self.threshold, self.window = estimator, threshold, window
        self.history: deque[float] = deque(maxlen=window)

    @property
    def metric(self) -> str:
        return f"kl/{self.estimator}"

    def check(self, metrics: dict) -> str | None:
        """Record this step's KL; return a reason string when the guard trips."""
        self.history.append(float(metrics[self.metric]))
        mean = sum(self.history) / len(self.history)
        if len(self.history) == self.window and (mean > self.threshold or math.isnan(mean)):
            return (f"mean {self.metric} over the last {self.window} steps = {mean:.4g} "
                    f"> guard.kl.threshold = {self.threshold}")
        return None

    def state_dict(self) -> dict:
        return {"history": list(self.history)}

    def load_state_dict(self, d: dict) -> None:
        self.history = deque(d["history"], maxlen=self.window)


class NaNGuard:
    """Counts consecutive skipped (non-finite) updates; trips above max_consecutive.
    lr_backoff: factor applied to the learning rate after each skipped update."""

    def __init__(self, max_consecutive: int = 3, lr_backoff: float = 0.5):
        if max_consecutive < 0:
            raise ValueError(f"guard.nan.max_consecutive must be >= 0, got {max_consecutive}")
        if not 0 < lr_backoff <= 1:
            raise ValueError(f"guard.nan.lr_backoff must be in (0, 1], got {lr_backoff}")
        self.max_consecutive, self.lr_backoff = max_consecutive, lr_backoff
        self.consecutive = 0

    def check(self, metrics: dict) -> str | None:
        if metrics.get("optim/empty_batch"):  # no update was tried: the count stands
            return None
        skipped = bool(metrics.get("guard/nan_skipped", 0))
        self.consecutive = self.consecutive + 1 if skipped else 0
        if self.consecutive > self.max_consecutive:
            return f"{self.consecutive} non-finite updates in a row > guard.nan.max_consecutive"
        return None

    def state_dict(self) -> dict:
        return {"consecutive": self.consecutive}

    def load_state_dict(self, d: dict) -> None:
        self.consecutive = int(d["consecutive"])
