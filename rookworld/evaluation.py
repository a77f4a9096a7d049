"""Greedy evaluation on held-out samples, per task.

Metrics (means over the split): `eval/P/<part>` and `eval/A/<part>` for every
part of `rewards.parts` (P: format, legal, best_legal, top5, eval_error, best;
A: format, fen_exact, fen_similarity, reward, flags, exact), `eval/<task>/reward`
and `eval/reward` (the configured reward's mean score: the sweep objective).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from .chess_tasks import Sample
from .rewards.parts import env_parts, policy_parts
from .sampling import SamplingSettings, sample

PARTS = {"P": policy_parts, "A": env_parts}


class Evaluator:
    """samples: the held-out split; settings: per-task sampling settings (made greedy
    here); batch_size: prompts decoded at once; max_per_task: cap per task (0 = all);
    prefix: metric namespace (`eval`, or `train_batch` for the overfit check)."""

    def __init__(self, samples: list[Sample], settings: dict[str, SamplingSettings],
                 batch_size: int = 64, max_per_task: int = 0, prefix: str = "eval"):
        self.prefix = prefix
        by_task = defaultdict(list)
        for s in samples:
            by_task[s.task].append(s)
        self.samples = {t: (v[:max_per_task] if max_per_task else v) for t, v in by_task.items()}
        self.settings = {t: replace(s, temperature=0.0, top_k=0, top_p=1.0)
                         for t, s in settings.items()}
        self.batch_size = batch_size

    def __len__(self) -> int:
        """Prompts decoded by one evaluation (all tasks): the progress bar's total."""
        return sum(len(v) for v in self.samples.values())

    def completions(self, policy, task: str, progress=None) -> list[str]:
        """Greedy completions for `task`'s samples; progress(n) after each batch of n."""
        out = []
        items = self.samples.get(task, [])
        for i in range(0, len(items), self.batch_size):
            chunk = items[i:i + self.batch_size]
            r = sample(policy.model, [policy.encode_prompt(s.prompt) for s in chunk],
                       self.settings[task], policy.eos_id)
            out += policy.decode_completions(r.completion_ids, r.completion_mask)
            if progress is not None:
                progress(len(chunk))
        return out

    def __call__(self, policy, reward, keep_examples: int = 0,
                 progress=None) -> tuple[dict, list[dict]]:
        """-> (metrics, examples): examples are the first `keep_examples` per task as
        dicts {task, prompt, completion, reference, reward}; progress as in completions."""
        metrics, examples, scores_all = {}, [], []
        for task, items in self.samples.items():
            texts = self.completions(policy, task, progress)
            sums, scores = defaultdict(float), []
            for s, text in zip(items, texts):
                for k, v in PARTS[task](s.truth, text).items():
                    sums[k] += v
                scores.append(reward(s, text).score)
            for k, v in sums.items():
                metrics[f"{self.prefix}/{task}/{k}"] = v / len(items)
            metrics[f"{self.prefix}/{task}/reward"] = sum(scores) / len(scores)
            scores_all += scores
            examples += [{"task": task, "prompt": s.prompt, "completion": t,
                          "reference": s.completion, "reward": sc}
                         for s, t, sc in list(zip(items, texts, scores))[:keep_examples]]
        metrics[f"{self.prefix}/reward"] = sum(scores_all) / max(len(scores_all), 1)
        return metrics, examples
