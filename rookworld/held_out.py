"""Greedy evaluation on held-out samples, per task.

Metrics (means over the split): `eval/P/<part>` and `eval/A/<part>` for every
part of `rewards.parts` (P: format, legal, best_legal, top5, eval_error, best;
A: format, fen_exact, fen_similarity, reward, flags, exact), `eval/<task>/reward`
and `eval/reward` (the configured reward's mean score: the sweep objective).
Each mean comes with its standard error under `eval_se/...` (sample standard
deviation / sqrt(n)), so tables can print an interval beside every figure, and
`eval_n/<task>` gives the number of samples behind it. A later evaluation of the
same samples also carries `eval_dse/...`: the standard error of its change since a
baseline evaluation, from the per-sample differences (paired), which is narrower than
the difference of two independent means because most samples score the same twice.
With P settings of legal_moves=mask, the B: move is decoded only along the position's
legal moves (`legal_mask`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import replace

from . import backends
from .chess_tasks import Sample
from .legal_mask import legal_move_constraint
from .rewards.parts import env_parts, policy_parts
from .sampling import SamplingSettings

PARTS = {"P": policy_parts, "A": env_parts}


Z = 1.96  # the normal ~95% multiplier
# Student's t, 97.5% quantile, for 1 .. 30 degrees of freedom
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
        2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
        2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t95(n: int | None) -> float:
    """The ~95% multiplier of the standard error of a mean of n values: Student's t with
    n - 1 degrees of freedom (12.7 at n = 2, 2.78 at 5, 2.04 at 31), its first two terms
    of Fisher's expansion beyond 30 degrees, Z when n is unknown."""
    if n is None or n < 2:
        return Z
    df = n - 1
    if df <= len(T975):
        return T975[df - 1]
    return Z + (Z ** 3 + Z) / (4 * df) + (5 * Z ** 5 + 16 * Z ** 3 + 3 * Z) / (96 * df * df)


def mean_se(values: list[float]) -> tuple[float, float]:
    """(mean, standard error of the mean) of values; the error is 0 for fewer than 2."""
    n = len(values)
    mean = sum(values) / max(n, 1)
    if n < 2:
        return mean, 0.0
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def se_key(key: str) -> str:
    """The standard-error key of a metric: eval/P/best -> eval_se/P/best."""
    prefix, _, rest = key.partition("/")
    return f"{prefix}_se/{rest}"


def dse_key(key: str) -> str:
    """The paired change's standard-error key: eval/P/best -> eval_dse/P/best."""
    prefix, _, rest = key.partition("/")
    return f"{prefix}_dse/{rest}"


def n_key(key: str) -> str:
    """The sample-count key of a metric: eval/strength/acpl -> eval_n/strength/acpl."""
    prefix, _, rest = key.partition("/")
    return f"{prefix}_n/{rest}"


def paired_se(before: dict[str, list[float | None]],
              after: dict[str, list[float | None]]) -> dict:
    """{dse_key(k): standard error of the mean of after[k] - before[k]} for every key
    both hold over the same number of samples (per-sample values, as Evaluator fills);
    per-item lists that are not a metric's samples (`..._by_position`, with None for an
    item without a value) are left to their own pairing (`strength.common_changes`)."""
    return {dse_key(k): mean_se([b - a for a, b in zip(before[k], v)])[1]
            for k, v in after.items() if k in before and len(before[k]) == len(v)
            and not is_by_position(k)}


def is_by_position(key: str) -> bool:
    """A per-item list whose items may be null (an illegal answer: `acpl_by_position`),
    paired item by item (`strength.common_changes`), not as a metric's samples."""
    return key.removesuffix("_masked").endswith("_by_position")


def is_change(key: str) -> bool:
    """Whether a metric is itself a change between two evaluations (its name ends in
    `_change`, as strength's acpl_both_legal_change): it has no before or after value."""
    return key.rsplit("/", 1)[-1].removesuffix("_masked").endswith("_change")


def count(metrics: dict, key: str) -> int | None:
    """How many values metrics[key] is the mean of: its own eval_n key, else its task's
    (eval/P/best -> eval_n/P); None when neither is there."""
    n = metrics.get(n_key(key))
    if n is None:
        prefix, _, rest = key.partition("/")
        n = metrics.get(f"{prefix}_n/{rest.split('/')[0]}")
    return None if n is None else int(n)


def half_width(se: float | None, n: int | None, z: float | None = None) -> float | None:
    """z standard errors, by default `t95` of the count n (1.96 when it is unknown); None
    when no error is known or the mean is of fewer than 2 values."""
    if se is None or (n is not None and n < 2):
        return None
    return (t95(n) if z is None else z) * se


def interval(metrics: dict, key: str, z: float | None = None) -> float | None:
    """Half-width of the ~95% interval of metrics[key] (`half_width` of its error and
    count), if known."""
    return half_width(metrics.get(se_key(key)), count(metrics, key), z)


def with_interval(metrics: dict, key: str) -> str:
    """'0.250 ± 0.038' (the ~95% interval), or '0.250' when no error is known."""
    half = interval(metrics, key)
    return f"{metrics[key]:.3f}" + ("" if half is None else f" ± {half:.3f}")


def change_with_interval(first: dict, last: dict, key: str, z: float | None = None) -> str:
    """'+0.100 ± 0.034': last - first with its ~95% interval: paired (last's
    eval_dse, when last was measured against first's samples), else that of a
    difference of two independent means (sqrt of the summed squares), which is wider.
    A change metric (`is_change`) is last's own value with its own interval."""
    if is_change(key):
        half = interval(last, key, z)
        return f"{last[key]:+.3f}" + ("" if half is None else f" ± {half:.3f}")
    text = f"{last[key] - first[key]:+.3f}"
    if dse_key(key) in last:
        half = half_width(last[dse_key(key)], count(last, key), z)
        return text if half is None else text + f" ± {half:.3f}"
    a, b = interval(first, key, z), interval(last, key, z)
    return text if a is None or b is None else text + f" ± {math.hypot(a, b):.3f}"


INTERVAL_NOTE = ("± = ~95% interval (Student's t standard errors of the mean over the "
                 "held-out samples, 1.96 for hundreds; for a change, of the mean per-sample "
                 "difference, as both evaluations score the same samples)")


def before_after_table(first: dict, last: dict) -> str:
    """Markdown table of every eval/ metric: before, after, change, each with its interval
    (a change metric, `is_change`, fills the change column only; a metric that only one
    evaluation has, such as the centipawn loss where the start answered nothing legally,
    shows "-" on the other side and for the change)."""
    keys = sorted(k for k in {**first, **last} if k.startswith("eval/") and k != "eval/reward"
                  and not k.startswith("eval/time")) + ["eval/reward"]
    n = ", ".join(f"{t}: {last[f'eval_n/{t}']}" for t in "PA" if f"eval_n/{t}" in last)
    rows = [f"{INTERVAL_NOTE}; samples per task {n or 'unknown'}", "",
            "| metric | before | after | change |", "|---|---|---|---|"]
    for k in keys:
        if is_change(k):
            if k in last:
                rows.append(f"| {k} | | | {change_with_interval(first, last, k)} |")
        elif k in first and k in last:
            rows.append(f"| {k} | {with_interval(first, k)} | {with_interval(last, k)} "
                        f"| {change_with_interval(first, last, k)} |")
        else:
            before, after = (with_interval(m, k) if k in m else "-" for m in (first, last))
            rows.append(f"| {k} | {before} | {after} | - |")
    return "\n".join(rows)


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
        """Greedy completions for `task`'s samples (P with legal_moves=mask: the B: move
        only along legal moves); progress(n) after each batch of n."""
        out = []
        items, settings = self.samples.get(task, []), self.settings[task]
        masked = task == "P" and settings.legal_moves == "mask"
        for i in range(0, len(items), self.batch_size):
            chunk = items[i:i + self.batch_size]
            extra = {"constraint": legal_move_constraint(policy, [s.truth.fen for s in chunk])
                     } if masked else {}
            r = backends.of(policy).sample(policy.model, [policy.encode_prompt(s.prompt)
                                                          for s in chunk],
                                           settings, policy.eos_id, **extra)
            out += policy.decode_completions(r.completion_ids, r.completion_mask)
            if progress is not None:
                progress(len(chunk))
        return out

    def __call__(self, policy, reward, keep_examples: int = 0, progress=None,
                 per_sample: dict | None = None) -> tuple[dict, list[dict]]:
        """-> (metrics, examples): examples are the first `keep_examples` per task as
        dicts {task, prompt, completion, reference, reward}; progress as in completions;
        per_sample, when given, is filled with each metric's per-sample values."""
        metrics, examples, scores_all = {}, [], []
        for task, items in self.samples.items():
            texts = self.completions(policy, task, progress)
            values, scores = defaultdict(list), []
            for s, text in zip(items, texts):
                for k, v in PARTS[task](s.truth, text).items():
                    values[k].append(v)
                scores.append(reward(s, text).score)
            values["reward"] = scores
            for k, v in values.items():
                key = f"{self.prefix}/{task}/{k}"
                metrics[key], metrics[se_key(key)] = mean_se(v)
                if per_sample is not None:
                    per_sample[key] = v
            metrics[f"{self.prefix}_n/{task}"] = len(items)
            scores_all += scores
            examples += [{"task": task, "prompt": s.prompt, "completion": t,
                          "reference": s.completion, "reward": sc}
                         for s, t, sc in list(zip(items, texts, scores))[:keep_examples]]
        key = f"{self.prefix}/reward"
        metrics[key], metrics[se_key(key)] = mean_se(scores_all)
        metrics[n_key(key)] = len(scores_all)  # both tasks: its interval's t needs the count
        if per_sample is not None:
            per_sample[key] = scores_all
        return metrics, examples
