"""A supervised anchor for GRPO updates (PPO-ptx, InstructGPT, arXiv 2203.02155).

Each update adds coef x the cross-entropy of ground-truth training completions, so a
skill the step's reward does not train (the A task in a P-only run) is held while the
shared weights move. The samples drawn are a pure function of (seed, step): a resumed run
draws what an uninterrupted one would have.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch

from .chess_tasks import Sample
from .sft import encode, lm_loss, make_batch


class Anchor:
    """coef: weight of the cross-entropy in the update's loss (0 = off); samples: training
    samples per step; tasks: the tasks whose training samples it draws."""

    def __init__(self, coef: float = 0.0, samples: int = 8, tasks: Sequence[str] = ("A",)):
        if coef < 0:
            raise ValueError(f"anchor.coef={coef} must be >= 0")
        if coef > 0 and samples < 1:
            raise ValueError(f"anchor.samples={samples} must be >= 1 when anchor.coef > 0")
        bad = sorted(set(tasks) - {"P", "A"})
        if bad or (coef > 0 and not tasks):
            raise ValueError(f"anchor.tasks={list(tasks)} must name P and/or A")
        self.coef, self.samples, self.tasks = float(coef), int(samples), tuple(tasks)

    @property
    def active(self) -> bool:
        return self.coef > 0

    def draw(self, pools: dict[str, Sequence[Sample]], step: int, seed: int) -> list[Sample]:
        rng = random.Random(seed * 1_000_003 + step + 7_919)  # not the task mix's stream
        out = []
        for _ in range(self.samples):  # uniform over the tasks' samples together, no copy
            i = rng.randrange(sum(len(pools[t]) for t in self.tasks))
            for t in self.tasks:
                if i < len(pools[t]):
                    out.append(pools[t][i])
                    break
                i -= len(pools[t])
        return out

    def loss(self, policy, samples: list[Sample], device) -> torch.Tensor:
        """Mean cross-entropy per completion token (prompt and padding not counted)."""
        ids, labels = make_batch(encode(policy, samples), policy.eos_id)
        return lm_loss(policy.model, ids.to(device), labels.to(device))
