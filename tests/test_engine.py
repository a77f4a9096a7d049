"""The engine on a tiny model: every parameter moves, losses are finite, dropout is off."""

import math

import pytest
import torch

from rookworld.config import compose
from rookworld.rewards.base import Reward, Scored
from rookworld.train import build_engine, build_parts


class LengthReward(Reward):
    """Varies within every group (for mechanics tests only): longer is better."""

    range = (0.0, 1.0)

    def __call__(self, sample, completion):
        return Scored(min(len(completion), 24) / 24, {"len": float(len(completion))})


@pytest.fixture
def engine_and_pools(tiny_overrides):
    from rookworld.data_io import read_samples

    cfg = compose(tiny_overrides + ["sampler.temperature=1.5", "optim.lr=1e-2", "kl=fixed"])
    parts = build_parts(cfg)
    engine = build_engine(cfg, parts, LengthReward())
    train = read_samples(cfg.data.train)
    pools = {t: [s for s in train if s.task == t] for t in "PA"}
    return cfg, parts, engine, pools


def test_every_trainable_parameter_changes_and_losses_are_finite(engine_and_pools):
    cfg, parts, engine, pools = engine_and_pools
    before = {n: p.detach().clone() for n, p in engine.model.named_parameters()}
    batch = engine.rollout(parts.task_mix.draw(pools, 4, 0, 0), 0)
    assert batch.rewards.std() > 0
    m = engine.update(batch, 0)
    for k in ("loss/policy", "loss/total", "loss/kl", "optim/grad_norm", "policy/entropy"):
        assert math.isfinite(m[k]), k
    unchanged = [n for n, p in engine.model.named_parameters()
                 if torch.equal(p.detach(), before[n]) and not n.endswith("wpe.weight")]
    assert unchanged == []
    # position rows beyond the longest sequence get no gradient; the used ones move
    used = batch.rollout.prompt_ids.shape[1] + batch.rollout.completion_ids.shape[1]
    wpe = dict(engine.model.named_parameters())["transformer.wpe.weight"]
    assert not torch.equal(wpe[:used], before["transformer.wpe.weight"][:used])


def test_reference_is_frozen_and_agrees_with_policy_at_step_zero(engine_and_pools):
    cfg, parts, engine, pools = engine_and_pools
    assert all(not p.requires_grad for p in engine.ref.parameters())
    assert not engine.model.training and not engine.ref.training
    batch = engine.rollout(parts.task_mix.draw(pools, 2, 0, 0), 0)
    # at step 0 the reference and the sampling policy give the same log-probs
    assert torch.allclose(batch.ref_logprobs, batch.rollout.logprobs, atol=1e-5)
    m = engine.update(batch, 0)
    assert abs(m["kl/k3"]) < 1e-6 and abs(m["policy/ratio_mean"] - 1) < 1e-5


def test_dropout_is_zero_in_every_model_config(engine_and_pools):
    engine = engine_and_pools[2]
    cfg = engine.model.config
    assert cfg.resid_pdrop == cfg.embd_pdrop == cfg.attn_pdrop == 0.0


def test_clip_stats_cover_every_iteration_not_only_the_first(tiny_overrides):
    """With num_iterations > 1 the ratio moves after the first update: the logged ratio and
    clip fractions are the mean over the iterations (iteration 0 alone always reads 1 / 0)."""
    from rookworld.data_io import read_samples

    cfg = compose(tiny_overrides + ["sampler.temperature=1.5", "optim.lr=5e-2",
                                    "algorithm.num_iterations=3"])
    parts = build_parts(cfg)
    engine = build_engine(cfg, parts, LengthReward())
    train = read_samples(cfg.data.train)
    pools = {t: [s for s in train if s.task == t] for t in "PA"}
    m = engine.update(engine.rollout(parts.task_mix.draw(pools, 4, 0, 0), 0), 0)
    assert m["policy/ratio_max"] > 1.0 + 1e-3
    assert m["policy/clip_frac_low"] + m["policy/clip_frac_high"] > 0


def test_release_memory_changes_memory_not_results(tiny_overrides, monkeypatch):
    """release_memory=true trims the heap after each rollout and update (glibc) and
    nothing else: the same seed gives the same samples and metrics."""
    from rookworld import engine as engine_mod
    from rookworld.data_io import read_samples

    calls = []
    monkeypatch.setattr(engine_mod, "release_freed_memory", lambda: calls.append(1))
    runs = []
    for release in (False, True):
        cfg = compose(tiny_overrides + ["sampler.temperature=1.5", "kl=fixed",
                                        f"release_memory={str(release).lower()}"])
        parts = build_parts(cfg)
        torch.manual_seed(cfg.seed)
        engine = build_engine(cfg, parts, LengthReward())
        train = read_samples(cfg.data.train)
        pools = {t: [s for s in train if s.task == t] for t in "PA"}
        out = []
        for step in range(2):
            batch = engine.rollout(parts.task_mix.draw(pools, 4, step, 0), step)
            m = engine.update(batch, step)
            out.append((batch.rollout.completion_ids.tolist(), m["loss/total"], m["kl/k3"]))
        runs.append(out)
        assert len(calls) == (4 if release else 0)
    assert runs[0] == runs[1]
