"""reward=graduated_curriculum: a reward that moves from lenient to strict.

The step enters only through `at(step)`, which returns a fixed, pure reward;
the training engine calls `reward.at(step)(sample, completion)`.
"""

from __future__ import annotations

from rookworld.chess_tasks import EnvTruth, PolicyTruth

from .base import Reward, Scored


class BlendReward(Reward):
    """score = (1 - weight) * start + weight * end; parts: both rewards' parts
    (end's value where a name is shared; the measured parts agree anyway)."""

    def __init__(self, start: Reward, end: Reward, weight: float):
        if not 0.0 <= weight <= 1.0:
            raise ValueError(f"blend weight {weight} must lie in [0, 1]")
        self.start, self.end, self.weight = start, end, float(weight)
        self.range = (min(start.range[0], end.range[0]), max(start.range[1], end.range[1]))

    def policy(self, truth: PolicyTruth, completion: str) -> Scored:
        return self._blend(self.start.policy(truth, completion), self.end.policy(truth, completion))

    def env(self, truth: EnvTruth, completion: str) -> Scored:
        return self._blend(self.start.env(truth, completion), self.end.env(truth, completion))

    def close(self) -> None:
        try:
            self.start.close()
        finally:
            self.end.close()

    def _blend(self, a: Scored, b: Scored) -> Scored:
        if self.weight == 0.0:
            score = a.score
        elif self.weight == 1.0:
            score = b.score
        else:
            score = (1.0 - self.weight) * a.score + self.weight * b.score
        return Scored(score, {**a.parts, **b.parts})


class CurriculumReward(Reward):
    """`start` until step `warmup`, then a linear blend reaching `end` after
    `steps` more steps: at(step) = BlendReward(start, end, w) with
    w = clamp((step - warmup) / steps, 0, 1). Both rewards are scored at every
    step so the logged parts keep the same keys. Called directly (without
    `at`) it scores as at step 0.

    >>> from .binary import BinaryReward
    >>> from .graduated import GraduatedReward
    >>> CurriculumReward(GraduatedReward(), BinaryReward(), steps=100, warmup=10).weight(60)
    0.5
    """

    def __init__(self, start: Reward, end: Reward, steps: int, warmup: int = 0):
        if steps < 1:
            raise ValueError(f"reward.steps={steps} must be >= 1 (steps from start to end)")
        if warmup < 0:
            raise ValueError(f"reward.warmup={warmup} must be >= 0")
        self.start, self.end = start, end
        self.steps, self.warmup = int(steps), int(warmup)
        self.range = BlendReward(start, end, 0.0).range

    def close(self) -> None:
        try:
            self.start.close()
        finally:
            self.end.close()

    def weight(self, step: int) -> float:
        return min(max((step - self.warmup) / self.steps, 0.0), 1.0)

    def at(self, step: int) -> Reward:
        return BlendReward(self.start.at(step), self.end.at(step), self.weight(step))

    def policy(self, truth: PolicyTruth, completion: str) -> Scored:
        return self.at(0).policy(truth, completion)

    def env(self, truth: EnvTruth, completion: str) -> Scored:
        return self.at(0).env(truth, completion)
