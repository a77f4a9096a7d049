"""PPO with a value function (algorithm=ppo) and RLOO (advantage=rloo): GAE against a plain
per-token loop, the clipped value loss against its formula, RLOO against the hand
formula, a PPO step on tiny models on both backends, and resume exactness with the critic."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_engine import LengthReward
from test_faults import assert_same_run, crash_at

from rookworld import grpo, ppo
from rookworld.config import ConfigError, compose, validate
from rookworld.data.load import read_samples
from rookworld.policy import build_random, save_policy
from rookworld.run_dir import latest_checkpoint
from rookworld.train import build_engine, build_parts, resolve_resume, run


def gae_loop(rewards, values, mask, gamma, lam):
    """GAE one row and one token at a time, in plain floats."""
    adv = [[0.0] * len(r) for r in rewards]
    for i, (r, v, m) in enumerate(zip(rewards, values, mask)):
        n = int(sum(m))
        last = 0.0
        for t in reversed(range(n)):
            next_v = v[t + 1] if t + 1 < n else 0.0
            delta = r[t] + gamma * next_v - v[t]
            last = delta + gamma * lam * last
            adv[i][t] = last
    returns = [[a + (v if t < sum(m) else 0.0) for t, (a, v) in enumerate(zip(ar, vr))]
               for ar, vr, m in zip(adv, values, mask)]
    return adv, returns


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 4), t=st.integers(1, 7), seed=st.integers(0, 10_000),
       gamma=st.sampled_from([0.0, 0.5, 0.99, 1.0]), lam=st.sampled_from([0.0, 0.3, 0.95, 1.0]))
def test_gae_equals_a_plain_per_token_loop(n, t, seed, gamma, lam):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, t + 1, (n,), generator=g)
    mask = (torch.arange(t)[None] < lengths[:, None]).double()
    rewards = torch.randn(n, t, generator=g, dtype=torch.float64) * mask
    values = torch.randn(n, t, generator=g, dtype=torch.float64)
    adv, returns = ppo.gae(rewards, values, mask, gamma, lam)
    want_adv, want_ret = gae_loop(rewards.tolist(), values.tolist(), mask.tolist(), gamma, lam)
    torch.testing.assert_close(adv, torch.tensor(want_adv, dtype=torch.float64))
    torch.testing.assert_close(returns, torch.tensor(want_ret, dtype=torch.float64))


def test_gae_at_lambda_one_is_the_return_minus_the_value_and_at_zero_the_td_error():
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    rewards = ppo.token_rewards(torch.tensor([2.0]), mask)
    assert rewards.tolist() == [[0.0, 0.0, 2.0, 0.0]]  # the score on the last token
    values = torch.tensor([[0.5, 1.0, 1.5, 9.0]])  # the padded value is ignored
    adv, returns = ppo.gae(rewards, values, mask, gamma=1.0, lam=1.0)
    assert adv.tolist() == [[1.5, 1.0, 0.5, 0.0]] and returns.tolist() == [[2.0, 2.0, 2.0, 0.0]]
    adv, _ = ppo.gae(rewards, values, mask, gamma=1.0, lam=0.0)
    assert adv.tolist() == [[0.5, 0.5, 0.5, 0.0]]  # r_t + V_{t+1} - V_t


def test_kl_in_the_reward_charges_every_token():
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    r = ppo.token_rewards(torch.tensor([1.0]), mask, kl=torch.tensor([[0.2, 0.4, 5.0]]), beta=0.5)
    torch.testing.assert_close(r, torch.tensor([[-0.1, 0.8, 0.0]]))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), clip=st.sampled_from([None, 0.05, 0.2, 1.0]))
def test_the_clipped_value_loss_equals_its_formula(seed, clip):
    g = torch.Generator().manual_seed(seed)
    v, old, ret = (torch.randn(3, 5, generator=g, dtype=torch.float64) for _ in range(3))
    mask = (torch.rand(3, 5, generator=g) > 0.3).double()
    mask[0, 0] = 1.0
    loss, m = ppo.value_loss(v, old, ret, mask, clip)
    terms, clipped = [], []
    for i in range(3):
        for t in range(5):
            if mask[i, t]:
                a = (float(v[i, t]) - float(ret[i, t])) ** 2
                vc = float(v[i, t]) if clip is None else \
                    float(old[i, t]) + max(-clip, min(clip, float(v[i, t] - old[i, t])))
                b = (vc - float(ret[i, t])) ** 2
                terms.append(0.5 * max(a, b))
                clipped.append(clip is not None and abs(float(v[i, t] - old[i, t])) > clip
                               and b > a)
    assert float(loss) == pytest.approx(sum(terms) / len(terms))
    assert float(m["value/clip_frac"]) == pytest.approx(sum(clipped) / len(clipped))


def test_a_value_inside_the_clip_range_is_not_counted_as_clipped():
    """old + (v - old) rounds one ulp off v in float32 here; the value is 0.127 from its old
    one, inside the range of 0.2, so nothing is clipped."""
    v, old, ret = (torch.tensor([[x]]) for x in (0.08813405781984329, 0.2155674695968628,
                                                 0.1108652874827385))
    assert float(old + (v - old).clamp(-0.2, 0.2)) != float(v)  # the rounding is there
    _, m = ppo.value_loss(v, old, ret, torch.ones(1, 1), 0.2)
    assert float(m["value/clip_frac"]) == 0.0


def test_whitening_and_explained_variance():
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 5.0, -7.0, 9.0]])
    w = ppo.whiten(x, mask)
    kept = w[mask.bool()]
    assert float(kept.mean()) == pytest.approx(0, abs=1e-6)
    assert float(kept.std()) == pytest.approx(1, abs=1e-4)
    assert float(w[~mask.bool()].abs().sum()) == 0
    assert ppo.explained_variance(x, x, mask) == pytest.approx(1.0)
    assert ppo.explained_variance(torch.zeros_like(x) + 3.0, x, mask) == pytest.approx(0.0)
    assert math.isnan(ppo.explained_variance(x, torch.ones_like(x), mask))
    assert torch.equal(ppo.whiten(x, torch.zeros_like(mask)), torch.zeros_like(x))  # no token


def test_rloo_is_each_reward_minus_the_mean_of_the_others():
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.25, 3.0, 3.0, 1.0, 2.0])
    adv = grpo.GroupAdvantage(scale="none", baseline="leave_one_out")(rewards, 4)
    want = [float(r) - (float(g.sum()) - float(r)) / 3
            for g in rewards.view(2, 4) for r in g]
    assert adv.tolist() == pytest.approx(want)
    cfg = compose(["advantage=rloo"])
    assert cfg.algorithm.advantage.baseline == "leave_one_out"
    with pytest.raises(ValueError, match="baseline"):
        grpo.GroupAdvantage(baseline="median")


@pytest.mark.parametrize(("override", "message"), [
    (["algorithm.credit=moves"], "credit=sequence"),
    (["algorithm.critic.kind=both"], "head or model"),
    (["algorithm.critic.lam=1.5"], "lam"),
    (["task_mix=games"], "task_mix=games"),
])
def test_ppo_settings_that_cannot_work_are_refused(override, message):
    cfg = compose(["algorithm=ppo"] + override)
    with pytest.raises((ConfigError, ValueError), match=message):
        validate(cfg)
        build_parts(cfg)


def _ppo_engine(overrides, kind):
    cfg = compose(overrides + ["algorithm=ppo", f"algorithm.critic.kind={kind}",
                               "algorithm.critic.warmup_steps=1", "optim.lr=0.01"])
    return cfg, build_engine(cfg, build_parts(cfg), LengthReward())


@pytest.mark.parametrize("kind", ["head", "model"])
def test_a_ppo_step_trains_the_critic_then_the_policy_on_both_backends(tiny_overrides, backend,
                                                                       kind):
    """Step 0 (the critic's warm-up) moves the value head and leaves the policy; step 1
    moves both; under kind=model the critic's own trunk moves and the policy's only by
    the policy loss."""
    cfg, e = _ppo_engine(tiny_overrides + backend, kind)
    train = read_samples(cfg.data.train)
    pools = {t: [s for s in train if s.task == t] for t in "PA"}
    draw = build_parts(cfg).task_mix.draw
    policy0 = {k: p.detach().clone() for k, p in e.model.named_parameters()}
    head0 = e.critic.head.weight.detach().clone()
    b = e.rollout(draw(pools, 2, 0, 0), 0)
    assert b.advantages.shape == b.rollout.completion_ids.shape  # per token
    m = e.update(b, 0)
    assert m["value/policy_moves"] == 0.0 and m["value/loss"] > 0
    assert not torch.equal(e.critic.head.weight, head0)
    assert all(torch.equal(p, policy0[k]) for k, p in e.model.named_parameters())
    trunk0 = {k: p.detach().clone() for k, p in e.critic.trunk.named_parameters()}
    m = e.update(e.rollout(draw(pools, 2, 1, 0), 1), 1)
    assert m["value/policy_moves"] == 1.0 and math.isfinite(m["loss/total"])
    assert any(not torch.equal(p, policy0[k]) for k, p in e.model.named_parameters())
    if kind == "model":
        assert e.critic.trunk is not e.model
        assert any(not torch.equal(p, trunk0[k]) for k, p in e.critic.trunk.named_parameters())


RESUMED = {"ppo, value head": ["algorithm=ppo"],
           "ppo, critic model": ["algorithm=ppo", "algorithm.critic.kind=model"],
           "ppo, value head, model=hf": ["algorithm=ppo", "HF"],
           "rloo, model=hf": ["advantage=rloo", "HF"]}


@pytest.mark.parametrize("arm", list(RESUMED))
def test_ppo_and_rloo_resume_exactly(arm, tiny_overrides, tmp_path, monkeypatch,
                                     spread_rewards):
    """A run that crashes at step 2 and resumes from step 1's checkpoint equals the whole
    run: metrics, the policy's weights and the critic's (head, and trunk when it has one)."""
    extra = [o for o in RESUMED[arm] if o != "HF"]
    base = tiny_overrides
    if "HF" in RESUMED[arm]:  # transformers' GPT-2 from a directory in the hub layout
        save_policy(build_random(n_layer=2, n_embd=32, n_head=2, n_positions=320),
                    tmp_path / "gpt2")
        base = [o for o in tiny_overrides if not o.startswith("model")] + [
            "model=hf", f"model.path={tmp_path / 'gpt2'}"]
    overrides = base + extra + ["algorithm.critic.warmup_steps=1"] * ("algorithm=ppo" in extra) \
        + ["steps=3", "checkpoint_every=1", "optim.lr=0.01", "guard.kl.threshold=1000"]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert run(compose(overrides), whole).outcome.status == "success"
    crash_at(monkeypatch, 2, lambda: run(compose(overrides), cut))
    args = overrides + [f"resume={cut}"]
    resumed, run_dir = resolve_resume(compose(args), args)
    assert run(resumed, run_dir).outcome.status == "success"
    assert_same_run(whole, cut)
    if "algorithm=ppo" not in extra:
        return
    critics = [torch.load(latest_checkpoint(d) / "state.pt", weights_only=True)["engine"]["critic"]
               for d in (whole, cut)]
    for part in ("head", "trunk") if "kind=model" in " ".join(extra) else ("head",):
        a, b = critics[0][part], critics[1][part]
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_critics_schedule_steps_once_a_training_step(tiny_overrides):
    """With three PPO iterations an update, the critic's cosine schedule keeps pace with the
    policy's (one step per update, not one per iteration), and a skipped non-finite update
    backs off both learning rates alike."""
    cfg, e = _ppo_engine(tiny_overrides + ["algorithm.num_iterations=3", "optim=adamw_cosine",
                                           "optim.schedule.warmup_steps=1", "steps=6"], "head")
    pools = {t: [s for s in read_samples(cfg.data.train) if s.task == t] for t in "PA"}
    draw = build_parts(cfg).task_mix.draw
    for step in range(2):
        e.update(e.rollout(draw(pools, 2, step, 0), step), step)
        assert e.critic.scheduler.last_epoch == e.scheduler.last_epoch == step + 1
    base = e.critic.scheduler.base_lrs[0]
    b = e.rollout(draw(pools, 2, 2, 0), 2)
    b.advantages[:] = float("nan")
    assert e.update(b, 2)["guard/nan_skipped"] == 1
    assert e.critic.scheduler.last_epoch == e.scheduler.last_epoch == 3
    assert e.critic.scheduler.base_lrs[0] == pytest.approx(base * e.nan_lr_backoff)
