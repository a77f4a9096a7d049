"""Which of a step's drawn prompts it trains on: all of them, or those the policy answers worst.

`HardestGreedy` draws `oversample` times the step's prompts from the task mix, decodes
each once greedily with the current policy, as the held-out evaluation decodes, scores the
answers with the run's reward and keeps the prompts whose greedy answer scores lowest
(online difficulty filtering; DAPO's dynamic sampling, arXiv 2503.14476, drops groups
that carry no signal after sampling them, this ranks prompts before sampling). The
held-out metric is the greedy answer, so the step's groups sit where it is wrong. The
cost is one greedy answer per drawn prompt (G sampled ones per kept prompt); the kept
prompts are sampled as any others, rollout tape included. Selection is a pure function of
(seed, step, policy): a resumed run selects what an uninterrupted one would.
"""

from __future__ import annotations

import math
import time

from .chess_tasks import Sample
from .held_out import Evaluator


class HardestGreedy:
    """oversample: prompts drawn per step / prompts trained on (>= 1; 1 = off: every drawn
    prompt is trained on and nothing is decoded)."""

    def __init__(self, oversample: float = 1.0):
        if not oversample >= 1.0:
            raise ValueError(f"prompt_filter.oversample={oversample} must be >= 1")
        self.oversample = float(oversample)

    @property
    def active(self) -> bool:
        return self.oversample > 1.0

    def drawn(self, n: int) -> int:
        """Prompts to draw for a step that trains on n."""
        return math.ceil(n * self.oversample)

    def select(self, engine, samples: list[Sample], n: int, step: int
               ) -> tuple[list[Sample], dict]:
        """-> (the n samples whose greedy answers score lowest, in draw order; metrics).
        Ties keep the earlier draw. Under torchrun each rank decodes every world-th drawn
        prompt and every rank ranks all the scores alike."""
        if not self.active or len(samples) <= n:
            return samples, {}
        t0 = time.perf_counter()
        dist = engine.dist
        mine = range(dist.rank, len(samples), dist.world) if dist else range(len(samples))
        pairs = list(zip(mine, greedy_scores(engine, [samples[i] for i in mine], step)))
        if dist:
            pairs = dist.all_gather_list(pairs)
        scores = [score for _, score in sorted(pairs)]
        keep = sorted(sorted(range(len(samples)), key=lambda i: (scores[i], i))[:n])
        return [samples[i] for i in keep], {
            "filter/greedy_reward_drawn": sum(scores) / len(scores),
            "filter/greedy_reward_kept": sum(scores[i] for i in keep) / n,
            "time/filter_s": time.perf_counter() - t0}


def greedy_scores(engine, samples: list[Sample], step: int) -> list[float]:
    """The run's reward of the policy's greedy answer to each sample, decoded as the
    held-out evaluation decodes (`Evaluator.completions`, one batch per task)."""
    reward, greedy = engine.reward.at(step), Evaluator(samples, engine.sampling,
                                                       batch_size=len(samples))
    out: list[float] = [0.0] * len(samples)
    for task in greedy.samples:
        idx = [i for i, s in enumerate(samples) if s.task == task]
        for i, text in zip(idx, greedy.completions(engine.policy, task)):
            out[i] = reward(samples[i], text).score
    return out
