"""rookworld.kl_schedule: schedule values at given steps, the adaptive controller, resume, YAMLs."""

import math
from pathlib import Path

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from rookworld.kl_schedule import (
    AdaptiveKL,
    FixedKL,
    LinearWarmupKL,
    NoKL,
    WarmupFixedKL,
    adaptive_beta,
)

CONF = Path(__file__).resolve().parents[1] / "conf" / "kl"


def test_none():
    s = NoKL()
    s.update(123.0, 0)
    assert [s.coef(t) for t in (0, 5, 10**6)] == [0.0, 0.0, 0.0]
    assert s.needs_reference is False


def test_fixed():
    s = FixedKL(0.04)
    s.update(9.0, 3)
    assert [s.coef(t) for t in (0, 1, 10**6)] == [0.04, 0.04, 0.04]
    assert s.needs_reference is True


def test_warmup_fixed():
    # 0 for steps 0, 1, 2 (warmup_steps = 3), then beta
    s = WarmupFixedKL(0.1, 3)
    assert [s.coef(t) for t in range(6)] == [0.0, 0.0, 0.0, 0.1, 0.1, 0.1]
    assert WarmupFixedKL(0.1, 0).coef(0) == 0.1
    assert s.needs_reference is True


def test_linear_warmup():
    # beta * step / 4: 0, .025, .05, .075, then .1
    s = LinearWarmupKL(0.1, 4)
    assert [s.coef(t) for t in range(6)] == pytest.approx([0.0, 0.025, 0.05, 0.075, 0.1, 0.1])
    assert LinearWarmupKL(0.1, 0).coef(0) == 0.1


def test_adaptive_beta_hand():
    # target .05, horizon 10, e = clip(kl / .05 - 1, -.2, .2), beta * (1 + e / 10)
    step = lambda kl: adaptive_beta(0.1, kl, 0.05, 10, 1e-3, 1.0)  # noqa: E731
    assert step(0.05) == pytest.approx(0.1)  # e = 0
    assert step(0.055) == pytest.approx(0.1 * 1.01)  # e = .1 -> .101
    assert step(0.5) == pytest.approx(0.1 * 1.02)  # e = 9 clipped to .2 -> .102
    assert step(0.0) == pytest.approx(0.1 * 0.98)  # e = -1 clipped to -.2 -> .098
    assert adaptive_beta(1.0, 0.5, 0.05, 10, 1e-3, 1.0) == 1.0  # 1.02 clamped to beta_max
    assert adaptive_beta(1e-3, 0.0, 0.05, 10, 1e-3, 1.0) == 1e-3  # .00098 clamped to beta_min


def test_adaptive_moves_beta_toward_target():
    # plant: the KL the policy shows falls as beta rises, kl = 0.005 / beta; the target
    # 0.05 is met at beta = 0.1. From beta = 0.01 the controller must climb there and stay.
    s = AdaptiveKL(beta=0.01, target=0.05, horizon=10, beta_min=1e-3, beta_max=1.0)
    betas = []
    for t in range(400):
        s.update(0.005 / s.coef(t), t)
        betas.append(s.coef(t + 1))
    assert all(b2 >= b1 for b1, b2 in zip(betas, betas[1:], strict=False))  # approached from below
    assert betas[-1] == pytest.approx(0.1, rel=0.02)


def test_adaptive_stays_clamped():
    s = AdaptiveKL(beta=0.05, target=0.05, horizon=2, beta_min=0.02, beta_max=0.08)
    for t in range(100):
        s.update(10.0 if (t // 20) % 2 == 0 else 0.0, t)
        assert 0.02 <= s.coef(t) <= 0.08
    s2 = AdaptiveKL(beta=0.05, target=0.05, horizon=2, beta_min=0.02, beta_max=0.08)
    for t in range(50):
        s2.update(10.0, t)
    assert s2.coef(50) == 0.08


def test_adaptive_state_dict_round_trip():
    a = AdaptiveKL(beta=0.04, target=0.05)
    for t, kl in enumerate([0.2, 0.1, 0.07, 0.01]):
        a.update(kl, t)
    b = AdaptiveKL(beta=0.04, target=0.05)
    b.load_state_dict(a.state_dict())
    assert b.coef(4) == a.coef(4) != 0.04
    for t, kl in enumerate([0.3, 0.02], start=4):
        a.update(kl, t)
        b.update(kl, t)
    assert b.coef(6) == a.coef(6)


def test_state_dict_rejects_another_schedule():
    FixedKL(0.1).load_state_dict(FixedKL(0.1).state_dict())
    with pytest.raises(ValueError, match="same kl="):
        FixedKL(0.1).load_state_dict(AdaptiveKL(0.04, 0.05).state_dict())


@pytest.mark.parametrize("make, message", [
    (lambda: FixedKL(-1), "kl.beta must be >= 0, got -1"),
    (lambda: WarmupFixedKL(0.1, -1), "kl.warmup_steps must be an integer >= 0"),
    (lambda: LinearWarmupKL(0.1, 2.5), "kl.warmup_steps must be an integer >= 0"),
    (lambda: AdaptiveKL(0.04, 0.0), "kl.target must be > 0"),
    (lambda: AdaptiveKL(0.04, 0.05, horizon=0), "kl.horizon must be > 0"),
    (lambda: AdaptiveKL(0.04, 0.05, beta_min=0.0), "kl.beta_min must be > 0"),
    (lambda: AdaptiveKL(2.0, 0.05), "kl.beta must be in"),
    (lambda: AdaptiveKL(0.04, 0.05, beta_min=0.1, beta_max=0.05), "kl.beta_max must be >="),
])
def test_impossible_values_rejected(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_adaptive_update_rejects_nan():
    with pytest.raises(ValueError, match="non-finite"):
        AdaptiveKL(0.04, 0.05).update(math.nan, 3)


@pytest.mark.parametrize("name, cls, needs_ref", [
    ("none", NoKL, False), ("fixed", FixedKL, True), ("warmup_fixed", WarmupFixedKL, True),
    ("linear_warmup", LinearWarmupKL, True), ("adaptive", AdaptiveKL, True),
])
def test_kl_yaml_instantiates(name, cls, needs_ref):
    s = instantiate(OmegaConf.load(CONF / f"{name}.yaml"), _execution_whitelist_=["rookworld.*"])
    assert type(s) is cls and s.needs_reference is needs_ref
    assert s.coef(10**6) == (0.0 if cls is NoKL else 0.04)
