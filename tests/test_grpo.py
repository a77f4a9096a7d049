"""rookworld.grpo: hand-computed values, loop-vs-vectorised checks, each loss variant
against its paper's formula, gradients, and the conf/algorithm YAMLs."""

import math
import statistics
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from rookworld.grpo import (
    KL_ESTIMATORS,
    ConstantNorm,
    GroupAdvantage,
    PolicyLoss,
    entropy_from_logits,
    group_advantages,
    kl_full,
    kl_k1,
    kl_k2,
    kl_k3,
    masked_kl,
    seq_mean_token_mean,
    token_logprobs,
    token_mean,
    zero_variance_groups,
)

CONF = Path(__file__).resolve().parents[1] / "conf"
LN2 = math.log(2.0)


# ---- log-probs, entropy --------------------------------------------------------------------

def test_token_logprobs_hand():
    # logits [0, 0, ln 2] -> softmax [1, 1, 2] / 4 = [0.25, 0.25, 0.5]
    logits = torch.tensor([[[0.0, 0.0, LN2], [0.0, 0.0, LN2]]])
    got = token_logprobs(logits, torch.tensor([[2, 0]]))
    assert torch.allclose(got, torch.tensor([[math.log(0.5), math.log(0.25)]]))


def test_token_logprobs_matches_log_softmax_gather_and_upcasts_bf16():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 11, generator=g) * 3
    ids = torch.randint(0, 11, (2, 3), generator=g)
    ref = torch.log_softmax(logits, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(token_logprobs(logits, ids), ref, atol=1e-6)
    bf = logits.bfloat16()
    got = token_logprobs(bf, ids)
    assert got.dtype == torch.float32
    ref_bf = torch.log_softmax(bf.float(), -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(got, ref_bf, atol=1e-6)


def test_entropy_hand_and_vs_categorical():
    # uniform over 4: ln 4; [0.25, 0.25, 0.5]: -(2 * 0.25 ln 0.25 + 0.5 ln 0.5) = 1.5 ln 2
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, LN2, -1e4]])
    got = entropy_from_logits(logits)
    assert torch.allclose(got, torch.tensor([math.log(4), 1.5 * LN2]), atol=1e-6)
    x = torch.randn(3, 5, 7, generator=torch.Generator().manual_seed(1))
    cat = torch.distributions.Categorical(logits=x).entropy()
    assert torch.allclose(entropy_from_logits(x), cat, atol=1e-5)


# ---- KL estimators ---------------------------------------------------------------------------

def test_kl_estimators_hand():
    # pi(y) = 0.5, ref(y) = 0.25: log r = ln(0.25 / 0.5) = -ln 2
    # k1 = ln 2 = 0.6931; k2 = (ln 2)^2 / 2 = 0.2402; k3 = 0.5 - (-ln 2) - 1 = ln 2 - 0.5 = 0.1931
    logp, ref = torch.tensor([[math.log(0.5)]]), torch.tensor([[math.log(0.25)]])
    assert kl_k1(logp, ref).item() == pytest.approx(LN2)
    assert kl_k2(logp, ref).item() == pytest.approx(LN2**2 / 2)
    assert kl_k3(logp, ref).item() == pytest.approx(LN2 - 0.5)
    assert set(KL_ESTIMATORS) == {"k1", "k2", "k3"}


def test_kl_estimators_vs_per_element_formulas():
    g = torch.Generator().manual_seed(2)
    logp, ref = -torch.rand(3, 4, generator=g) * 3, -torch.rand(3, 4, generator=g) * 3
    k1, k2, k3 = kl_k1(logp, ref), kl_k2(logp, ref), kl_k3(logp, ref)
    for i in range(3):
        for t in range(4):
            a, b = logp[i, t].item(), ref[i, t].item()
            assert k1[i, t].item() == pytest.approx(a - b, abs=1e-6)
            assert k2[i, t].item() == pytest.approx(0.5 * (b - a) ** 2, abs=1e-6)
            assert k3[i, t].item() == pytest.approx(math.exp(b - a) - (b - a) - 1, abs=1e-6)


def test_k1_and_k3_are_unbiased_k3_nonnegative():
    # E_{y~pi}[k(y)] summed exactly over the vocabulary equals KL(pi || ref) for k1 and k3
    g = torch.Generator().manual_seed(3)
    logits, ref_logits = torch.randn(1, 1, 6, generator=g), torch.randn(1, 1, 6, generator=g)
    logpi, logref = torch.log_softmax(logits, -1)[0, 0], torch.log_softmax(ref_logits, -1)[0, 0]
    exact = kl_full(logits, ref_logits)[0, 0]
    for k in (kl_k1, kl_k3):
        assert (logpi.exp() * k(logpi, logref)).sum().item() == pytest.approx(exact.item(), abs=1e-6)
    assert (kl_k3(logpi, logref) >= 0).all()


def test_kl_full_hand_and_vs_torch_distributions():
    # pi = [0.5, 0.5], ref = [0.25, 0.75]: 0.5 ln 2 + 0.5 ln(2/3) = 0.5 ln(4/3) = 0.143841
    got = kl_full(torch.tensor([[[0.0, 0.0]]]), torch.log(torch.tensor([[[0.25, 0.75]]])))
    assert got.item() == pytest.approx(0.5 * math.log(4 / 3), abs=1e-6)
    g = torch.Generator().manual_seed(4)
    a, b = torch.randn(2, 3, 9, generator=g), torch.randn(2, 3, 9, generator=g)
    ref = torch.distributions.kl_divergence(torch.distributions.Categorical(logits=a),
                                            torch.distributions.Categorical(logits=b))
    assert torch.allclose(kl_full(a, b), ref, atol=1e-5)
    assert torch.allclose(kl_full(a, a), torch.zeros(2, 3), atol=1e-6)


def test_kl_full_reverse_and_symmetric_by_hand_and_in_chunks(monkeypatch):
    # reverse: ref = [0.25, 0.75] against pi = [0.5, 0.5]: 0.25 ln 0.5 + 0.75 ln 1.5
    pi, ref = torch.tensor([[[0.0, 0.0]]]), torch.log(torch.tensor([[[0.25, 0.75]]]))
    reverse = 0.25 * math.log(0.5) + 0.75 * math.log(1.5)
    assert kl_full(pi, ref, "reverse").item() == pytest.approx(reverse, abs=1e-6)
    assert kl_full(pi, ref, "symmetric").item() == pytest.approx(
        0.5 * (0.5 * math.log(4 / 3) + reverse), abs=1e-6)
    g = torch.Generator().manual_seed(5)
    a = torch.randn(5, 3, 7, generator=g, requires_grad=True)
    b = torch.randn(5, 3, 7, generator=g)
    whole = {d: kl_full(a, b, d) for d in ("forward", "reverse", "symmetric")}
    torch.testing.assert_close(whole["reverse"], kl_full(b, a))  # KL(ref || pi), swapped
    from rookworld import grpo
    monkeypatch.setattr(grpo, "FULL_CHUNK_ELEMENTS", 2 * 3 * 7)  # chunks of 2 rows
    for d, want in whole.items():
        got = kl_full(a, b, d)
        torch.testing.assert_close(got, want)
        (ga,) = torch.autograd.grad(got.sum(), a)
        (wa,) = torch.autograd.grad(want.sum(), a, retain_graph=True)
        torch.testing.assert_close(ga, wa)
    with pytest.raises(ValueError, match="direction"):
        kl_full(a, b, "sideways")


# ---- aggregators -----------------------------------------------------------------------------

X = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 0.0, 0.0]])
M = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])


def test_aggregators_hand():
    # real tokens: 1, 2, 3 | 5, 6 (the 4 is padding)
    assert token_mean(X, M).item() == pytest.approx(17 / 5)  # (1+2+3+5+6) / 5 = 3.4
    assert seq_mean_token_mean(X, M).item() == pytest.approx(3.75)  # mean(6/3, 11/2) = mean(2, 5.5)
    assert ConstantNorm(4)(X, M).item() == pytest.approx(17 / 8)  # 17 / (N=2 * max_len=4) = 2.125


def test_aggregators_ignore_nonfinite_padding():
    x = X.clone()
    x[0, 3], x[1, 2] = float("inf"), float("nan")
    for agg in (token_mean, seq_mean_token_mean, ConstantNorm(4)):
        assert agg(x, M.bool()).item() == pytest.approx(agg(X, M).item())


@pytest.mark.parametrize("name", ["k1", "k2", "k3"])
def test_kl_gradient_is_finite_when_a_pads_policy_logprob_is_extreme(name):
    # the reference's log-probs are zeroed at pads; the policy's own log-prob at a pad can
    # be far below -88.7, where exp(ref - logp) overflows float32 (k3)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    base = torch.tensor([[-0.5, -1.0, -0.3], [-0.2, -0.7, -1.5]])
    ref = torch.tensor([[-0.4, -1.2, 0.0], [-0.3, -0.6, -1.4]])
    extreme = base.clone()
    extreme[0, 2] = -200.0
    grads = []
    for lp in (base, extreme):
        lp = lp.clone().requires_grad_(True)
        token_mean(masked_kl(name, lp, ref, mask), mask).backward()
        assert torch.isfinite(lp.grad).all()
        grads.append(lp.grad)
    torch.testing.assert_close(grads[0], grads[1])  # the pad's value changes nothing
    assert grads[1][0, 2] == 0.0


def test_unmasked_k3_at_an_extreme_pad_is_what_masked_kl_prevents():
    lp = torch.tensor([[-0.5, -200.0]], requires_grad=True)
    mask = torch.tensor([[1, 0]])
    token_mean(kl_k3(lp, torch.zeros(1, 2)), mask).backward()
    assert not torch.isfinite(lp.grad).all()  # where() drops the value, not its gradient


def test_aggregators_vs_loops():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(6, 7, generator=g)
    lens = [7, 3, 1, 0, 5, 2]
    mask = torch.tensor([[1] * n + [0] * (7 - n) for n in lens]).float()
    tokens = [x[i, t].item() for i, n in enumerate(lens) for t in range(n)]
    seq_means = [sum(x[i, :n].tolist()) / n if n else 0.0 for i, n in enumerate(lens)]
    assert token_mean(x, mask).item() == pytest.approx(sum(tokens) / len(tokens), abs=1e-6)
    assert seq_mean_token_mean(x, mask).item() == pytest.approx(sum(seq_means) / 6, abs=1e-6)
    assert ConstantNorm(10)(x, mask).item() == pytest.approx(sum(tokens) / 60, abs=1e-6)


def test_constant_norm_rejects_bad_max_len():
    with pytest.raises(ValueError, match="max_len"):
        ConstantNorm(0)


# ---- advantages ------------------------------------------------------------------------------

R = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])  # two groups of 4


def test_group_advantages_hand():
    # group 1: mean 0.5, centred [.5, -.5, -.5, .5], unbiased std sqrt(4 * .25 / 3) = 0.57735
    # group 2: all 2 -> 0
    s3 = 0.5 / math.sqrt(1 / 3)  # 0.866025
    want = torch.tensor([s3, -s3, -s3, s3, 0, 0, 0, 0])
    assert torch.allclose(group_advantages(R, 4, "group"), want, atol=1e-6)
    # none (Dr. GRPO): centred only
    assert torch.allclose(group_advantages(R, 4, "none"), torch.tensor([.5, -.5, -.5, .5, 0, 0, 0, 0]))
    # batch: std of all 8 rewards; mean 1.25, sum of squares .0625*2 + 1.5625*2 + .5625*4 = 5.5,
    # unbiased 5.5 / 7, std 0.886405 -> +-0.5 / 0.886405 = +-0.564076
    b = 0.5 / math.sqrt(5.5 / 7)
    assert torch.allclose(group_advantages(R, 4, "batch"), torch.tensor([b, -b, -b, b, 0, 0, 0, 0]), atol=1e-6)
    # clip at 0.5: +-0.866 -> +-0.5
    assert torch.allclose(group_advantages(R, 4, "group", clip=0.5), torch.tensor([.5, -.5, -.5, .5, 0, 0, 0, 0]))


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
            assert group_advantages(r, G, "group")[i + j].item() == pytest.approx((v - mu) / sd, abs=1e-5)
            assert group_advantages(r, G, "batch")[i + j].item() == pytest.approx((v - mu) / batch_std, abs=1e-5)
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
    loss, stats = PolicyLoss(0.2, 0.2, "token", seq_mean_token_mean)(_logp(), OLD, torch.tensor([1.0, -1.0]), MASK)
    assert loss.item() == pytest.approx(0.025, abs=1e-6)
    # clipped: the 1.5 (high, A > 0) and the 0.7 (low, A < 0), each 1 of 5 real tokens
    assert stats["clip_frac_high"].item() == pytest.approx(0.2)
    assert stats["clip_frac_low"].item() == pytest.approx(0.2)
    assert stats["ratio_mean"].item() == pytest.approx(4.8 / 5, abs=1e-6)  # (1.5+.5+1+1.1+.7)/5
    assert stats["ratio_max"].item() == pytest.approx(1.5)  # the padded 9.0 is not counted


def test_dapo_loss_hand():
    # clip-higher [0.8, 1.28], token mean over the batch
    # seq 0: -[min(1.5, 1.28), .5, 1.0] = -[1.28, .5, 1] (sum -2.78); seq 1: [1.1, .8] (sum 1.9)
    # (-2.78 + 1.9) / 5 tokens = -0.176
    loss, stats = PolicyLoss(0.2, 0.28, "token", token_mean)(_logp(), OLD, torch.tensor([1.0, -1.0]), MASK)
    assert loss.item() == pytest.approx(-0.176, abs=1e-6)
    assert stats["clip_frac_high"].item() == pytest.approx(0.2)  # 1.5 > 1.28


def test_dr_grpo_loss_hand():
    # rewards [1, 0], one group of 2, no std scaling -> A = [0.5, -0.5]
    adv = GroupAdvantage("none")(torch.tensor([1.0, 0.0]), 2)
    assert adv.tolist() == [0.5, -0.5]
    # seq 0: -[min(.75, .6), min(.25, .4), .5] = -[.6, .25, .5] (sum -1.35)
    # seq 1: -[min(-.55, -.55), min(-.35, -.4)] = [.55, .4] (sum .95)
    # (-1.35 + .95) / (N=2 * max_len=4) = -0.05
    loss, _ = PolicyLoss(0.2, 0.2, "token", ConstantNorm(4))(_logp(), OLD, adv, MASK)
    assert loss.item() == pytest.approx(-0.05, abs=1e-6)


def test_gspo_loss_and_gradient_hand():
    # s_0 = (1.5 * .5 * 1)^(1/3) = .75^(1/3) = 0.908560; s_1 = (1.1 * .7)^(1/2) = 0.877496
    # clip [1 - 3e-4, 1 + 4e-4] = [.9997, 1.0004]
    # seq 0, A=+1: min(.908560, .9997) = .908560 (unclipped); seq 1, A=-1: min(-.877496, -.9997) = -.9997
    # loss = mean(-.908560, .9997) = 0.0455699
    logp = _logp()
    s0 = 0.75 ** (1 / 3)
    loss, stats = PolicyLoss(3e-4, 4e-4, "sequence", seq_mean_token_mean)(logp, OLD, torch.tensor([1.0, -1.0]), MASK)
    assert loss.item() == pytest.approx((0.9997 - s0) / 2, abs=1e-6)
    assert stats["clip_frac_low"].item() == pytest.approx(0.4)  # seq 1's 2 of 5 real tokens
    assert stats["clip_frac_high"].item() == 0.0
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
    loss, _ = PolicyLoss(0.2, 0.2)(logp, OLD, torch.tensor([1.0, -1.0]), MASK)
    loss.backward()
    want = torch.tensor([[0.0, -0.5 / 6, -1 / 6], [0.275, 0.0, 0.0]])
    assert torch.allclose(logp.grad, want, atol=1e-6)


def test_ratio_is_against_old_logp_on_policy_gives_vanilla_gradient():
    # logp == old_logp (one update per rollout): ratio 1, nothing clipped, loss = -mean(A),
    # gradient -A_i / (N * |y_i|): no reference model anywhere in the loss
    logp = OLD.clone().requires_grad_(True)
    adv = torch.tensor([2.0, -1.0])
    loss, stats = PolicyLoss()(logp, OLD, adv, MASK)
    assert loss.item() == pytest.approx(-(2.0 - 1.0) / 2)
    assert stats["ratio_mean"].item() == 1.0 and stats["clip_frac_low"].item() == 0.0
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-1 / 3] * 3, [0.25, 0.25, 0.0]]))


def test_policy_loss_vs_loop_all_variants():
    g = torch.Generator().manual_seed(7)
    N, T = 6, 5
    old = -torch.rand(N, T, generator=g) * 2
    logp = old + (torch.rand(N, T, generator=g) - 0.5) * 0.8
    adv = torch.randn(N, generator=g)
    lens = [5, 1, 3, 4, 2, 5]
    mask = torch.tensor([[1] * n + [0] * (T - n) for n in lens])
    variants = [(0.2, 0.2, "token", seq_mean_token_mean, "seq"), (0.2, 0.28, "token", token_mean, "tok"),
                (0.2, 0.2, "token", ConstantNorm(8), "const"), (0.05, 0.06, "sequence", seq_mean_token_mean, "seq")]
    for lo, hi, level, agg, kind in variants:
        terms = []
        for i, n in enumerate(lens):
            lr = [logp[i, t].item() - old[i, t].item() for t in range(n)]
            ratios = [math.exp(sum(lr) / n)] * n if level == "sequence" else [math.exp(x) for x in lr]
            terms.append([-min(r * adv[i].item(), min(max(r, 1 - lo), 1 + hi) * adv[i].item()) for r in ratios])
        if kind == "seq":
            want = sum(sum(t) / len(t) for t in terms) / N
        elif kind == "tok":
            want = sum(map(sum, terms)) / sum(lens)
        else:
            want = sum(map(sum, terms)) / (N * 8)
        got, _ = PolicyLoss(lo, hi, level, agg)(logp, old, adv, mask)
        assert got.item() == pytest.approx(want, abs=1e-5), (level, kind)


def test_policy_loss_exploding_ratio_stays_finite():
    logp = OLD.clone()
    logp[0, 0] = 200.0  # log ratio 201 on a real token: clamped to 20 before exp
    logp[1, 2] = 1e4  # padding
    logp.requires_grad_(True)
    loss, stats = PolicyLoss()(logp, OLD, torch.tensor([-1.0, 1.0]), MASK)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
    assert stats["ratio_max"].item() == pytest.approx(math.exp(20.0), rel=1e-5)


def test_zero_advantage_gives_no_loss_no_gradient_no_clip_count():
    # a zero-variance group: whatever the ratios (0.5 and 1.5 lie outside the clip range),
    # it adds nothing to the loss or the gradient, and is not counted as clipped
    logp = _logp()
    loss, stats = PolicyLoss()(logp, OLD, torch.zeros(2), MASK)
    loss.backward()
    assert loss.item() == 0.0 and (logp.grad == 0).all()
    assert stats["clip_frac_low"].item() == 0.0 and stats["clip_frac_high"].item() == 0.0


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_nonfinite_padding_leaves_loss_and_gradient_finite(level):
    # garbage log-probs at padded positions must not reach the loss or, through 0 * nan,
    # the gradient (which would then spread to every weight)
    logp = _logp().detach()
    logp[1, 2] = float("nan")
    logp.requires_grad_(True)
    old = OLD.clone()
    old[1, 2] = float("-inf")
    loss, stats = PolicyLoss(ratio_level=level)(logp, old, torch.tensor([1.0, -1.0]), MASK)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
    assert all(torch.isfinite(v) for v in stats.values())
    assert logp.grad[1, 2].item() == 0.0


def test_policy_loss_validation():
    for kwargs, key in [({"clip_low": 1.0}, "clip_low"), ({"clip_high": 0.0}, "clip_high"),
                        ({"ratio_level": "seq"}, "ratio_level"), ({"aggregate": "mean"}, "aggregate")]:
        with pytest.raises(ValueError, match=f"algorithm.loss.{key}"):
            PolicyLoss(**kwargs)


# ---- conf/algorithm ----------------------------------------------------------------------------

def _algorithm(name, max_new_tokens=16):
    root = OmegaConf.create({"sampler": {"max_new_tokens": max_new_tokens},
                             "algorithm": OmegaConf.load(CONF / "algorithm" / f"{name}.yaml")})
    return root.algorithm


@pytest.mark.parametrize("name, scale, clip, level, agg", [
    ("grpo", "group", (0.2, 0.2), "token", seq_mean_token_mean),
    ("dapo", "group", (0.2, 0.28), "token", token_mean),
    ("dr_grpo", "none", (0.2, 0.2), "token", ConstantNorm),
    ("gspo", "group", (3e-4, 4e-4), "sequence", seq_mean_token_mean),
])
def test_algorithm_yaml_instantiates(name, scale, clip, level, agg):
    cfg = _algorithm(name)
    adv = instantiate(cfg.advantage, _execution_whitelist_=["rookworld.*"])
    loss = instantiate(cfg.loss, _execution_whitelist_=["rookworld.*"])
    assert isinstance(adv, GroupAdvantage) and adv.scale == scale
    assert isinstance(loss, PolicyLoss) and (loss.clip_low, loss.clip_high) == clip
    assert loss.ratio_level == level
    if agg is ConstantNorm:
        assert isinstance(loss.aggregate, ConstantNorm) and loss.aggregate.max_len == 16
    else:
        assert loss.aggregate.func is agg
        assert loss.aggregate(X, M).item() == pytest.approx(agg(X, M).item())


