"""rookworld.grpo's estimators: token log-probs, entropy, the KL estimators (k1, k2, k3 and
the full-vocabulary ones) and the masked aggregators, by hand and against loops and torch."""

import math

import pytest
import torch

from rookworld.grpo import (
    AGG_MODES,
    KL_ESTIMATORS,
    aggregate,
    chunk_weight,
    entropy_from_logits,
    kl_full,
    kl_k1,
    kl_k2,
    kl_k3,
    masked_kl,
    rows_in_batch,
    seq_mean_token_mean,
    seq_mean_token_sum_norm,
    token_logprobs,
    token_mean,
)

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
        assert (logpi.exp() * k(logpi, logref)).sum().item() == pytest.approx(exact.item(),
                                                                              abs=1e-6)
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
    # 17 / (N=2 * max_len=4) = 2.125
    assert seq_mean_token_sum_norm(X, M, 4).item() == pytest.approx(17 / 8)


def test_aggregators_ignore_nonfinite_padding():
    x = X.clone()
    x[0, 3], x[1, 2] = float("inf"), float("nan")
    for agg in (token_mean, seq_mean_token_mean, lambda x, m: seq_mean_token_sum_norm(x, m, 4)):
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
    seq_means = [sum(x[i, :n].tolist()) / n for i, n in enumerate(lens) if n]
    assert token_mean(x, mask).item() == pytest.approx(sum(tokens) / len(tokens), abs=1e-6)
    # the row with no real token is not in the batch: 5 sequences
    assert seq_mean_token_mean(x, mask).item() == pytest.approx(sum(seq_means) / 5, abs=1e-6)
    assert seq_mean_token_sum_norm(x, mask, 10).item() == pytest.approx(sum(tokens) / 50, abs=1e-6)


@pytest.mark.parametrize("agg", AGG_MODES)
def test_a_dropped_group_leaves_the_batch_under_every_agg_mode(agg):
    """Rows masked out whole (zero_variance=drop) change no aggregate: the loss over the
    batch with them equals the loss over the kept rows alone, and chunk weights over any
    split of the rows still sum the chunks' aggregates to the whole batch's."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(8, 6, generator=g)
    lens = torch.tensor([6, 2, 4, 1, 5, 3, 6, 2])
    mask = (torch.arange(6)[None, :] < lens[:, None]).float()
    dropped = mask.clone()
    dropped[2:4] = 0.0  # one group of two rows dropped
    kept = torch.tensor([0, 1, 4, 5, 6, 7])
    whole = aggregate(x, dropped, agg, 6)
    assert whole.item() == pytest.approx(aggregate(x[kept], mask[kept], agg, 6).item(),
                                         abs=1e-6)
    for cuts in ([0, 3, 8], [0, 2, 4, 8], [0, 4, 8]):
        total = sum(chunk_weight(agg, dropped[a:b], float(dropped.sum()),
                                 rows_in_batch(dropped))
                    * aggregate(x[a:b], dropped[a:b], agg, 6).item()
                    for a, b in zip(cuts, cuts[1:]))
        assert total == pytest.approx(whole.item(), abs=1e-6)


def test_constant_norm_rejects_bad_max_len():
    from rookworld.grpo import PolicyLoss

    with pytest.raises(ValueError, match="max_len"):
        PolicyLoss(agg_mode="seq_mean_token_sum_norm", max_len=0)
