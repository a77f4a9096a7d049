"""rookworld.grpo: group advantages and each policy-loss variant against its paper's formula
(hand-computed values, loops, gradients), and the conf/algorithm YAMLs."""

import math
import statistics
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from test_grpo_estimators import M, X  # the aggregators' hand-checked tensors

from rookworld.advantages import RunningAdvantage
from rookworld.grpo import (
    Algorithm,
    GroupAdvantage,
    PolicyLoss,
    aggregate,
    compute_loss,
    group_advantages,
    policy_loss,
    silent_groups,
    token_logprobs,
    zero_variance_groups,
)

CONF = Path(__file__).resolve().parents[1] / "conf"


# ---- advantages ------------------------------------------------------------------------------

R = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])  # two groups of 4


def test_group_advantages_hand():
    # group 1: mean 0.5, centred [.5, -.5, -.5, .5], unbiased std sqrt(4 * .25 / 3) = 0.57735
    # group 2: all 2 -> 0
    s3 = 0.5 / math.sqrt(1 / 3)  # 0.866025
    want = torch.tensor([s3, -s3, -s3, s3, 0, 0, 0, 0])
    assert torch.allclose(group_advantages(R, 4, "group"), want, atol=1e-6)
    # none (Dr. GRPO): centred only
    assert torch.allclose(group_advantages(R, 4, "none"),
                          torch.tensor([.5, -.5, -.5, .5, 0, 0, 0, 0]))
    # batch: std of all 8 rewards; mean 1.25, sum of squares .0625*2 + 1.5625*2 + .5625*4 = 5.5,
    # unbiased 5.5 / 7, std 0.886405 -> +-0.5 / 0.886405 = +-0.564076
    b = 0.5 / math.sqrt(5.5 / 7)
    assert torch.allclose(group_advantages(R, 4, "batch"),
                          torch.tensor([b, -b, -b, b, 0, 0, 0, 0]), atol=1e-6)
    # clip at 0.5: +-0.866 -> +-0.5
    assert torch.allclose(group_advantages(R, 4, "group", clip=0.5),
                          torch.tensor([.5, -.5, -.5, .5, 0, 0, 0, 0]))


def test_group_std_floor():
    # [0, .001, 0, .001]: centred +-.0005, std .0005 * sqrt(4/3) = 5.77e-4 < min_std = .01
    # -> advantages +-.0005 / .01 = +-.05
    got = group_advantages(torch.tensor([0.0, 0.001, 0.0, 0.001]), 4, "group", min_std=0.01)
    assert torch.allclose(got, torch.tensor([-0.05, 0.05, -0.05, 0.05]), atol=1e-6)


def test_equal_rewards_give_exactly_zero_advantage():
    # float64 0.7 * 3: a naive mean leaves a residue of 1.1e-16 with a std of 1.4e-16, which
    # std scaling would blow up to +-0.8; the shift by the group's first reward leaves exact 0
    for G in (3, 6, 7):
        r = torch.full((2 * G,), 0.7, dtype=torch.float64)
        for scale in ("group", "batch", "none"):
            assert (group_advantages(r, G, scale, min_std=1e-30) == 0).all()


def test_group_advantages_vs_loop():
    g = torch.Generator().manual_seed(6)
    r, G = torch.rand(12, generator=g), 4
    vals = r.tolist()
    batch_std = statistics.stdev(vals)
    for i in range(0, 12, G):
        grp = vals[i:i + G]
        mu, sd = statistics.mean(grp), statistics.stdev(grp)
        for j, v in enumerate(grp):
            assert group_advantages(r, G, "group")[i + j].item() == pytest.approx(
                (v - mu) / sd, abs=1e-5)
            assert group_advantages(r, G, "batch")[i + j].item() == pytest.approx(
                (v - mu) / batch_std, abs=1e-5)
            assert group_advantages(r, G, "none")[i + j].item() == pytest.approx(v - mu, abs=1e-6)


def test_group_advantage_class_and_validation():
    assert torch.equal(GroupAdvantage("none")(R, 4), group_advantages(R, 4, "none"))
    with pytest.raises(ValueError, match="algorithm.advantage.scale"):
        GroupAdvantage("whiten")
    with pytest.raises(ValueError, match="algorithm.advantage.min_std"):
        GroupAdvantage("group", min_std=0.0)
    with pytest.raises(ValueError, match="algorithm.advantage.clip"):
        GroupAdvantage(clip=-1.0)
    with pytest.raises(ValueError, match="group_size"):
        group_advantages(R, 3)
    with pytest.raises(ValueError, match="group_size"):
        group_advantages(R, 1)


def test_silent_groups_are_those_whose_advantages_are_all_zero():
    seq = torch.tensor([0.0, 0.0, 0.5, -0.5, 0.0, 0.0])
    assert silent_groups(seq, 2).tolist() == [True, False, True]
    per_token = torch.zeros(6, 3)
    per_token[5, 2] = 0.7  # a move slot's advantage in a group of equal rewards
    assert silent_groups(per_token, 2).tolist() == [True, True, False]
    # a running baseline gives a group of equal rewards advantages: not silent
    ema = RunningAdvantage(baseline="ema", scale="none", per_task=False)
    ema(torch.tensor([0.0, 0.0, 1.0, 1.0]), 2)
    adv = ema(torch.tensor([1.0, 1.0, 0.0, 1.0]), 2)
    assert zero_variance_groups(torch.tensor([1.0, 1.0, 0.0, 1.0]), 2).tolist() == [True, False]
    assert silent_groups(adv, 2).tolist() == [False, False]


def test_zero_variance_groups():
    r = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.5, 0.5001, 0.5, 0.5])
    assert zero_variance_groups(r, 4).tolist() == [True, False, False]
    assert zero_variance_groups(r, 4, tol=1e-3).tolist() == [True, False, True]


# ---- policy loss: each variant against its paper's formula -----------------------------------
# Two sequences, T = 3. old_logp = -1 everywhere; logp = -1 + ln(ratio).
# seq 0: ratios [1.5, 0.5, 1.0], all real; seq 1: ratios [1.1, 0.7, 9.0], last is padding.

RATIOS = torch.tensor([[1.5, 0.5, 1.0], [1.1, 0.7, 9.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
OLD = torch.full((2, 3), -1.0)


def _logp():
    return (OLD + RATIOS.log()).requires_grad_(True)


def test_grpo_loss_hand():
    # A = [+1, -1]; clip [0.8, 1.2]; per token -min(r A, clip(r) A)
    # seq 0: min(1.5, 1.2)=1.2, min(.5, .8)=.5, 1.0 -> mean -(2.7 / 3) = -0.9
    # seq 1: min(-1.1, -1.1)=-1.1, min(-.7, -.8)=-.8 -> mean +(1.9 / 2) = 0.95
    # GRPO: mean over sequences = (-0.9 + 0.95) / 2 = 0.025
    loss, stats = policy_loss(_logp(), OLD, torch.tensor([1.0, -1.0]), MASK,
                              PolicyLoss(0.2, 0.2, "token", "seq_mean_token_mean"))
    assert loss.item() == pytest.approx(0.025, abs=1e-6)
    # clipped: the 1.5 (high, A > 0) and the 0.7 (low, A < 0), each 1 of 5 real tokens
    assert stats["policy/clip_frac_high"].item() == pytest.approx(0.2)
    assert stats["policy/clip_frac_low"].item() == pytest.approx(0.2)
    # (1.5+.5+1+1.1+.7)/5
    assert stats["policy/ratio_mean"].item() == pytest.approx(4.8 / 5, abs=1e-6)
    assert stats["policy/ratio_max"].item() == pytest.approx(1.5)  # the padded 9.0 is not counted


def test_dapo_loss_hand():
    # clip-higher [0.8, 1.28], token mean over the batch
    # seq 0: -[min(1.5, 1.28), .5, 1.0] = -[1.28, .5, 1] (sum -2.78); seq 1: [1.1, .8] (sum 1.9)
    # (-2.78 + 1.9) / 5 tokens = -0.176
    loss, stats = policy_loss(_logp(), OLD, torch.tensor([1.0, -1.0]), MASK,
                              PolicyLoss(0.2, 0.28, "token", "token_mean"))
    assert loss.item() == pytest.approx(-0.176, abs=1e-6)
    assert stats["policy/clip_frac_high"].item() == pytest.approx(0.2)  # 1.5 > 1.28


def test_dr_grpo_loss_hand():
    # rewards [1, 0], one group of 2, no std scaling -> A = [0.5, -0.5]
    adv = GroupAdvantage("none")(torch.tensor([1.0, 0.0]), 2)
    assert adv.tolist() == [0.5, -0.5]
    # seq 0: -[min(.75, .6), min(.25, .4), .5] = -[.6, .25, .5] (sum -1.35)
    # seq 1: -[min(-.55, -.55), min(-.35, -.4)] = [.55, .4] (sum .95)
    # (-1.35 + .95) / (N=2 * max_len=4) = -0.05
    loss, _ = policy_loss(_logp(), OLD, adv, MASK,
                          PolicyLoss(0.2, 0.2, "token", "seq_mean_token_sum_norm", 4))
    assert loss.item() == pytest.approx(-0.05, abs=1e-6)


def test_gspo_loss_and_gradient_hand():
    # s_0 = (1.5 * .5 * 1)^(1/3) = .75^(1/3) = 0.908560; s_1 = (1.1 * .7)^(1/2) = 0.877496
    # clip [1 - 3e-4, 1 + 4e-4] = [.9997, 1.0004]
    # seq 0, A=+1: min(.908560, .9997) = .908560 (unclipped);
    # seq 1, A=-1: min(-.877496, -.9997) = -.9997
    # loss = mean(-.908560, .9997) = 0.0455699
    logp = _logp()
    s0 = 0.75 ** (1 / 3)
    loss, stats = policy_loss(logp, OLD, torch.tensor([1.0, -1.0]), MASK,
                              PolicyLoss(3e-4, 4e-4, "sequence", "seq_mean_token_mean"))
    assert loss.item() == pytest.approx((0.9997 - s0) / 2, abs=1e-6)
    assert stats["policy/clip_frac_low"].item() == pytest.approx(0.4)  # seq 1's 2 of 5 real tokens
    assert stats["policy/clip_frac_high"].item() == 0.0
    # d loss / d logp_0t = -(1/2) * A_0 * s_0 * (1/3) = -s_0 / 6 = -0.151427 on each real token;
    # seq 1 is clipped: 0; padding: 0
    loss.backward()
    want = torch.tensor([[-s0 / 6] * 3, [0.0, 0.0, 0.0]])
    assert torch.allclose(logp.grad, want, atol=1e-6)


def test_token_loss_gradient_zero_where_clipped():
    # GRPO example above: loss = (1/2) * sum_i (1/|y_i|) sum_t -min(...)
    # seq 0 (A=+1): 1.5 clipped -> 0; r=.5: -(1/6) * .5 = -0.083333; r=1: -1/6
    # seq 1 (A=-1): r=1.1: +(1/4) * 1.1 = 0.275; 0.7 clipped -> 0; padding -> 0
    logp = _logp()
    loss, _ = policy_loss(logp, OLD, torch.tensor([1.0, -1.0]), MASK, PolicyLoss(0.2, 0.2))
    loss.backward()
    want = torch.tensor([[0.0, -0.5 / 6, -1 / 6], [0.275, 0.0, 0.0]])
    assert torch.allclose(logp.grad, want, atol=1e-6)


def test_ratio_is_against_old_logp_on_policy_gives_vanilla_gradient():
    # logp == old_logp (one update per rollout): ratio 1, nothing clipped, loss = -mean(A),
    # gradient -A_i / (N * |y_i|): no reference model anywhere in the loss
    logp = OLD.clone().requires_grad_(True)
    adv = torch.tensor([2.0, -1.0])
    loss, stats = policy_loss(logp, OLD, adv, MASK, PolicyLoss())
    assert loss.item() == pytest.approx(-(2.0 - 1.0) / 2)
    assert stats["policy/ratio_mean"].item() == 1.0 and stats["policy/clip_frac_low"].item() == 0.0
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-1 / 3] * 3, [0.25, 0.25, 0.0]]))


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_without_old_logprobs_the_loss_is_that_of_the_logits_own(level):
    """old_logp=None (the sampling policy, before any step): the ratio is exactly 1, and
    loss, metrics and gradient are those of the logits' own detached log-probs as old."""
    logits = torch.randn(2, 3, 7, generator=torch.Generator().manual_seed(1))
    ids, adv = torch.tensor([[1, 2, 3], [4, 5, 6]]), torch.tensor([1.0, -1.0])
    grads, results = [], []
    for old in (None, token_logprobs(logits, ids)):
        x = logits.clone().requires_grad_(True)
        loss, m = compute_loss(x, ids, old, adv, MASK, loss=PolicyLoss(ratio_level=level))
        loss.backward()
        grads.append(x.grad)
        results.append((float(loss.detach()), {k: float(v) for k, v in m.items()}))
    assert results[0] == results[1] and torch.equal(grads[0], grads[1])
    assert results[0][1]["policy/ratio_max"] == 1.0


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_entropy_metric_is_nats_per_token_under_every_aggregation(agg):
    """policy/entropy is the token mean of the entropy whatever the loss divides by (Dr.
    GRPO's max_len would shrink it by mean length / max_len)."""
    logits = torch.randn(2, 3, 7, generator=torch.Generator().manual_seed(2))
    ids, adv = torch.tensor([[1, 2, 3], [4, 5, 6]]), torch.tensor([1.0, -1.0])
    _, m = compute_loss(logits, ids, None, adv, MASK,
                        loss=PolicyLoss(0.2, 0.2, "token", agg, 40))
    ent = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)
    assert float(m["policy/entropy"]) == pytest.approx(float((ent * MASK).sum() / MASK.sum()),
                                                        rel=1e-6)


def test_policy_loss_vs_loop_all_variants():
    g = torch.Generator().manual_seed(7)
    N, T = 6, 5
    old = -torch.rand(N, T, generator=g) * 2
    logp = old + (torch.rand(N, T, generator=g) - 0.5) * 0.8
    adv = torch.randn(N, generator=g)
    lens = [5, 1, 3, 4, 2, 5]
    mask = torch.tensor([[1] * n + [0] * (T - n) for n in lens])
    variants = [(0.2, 0.2, "token", "seq_mean_token_mean", "seq"),
                (0.2, 0.28, "token", "token_mean", "tok"),
                (0.2, 0.2, "token", "seq_mean_token_sum_norm", "const"),
                (0.05, 0.06, "sequence", "seq_mean_token_mean", "seq")]
    for lo, hi, level, agg, kind in variants:
        terms = []
        for i, n in enumerate(lens):
            lr = [logp[i, t].item() - old[i, t].item() for t in range(n)]
            ratios = ([math.exp(sum(lr) / n)] * n if level == "sequence"
                      else [math.exp(x) for x in lr])
            terms.append([-min(r * adv[i].item(), min(max(r, 1 - lo), 1 + hi) * adv[i].item())
                          for r in ratios])
        if kind == "seq":
            want = sum(sum(t) / len(t) for t in terms) / N
        elif kind == "tok":
            want = sum(map(sum, terms)) / sum(lens)
        else:
            want = sum(map(sum, terms)) / (N * 8)
        got, _ = policy_loss(logp, old, adv, mask, PolicyLoss(lo, hi, level, agg, 8))
        assert got.item() == pytest.approx(want, abs=1e-5), (level, kind)


def test_policy_loss_exploding_ratio_stays_finite():
    logp = OLD.clone()
    logp[0, 0] = 200.0  # log ratio 201 on a real token: clamped to 20 before exp
    logp[1, 2] = 1e4  # padding
    logp.requires_grad_(True)
    loss, stats = policy_loss(logp, OLD, torch.tensor([-1.0, 1.0]), MASK, PolicyLoss())
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
    assert stats["policy/ratio_max"].item() == pytest.approx(math.exp(20.0), rel=1e-5)


def test_zero_advantage_gives_no_loss_no_gradient_no_clip_count():
    # a zero-variance group: whatever the ratios (0.5 and 1.5 lie outside the clip range),
    # it adds nothing to the loss or the gradient, and is not counted as clipped
    logp = _logp()
    loss, stats = policy_loss(logp, OLD, torch.zeros(2), MASK, PolicyLoss())
    loss.backward()
    assert loss.item() == 0.0 and (logp.grad == 0).all()
    assert stats["policy/clip_frac_low"].item() == 0.0
    assert stats["policy/clip_frac_high"].item() == 0.0


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_nonfinite_padding_leaves_loss_and_gradient_finite(level):
    # garbage log-probs at padded positions must not reach the loss or, through 0 * nan,
    # the gradient (which would then spread to every weight)
    logp = _logp().detach()
    logp[1, 2] = float("nan")
    logp.requires_grad_(True)
    old = OLD.clone()
    old[1, 2] = float("-inf")
    loss, stats = policy_loss(logp, old, torch.tensor([1.0, -1.0]), MASK,
                              PolicyLoss(ratio_level=level))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
    assert all(torch.isfinite(v) for v in stats.values())
    assert logp.grad[1, 2].item() == 0.0


def test_policy_loss_validation():
    for kwargs, key in [({"clip_low": 1.0}, "clip_low"), ({"clip_high": 0.0}, "clip_high"),
                        ({"ratio_level": "seq"}, "ratio_level"), ({"agg_mode": "mean"}, "agg_mode"),
                        ({"agg_mode": "seq_mean_token_sum_norm"}, "max_len")]:
        with pytest.raises(ValueError, match=f"algorithm.loss.{key}"):
            PolicyLoss(**kwargs)


# ---- conf/algorithm ----------------------------------------------------------------------------

def _algorithm(name, max_new_tokens=16):
    root = OmegaConf.create({"sampler": {"max_new_tokens": max_new_tokens},
                             "algorithm": OmegaConf.load(CONF / "algorithm" / f"{name}.yaml")})
    return root.algorithm


@pytest.mark.parametrize("name, scale, clip, level, agg", [
    ("grpo", "group", (0.2, 0.2), "token", "seq_mean_token_mean"),
    ("dapo", "group", (0.2, 0.28), "token", "token_mean"),
    ("dr_grpo", "none", (0.2, 0.2), "token", "seq_mean_token_sum_norm"),
    ("gspo", "group", (3e-4, 4e-4), "sequence", "seq_mean_token_mean"),
])
def test_algorithm_yaml_instantiates(name, scale, clip, level, agg):
    a = instantiate(_algorithm(name), _execution_whitelist_=["rookworld.*"])
    assert isinstance(a, Algorithm) and isinstance(a.advantage, GroupAdvantage)
    assert a.advantage.scale == scale
    assert isinstance(a.loss, PolicyLoss) and (a.loss.clip_low, a.loss.clip_high) == clip
    assert (a.loss.ratio_level, a.loss.agg_mode) == (level, agg)
    if agg == "seq_mean_token_sum_norm":
        assert a.loss.max_len == 16
        assert aggregate(X, M, agg, 16).item() == pytest.approx(
            X.masked_fill(M == 0, 0).sum().item() / (2 * 16))


