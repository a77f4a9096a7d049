"""Advantages with running statistics: EMA reward normalisation, EMA and adaptive
baselines, and a reward warm-up (`advantage=...` in conf/advantage/). The group-only
advantages of GRPO, DAPO, Dr. GRPO and GSPO are `grpo.GroupAdvantage`.

Statistics are kept per task (P and A rewards live on different scales) or over the
batch, as exponential moving averages, and travel in checkpoints (`state_dict`), so a
resumed run computes the same advantages as an uninterrupted one.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .grpo import normalise_groups, relative_advantages

NORMALIZE = ("none", "ema")
BASELINES = ("group", "batch", "ema", "adaptive")
SCALES = ("group", "batch", "running", "none")


class RunningStats:
    """EMA of the mean and variance of values per key: after a batch x of a key,
    mean <- m mean + (1 - m) mean(x), var <- m var + (1 - m) (var(x) + (mean(x) - mean_old)^2)
    (the batch's spread around the old mean). The first batch of a key sets both."""

    def __init__(self, momentum: float):
        self.momentum = momentum
        self.mean: dict[str, float] = {}
        self.var: dict[str, float] = {}

    def update(self, key: str, x: Tensor) -> None:
        mean, var = float(x.mean()), float(x.var(unbiased=False))
        if key not in self.mean:
            self.mean[key], self.var[key] = mean, var
            return
        m, old = self.momentum, self.mean[key]
        self.mean[key] = m * old + (1 - m) * mean
        self.var[key] = m * self.var[key] + (1 - m) * (var + (mean - old) ** 2)

    def std(self, key: str) -> float:
        return math.sqrt(self.var[key])

    def state_dict(self) -> dict:
        return {"mean": dict(self.mean), "var": dict(self.var)}

    def load_state_dict(self, d: dict) -> None:
        self.mean, self.var = dict(d["mean"]), dict(d["var"])


class RunningAdvantage:
    """rewards [N] (groups of G contiguous rows), tasks [N], step -> advantages [N].

    1. normalize "ema": each reward becomes (r - mean) / max(std, std_floor) with the
       running mean and std of its key, updated with this batch first (so the first
       batch is normalised by its own statistics, never by an empty state).
    2. baseline, subtracted from the (normalised) reward:
         group     the group's mean (GRPO);
         batch     the batch's mean;
         ema       the running mean of its key before this batch (the first batch: the
                   batch mean of its key), so a group whose rewards all tie still moves
                   when it is above or below what the task usually gets;
         adaptive  w * group mean + (1 - w) * ema mean, w = var_g / (var_g + var_ema):
                   a group whose rewards vary (it says something about its prompt) keeps
                   its own mean; a near-uniform group (whose own mean would cancel every
                   advantage) falls back to the running mean.
    3. scale: divide by the group's std ("group", GRPO; only with the group baseline,
       where a tied group has advantages of 0 anyway, and not after normalize "ema",
       whose shift and scale it would cancel exactly), the batch's std, the running std
       of the key including this batch ("running"), or nothing; each floored at min_std.
    4. clip |advantage| at clip (when set), then multiply by the warm-up factor
       warmup_start + (1 - warmup_start) * min(step / warmup_steps, 1) (1 when
       warmup_steps is 0): the reward's pull grows from warmup_start to full, as the KL
       warm-up does for beta.
    per_task: statistics per task ("P", "A"); false = one set over the batch.
    """

    def __init__(self, normalize: str = "none", baseline: str = "group", scale: str = "group",
                 min_std: float = 1e-4, clip: float | None = None, momentum: float = 0.99,
                 std_floor: float = 1e-2, per_task: bool = True, warmup_steps: int = 0,
                 warmup_start: float = 0.0):
        for name, value, allowed in (("normalize", normalize, NORMALIZE),
                                     ("baseline", baseline, BASELINES),
                                     ("scale", scale, SCALES)):
            if value not in allowed:
                raise ValueError(f"algorithm.advantage.{name} must be one of {allowed}, "
                                 f"got {value!r}")
        if scale == "group" and baseline != "group":
            raise ValueError(f"algorithm.advantage.scale=group divides a tied group by ~0; "
                             f"with baseline={baseline} use scale running, batch or none")
        if normalize == "ema" and scale == "group":
            raise ValueError("algorithm.advantage.normalize=ema with scale=group gives GRPO's "
                             "group advantages unchanged (the group's mean and std absorb the "
                             "running ones); use scale none, running or batch")
        if not 0 <= momentum < 1:
            raise ValueError(f"algorithm.advantage.momentum must be in [0, 1), got {momentum}")
        if not (min_std > 0 and std_floor > 0):
            raise ValueError("algorithm.advantage.min_std and std_floor must be > 0")
        if clip is not None and not clip > 0:
            raise ValueError(f"algorithm.advantage.clip must be > 0 or null, got {clip}")
        if warmup_steps < 0 or not 0 <= warmup_start <= 1:
            raise ValueError("algorithm.advantage.warmup_steps must be >= 0 and warmup_start "
                             f"in [0, 1], got {warmup_steps}, {warmup_start}")
        self.normalize, self.baseline, self.scale = normalize, baseline, scale
        self.min_std, self.clip, self.std_floor = float(min_std), clip, float(std_floor)
        self.per_task, self.warmup_steps, self.warmup_start = per_task, warmup_steps, warmup_start
        self.norm_stats = RunningStats(momentum)
        self.base_stats = RunningStats(momentum)
        self.last: dict[str, float] = {}

    def warmup(self, step: int) -> float:
        if not self.warmup_steps:
            return 1.0
        return self.warmup_start + (1 - self.warmup_start) * min(step / self.warmup_steps, 1.0)

    def __call__(self, rewards: Tensor, group_size: int, tasks: list[str] | None = None,
                 step: int = 0) -> Tensor:
        x = rewards.double().clone()
        n = len(x)
        keys = [t if self.per_task else "all" for t in (tasks or ["all"] * n)]
        groups = {k: torch.tensor([i for i, kk in enumerate(keys) if kk == k]) for k in
                  dict.fromkeys(keys)}
        self.last = {}
        if self.normalize == "ema":
            for k, idx in groups.items():
                self.norm_stats.update(k, x[idx])
                x[idx] = (x[idx] - self.norm_stats.mean[k]) / max(self.norm_stats.std(k),
                                                                   self.std_floor)
                self.last[f"adv/ema_mean/{k}"] = self.norm_stats.mean[k]
                self.last[f"adv/ema_std/{k}"] = self.norm_stats.std(k)
        g = x.reshape(-1, group_size)
        group_mean = g.mean(1, keepdim=True).expand_as(g).reshape(-1)
        if self.baseline == "group":
            base = group_mean
        elif self.baseline == "batch":
            base = x.mean().expand(n)
        else:
            ema_mean, ema_var = torch.empty(n, dtype=x.dtype), torch.empty(n, dtype=x.dtype)
            for k, idx in groups.items():
                if k not in self.base_stats.mean:  # first batch of this key
                    ema_mean[idx], ema_var[idx] = float(x[idx].mean()), float(x[idx].var(
                        unbiased=False))
                else:
                    ema_mean[idx], ema_var[idx] = self.base_stats.mean[k], self.base_stats.var[k]
            base = ema_mean
            if self.baseline == "adaptive":
                var_g = g.var(1, unbiased=False, keepdim=True).expand_as(g).reshape(-1)
                w = var_g / (var_g + ema_var).clamp_min(1e-12)
                base = w * group_mean + (1 - w) * ema_mean
                self.last["adv/baseline_weight"] = float(w.mean())
        for k, idx in groups.items():  # after the baseline read the state before this batch
            self.base_stats.update(k, x[idx])
            self.last[f"adv/running_mean/{k}"] = self.base_stats.mean[k]
            self.last[f"adv/running_std/{k}"] = self.base_stats.std(k)
        self.last["adv/baseline_mean"] = float(base.mean())
        if self.baseline == "group":  # the group mean, and the group's or batch's std
            adv = normalise_groups(g, "none" if self.scale == "running" else self.scale,
                                   self.min_std, shift=False)
        else:
            adv = x - base
            if self.scale == "batch":
                adv = adv / x.std().clamp_min(self.min_std)
        if self.scale == "running":
            for k, idx in groups.items():
                adv[idx] = adv[idx] / max(self.base_stats.std(k), self.min_std)
        if self.clip is not None:
            adv = adv.clamp(-self.clip, self.clip)
        factor = self.warmup(step)
        self.last["adv/warmup"] = factor
        return (adv * factor).float()

    def within(self, values: Tensor, step: int = 0) -> Tensor:
        """Advantages of one group's values [k] (k >= 2) at `step`: move credit's slots
        (`credit.move_advantages`). With the group baseline they are compared as this
        advantage compares a group's rewards (scale group or none; a slot's batch is its
        group, so batch divides by the group's own std); the running baselines and scales
        are statistics of the sequence reward, which a move's legality does not share, so
        there a group's slots are compared as GRPO does (group mean and std). Then the
        clip and the warm-up factor, as for the rewards."""
        per_group = self.normalize == "none" and self.baseline == "group" \
            and self.scale in ("group", "none")
        adv = relative_advantages(values[None], self.scale if per_group else "group",
                                  self.min_std, self.clip, shift=False)
        return adv * self.warmup(step)

    def metrics(self) -> dict[str, float]:
        """What the last call measured: running means and stds, the baseline, the warm-up."""
        return dict(self.last)

    def state_dict(self) -> dict:
        return {"norm": self.norm_stats.state_dict(), "base": self.base_stats.state_dict()}

    def load_state_dict(self, d: dict) -> None:
        self.norm_stats.load_state_dict(d["norm"])
        self.base_stats.load_state_dict(d["base"])
