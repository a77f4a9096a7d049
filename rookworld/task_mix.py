"""Which prompts a step trains on: P only, A only, mixed with a ratio, or phased.

A draw is a pure function of (seed, step): resuming at step k draws exactly
what an uninterrupted run would have drawn, with no data-position state.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from .chess_tasks import Sample


def _rng(seed: int, step: int) -> random.Random:
    return random.Random(seed * 1_000_003 + step)


class Mixed:
    """Each prompt is a P prompt with probability `p_share`, else an A prompt."""

    def __init__(self, p_share: float = 0.5):
        if not 0.0 <= p_share <= 1.0:
            raise ValueError(f"task_mix.p_share must be in [0, 1], got {p_share}")
        self.p_share = p_share

    def tasks(self, step: int) -> tuple[str, ...]:
        return tuple(t for t, share in (("P", self.p_share), ("A", 1 - self.p_share)) if share > 0)

    def task_of(self, step: int, rng: random.Random) -> str:
        return "P" if rng.random() < self.p_share else "A"

    def draw(self, pools: dict[str, Sequence[Sample]], n: int, step: int,
             seed: int) -> list[Sample]:
        rng = _rng(seed, step)
        return [rng.choice(pools[self.task_of(step, rng)]) for _ in range(n)]


class Phased(Mixed):
    """Phases of fixed length, e.g. [{task: P, steps: 20}, {task: A, steps: 20}];
    cycle: repeat the phases (alternating) or stay in the last one."""

    def __init__(self, phases: list[dict], cycle: bool = False):
        if not phases:
            raise ValueError("task_mix.phases must list at least one phase")
        for i, ph in enumerate(phases):
            if ph.get("task") not in ("P", "A") or int(ph.get("steps", 0)) < 1:
                raise ValueError(f"task_mix.phases[{i}] needs task: P|A and steps >= 1, got {ph}")
        self.phases = [(str(ph["task"]), int(ph["steps"])) for ph in phases]
        self.cycle = cycle

    def phase_task(self, step: int) -> str:
        total = sum(s for _, s in self.phases)
        if self.cycle:
            step %= total
        for task, steps in self.phases:
            if step < steps:
                return task
            step -= steps
        return self.phases[-1][0]

    def tasks(self, step: int) -> tuple[str, ...]:
        return (self.phase_task(step),)

    def task_of(self, step: int, rng: random.Random) -> str:
        return self.phase_task(step)

    def schedule(self, steps: int) -> list[str]:
        """The task of every step, for dry runs and reports."""
        return [self.phase_task(s) for s in range(steps)]


class FixedBatch(Mixed):
    """The same prompts every step (the draw of step 0): the overfit-one-batch sanity
    check. A GRPO engine that works drives the greedy reward on this batch up."""

    def draw(self, pools: dict[str, Sequence[Sample]], n: int, step: int,
             seed: int) -> list[Sample]:
        return super().draw(pools, n, 0, seed)
