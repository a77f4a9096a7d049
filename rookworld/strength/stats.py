"""Intervals for the strength suite: Wilson for shares (honest at 0 of 40), the mean's
t interval for scores and losses (`held_out.t95`: 3.18 standard errors over 4 games, 1.97
over 500), a seeded bootstrap for medians, and the Elo difference implied by a score."""

from __future__ import annotations

import math
import random
import statistics

from ..held_out import Z, t95


def wilson(k: float, n: int, z: float = Z) -> tuple[float, float]:
    """~95% Wilson score interval of a share k/n ((0, 1) for n = 0); its bound is exactly 0
    at k = 0 and exactly 1 at k = n (the formula's rounding leaves 1e-17 off, which
    `elo_estimate` would read as a finite Elo bound)."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    low = 0.0 if k <= 0 else max(0.0, centre - half)
    high = 1.0 if k >= n else min(1.0, centre + half)
    return low, high


def mean_interval(values: list[float]) -> tuple[float, float]:
    """(mean, half-width of its ~95% t interval, `t95`); (nan, nan) when empty, the
    half-width nan for one value."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan
    return mean, t95(n) * statistics.stdev(values) / math.sqrt(n)


def median_interval(values: list[float], seed: int = 0, resamples: int = 2000
                    ) -> tuple[float, float, float]:
    """(median, low, high): the percentile interval of 2,000 bootstrap medians."""
    if not values:
        return math.nan, math.nan, math.nan
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(values, k=len(values)))
                  for _ in range(resamples))
    return statistics.median(values), meds[int(0.025 * resamples)], \
        meds[int(0.975 * resamples) - 1]


def elo_difference(score: float) -> float:
    """The Elo difference that expects `score` (0 < score < 1): 400 log10(s / (1 - s))."""
    return 400 * math.log10(score / (1 - score))


def elo_estimate(scores: list[float], anchor: float) -> dict:
    """The player's Elo from its game scores (1, 0.5, 0) against an opponent rated
    `anchor`: anchor + elo_difference(mean score), with the interval of the score's
    Wilson bounds (draws count half a win). At a score of 0 or 1 there is no point
    estimate, only the bound the interval allows ('below' / 'above')."""
    n = len(scores)
    if n == 0:
        return {"elo": None, "low": None, "high": None, "n": 0}
    s = sum(scores) / n
    lo, hi = wilson(sum(scores), n)
    return {"elo": anchor + elo_difference(s) if 0 < s < 1 else None,
            "low": anchor + elo_difference(lo) if lo > 0 else None,
            "high": anchor + elo_difference(hi) if hi < 1 else None, "n": n, "score": s}
