"""reward=continuous: the graduated reward's parts combined linearly."""

from __future__ import annotations

from collections.abc import Mapping

from .base import PartsReward
from .parts import EVAL_CAP

POLICY_WEIGHTS = {"legal": 0.15, "best_legal": 0.15, "top5": 0.2, "eval_error": 0.1, "best": 0.4}
ENV_WEIGHTS = {"fen_exact": 0.3, "fen_similarity": 0.3, "reward": 0.15, "flags": 0.15,
               "exact": 0.1}


def _weights(given: Mapping | None, defaults: dict[str, float], key: str) -> dict[str, float]:
    """defaults overridden by `given`; rejects unknown parts, negative weights, all zero."""
    out = dict(defaults)
    for name, w in dict(given or {}).items():
        if name not in defaults:
            raise ValueError(f"reward.{key}.{name}: unknown part; expected one of "
                             f"{sorted(defaults)}")
        if w < 0:
            raise ValueError(f"reward.{key}.{name}={w} must be >= 0")
        out[name] = float(w)
    if sum(out.values()) <= 0:
        raise ValueError(f"reward.{key}: at least one weight must be positive")
    return out


class ContinuousReward(PartsReward):
    """score = sum_k w_k * q_k / sum_k w_k  -  malformed_penalty * (1 - format)

    q_k is part k of parts.py, except for eval_error, where q = 1 - eval_error /
    EVAL_CAP (so 1 is no error). Every q is in [0, 1], so the score is in
    [-malformed_penalty, 1.0]; a correct answer scores exactly 1.0 and the
    score never decreases when a part improves. No steps: a malformed
    completion still earns credit for the parts it got right.

    policy_weights keys: legal, best_legal, top5, eval_error, best.
    env_weights keys: fen_exact, fen_similarity, reward, flags, exact.
    Keys left out keep their defaults (POLICY_WEIGHTS, ENV_WEIGHTS).
    """

    def __init__(self, malformed_penalty: float = 0.3, policy_weights: Mapping | None = None,
                 env_weights: Mapping | None = None):
        if malformed_penalty < 0:
            raise ValueError(f"reward.malformed_penalty={malformed_penalty} must be >= 0")
        self.malformed_penalty = float(malformed_penalty)
        self.policy_weights = _weights(policy_weights, POLICY_WEIGHTS, "policy_weights")
        self.env_weights = _weights(env_weights, ENV_WEIGHTS, "env_weights")
        self.range = (-self.malformed_penalty, 1.0)

    def policy_score(self, p: dict[str, float]) -> float:
        q = dict(p, eval_error=1.0 - min(p["eval_error"], EVAL_CAP) / EVAL_CAP)
        return self._combine(q, self.policy_weights)

    def env_score(self, p: dict[str, float]) -> float:
        return self._combine(p, self.env_weights)

    def _combine(self, q: dict[str, float], weights: dict[str, float]) -> float:
        mean = sum(w * q[k] for k, w in weights.items()) / sum(weights.values())
        return min(mean, 1.0) - self.malformed_penalty * (1.0 - q["format"])
