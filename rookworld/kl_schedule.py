"""KL schedules: the coefficient beta on the KL(pi || ref) term of the loss, per step.

Tiny classes in the manner of verl's KL controllers, chosen with `kl=<name>`
(conf/kl/*.yaml). Every schedule has
    coef(step) -> float          beta for optimiser step `step` (0-based)
    update(kl, step) -> None     feed the measured KL back (only AdaptiveKL uses it)
    needs_reference: bool        False only for NoKL: the engine then loads no reference
                                 unless the KL guard (guard.kl) measures against one
    state_dict() / load_state_dict(d)   for exact resume
The KL value itself comes from the estimator named by `algorithm.kl_estimator`.
"""

from __future__ import annotations

import math


def _check(ok: bool, key: str, rule: str, value) -> None:
    if not ok:
        raise ValueError(f"kl.{key} must be {rule}, got {value!r}")


def _check_steps(key: str, value) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    _check(ok, key, "an integer >= 0", value)


class KLSchedule:
    """Base: a schedule without state beyond its config; subclasses define coef."""

    needs_reference = True

    def coef(self, step: int) -> float:
        raise NotImplementedError

    def update(self, kl: float, step: int) -> None:
        """Measured KL after `step`; ignored by every schedule except AdaptiveKL."""

    def state_dict(self) -> dict:
        return {"kind": type(self).__name__}

    def load_state_dict(self, d: dict) -> None:
        if d.get("kind") != type(self).__name__:
            raise ValueError(f"checkpoint holds KL schedule {d.get('kind')!r}, "
                             f"this run uses {type(self).__name__!r}: resume with the same kl=")


class NoKL(KLSchedule):
    """No KL term (DAPO, Dr. GRPO); no reference model either once guard.kl=null (the KL
    guard, on by default, measures the drift against one)."""

    needs_reference = False

    def coef(self, step: int) -> float:
        return 0.0

    def __repr__(self) -> str:
        return "NoKL()"


class FixedKL(KLSchedule):
    """beta at every step (GRPO: beta = 0.04, arXiv 2402.03300)."""

    def __init__(self, beta: float):
        _check(beta >= 0, "beta", ">= 0", beta)
        self.beta = float(beta)

    def coef(self, step: int) -> float:
        return self.beta

    def __repr__(self) -> str:
        return f"FixedKL(beta={self.beta})"


class WarmupFixedKL(KLSchedule):
    """0 for the first warmup_steps steps (0 .. warmup_steps - 1), then beta."""

    def __init__(self, beta: float, warmup_steps: int):
        _check(beta >= 0, "beta", ">= 0", beta)
        _check_steps("warmup_steps", warmup_steps)
        self.beta, self.warmup_steps = float(beta), warmup_steps

    def coef(self, step: int) -> float:
        return 0.0 if step < self.warmup_steps else self.beta

    def __repr__(self) -> str:
        return f"WarmupFixedKL(beta={self.beta}, warmup_steps={self.warmup_steps})"


class LinearWarmupKL(KLSchedule):
    """beta * step / warmup_steps, rising from 0 at step 0 to beta at warmup_steps, then beta."""

    def __init__(self, beta: float, warmup_steps: int):
        _check(beta >= 0, "beta", ">= 0", beta)
        _check_steps("warmup_steps", warmup_steps)
        self.beta, self.warmup_steps = float(beta), warmup_steps

    def coef(self, step: int) -> float:
        if step >= self.warmup_steps:
            return self.beta
        return self.beta * step / self.warmup_steps

    def __repr__(self) -> str:
        return f"LinearWarmupKL(beta={self.beta}, warmup_steps={self.warmup_steps})"


def adaptive_beta(beta: float, kl: float, target: float, horizon: float,
                  beta_min: float, beta_max: float) -> float:
    """One step of Ziegler et al.'s proportional controller (arXiv 1909.08593):
    e = clip(kl / target - 1, -0.2, 0.2); beta * (1 + e / horizon), clamped to
    [beta_min, beta_max]. horizon is in steps: Ziegler's K_beta = 0.1 is horizon 10."""
    error = min(max(kl / target - 1.0, -0.2), 0.2)
    return min(max(beta * (1.0 + error / horizon), beta_min), beta_max)


class AdaptiveKL(KLSchedule):
    """beta moved each step toward the value that keeps the measured KL at `target`
    (nats per token, as measured by the chosen estimator), clamped to [beta_min, beta_max].
    update() raises on a non-finite KL: skip it on steps the NaN guard skipped."""

    def __init__(self, beta: float, target: float, horizon: float = 10.0,
                 beta_min: float = 1e-3, beta_max: float = 1.0):
        _check(beta_min > 0, "beta_min", "> 0 (a multiplicative controller cannot leave 0)",
               beta_min)
        _check(beta_max >= beta_min, "beta_max", f">= kl.beta_min ({beta_min})", beta_max)
        _check(beta_min <= beta <= beta_max, "beta",
               f"in [kl.beta_min, kl.beta_max] = [{beta_min}, {beta_max}]", beta)
        _check(target > 0, "target", "> 0 (nats per token)", target)
        _check(horizon > 0, "horizon", "> 0 (steps)", horizon)
        self.beta, self.target, self.horizon = float(beta), float(target), float(horizon)
        self.beta_min, self.beta_max = float(beta_min), float(beta_max)

    def coef(self, step: int) -> float:
        return self.beta

    def update(self, kl: float, step: int) -> None:
        kl = float(kl)
        if not math.isfinite(kl):
            raise ValueError(f"AdaptiveKL.update got a non-finite KL ({kl}) at step {step}")
        self.beta = adaptive_beta(self.beta, kl, self.target, self.horizon,
                                  self.beta_min, self.beta_max)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "beta": self.beta}

    def load_state_dict(self, d: dict) -> None:
        super().load_state_dict(d)
        self.beta = float(d["beta"])

    def __repr__(self) -> str:
        return (f"AdaptiveKL(beta={self.beta}, target={self.target}, horizon={self.horizon}, "
                f"beta_min={self.beta_min}, beta_max={self.beta_max})")
