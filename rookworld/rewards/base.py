"""What every reward returns and the interface the training engine calls.

A reward is a pure, deterministic function of (sample, completion): the
sample carries the task ("P" or "A") and its typed ground truth; the
completion is the decoded text the model wrote after the prompt. It never
sees the model, the tokenizer or the step; anything that changes with the
step is a schedule returned by `at(step)` (see curriculum.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rookworld.chess_tasks import EnvTruth, PolicyTruth, Sample

from .parts import env_parts, policy_parts


@dataclass(frozen=True)
class Scored:
    """score: finite, inside the reward's `range`; parts: named measurements
    for logging (`reward/<task>/<name>`), the same keys for every call of a task."""

    score: float
    parts: dict[str, float]

    def __post_init__(self):
        if not math.isfinite(self.score):
            raise ValueError(f"reward score must be finite, got {self.score!r}")


class Reward:
    """Base class. Subclasses implement `policy` (P) and `env` (A) and set
    `range = (min, max)`, the documented bounds of every score they return.

    `__call__` never raises on any completion string; it raises ValueError
    only for a sample whose task is neither "P" nor "A" (a data bug).
    """

    range: tuple[float, float] = (0.0, 0.0)

    def __call__(self, sample: Sample, completion: str) -> Scored:
        if sample.task == "P":
            return self.policy(sample.truth, completion)
        if sample.task == "A":
            return self.env(sample.truth, completion)
        raise ValueError(f"unknown task {sample.task!r}; expected 'P' or 'A'")

    def policy(self, truth: PolicyTruth, completion: str) -> Scored:
        raise NotImplementedError

    def env(self, truth: EnvTruth, completion: str) -> Scored:
        raise NotImplementedError

    def at(self, step: int) -> Reward:
        """The reward to use at training step `step`; fixed rewards return self."""
        return self

    def close(self) -> None:
        """Ends what the reward holds (EngineReward: its engine processes); idempotent.
        Whoever instantiates a reward closes it; those returned by `at` share its
        resources and are not closed."""


class PartsReward(Reward):
    """A reward that is a function of the measured parts alone (parts.py):
    subclasses implement `policy_score(parts)` and `env_score(parts)`, which
    are exposed so their monotonicity can be tested on parts directly."""

    def policy(self, truth: PolicyTruth, completion: str) -> Scored:
        parts = policy_parts(truth, completion)
        return Scored(self.policy_score(parts), parts)

    def env(self, truth: EnvTruth, completion: str) -> Scored:
        parts = env_parts(truth, completion)
        return Scored(self.env_score(parts), parts)

    def policy_score(self, parts: dict[str, float]) -> float:
        raise NotImplementedError

    def env_score(self, parts: dict[str, float]) -> float:
        raise NotImplementedError
