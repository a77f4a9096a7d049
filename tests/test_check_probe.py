"""The check probe's parts: its residual stream is the model's own, its scores are right on
known inputs, and its probe separates what is separable."""

import pytest
import torch


@pytest.fixture(scope="module")
def probe(experiment_script):
    return experiment_script("embedded_baseline/check_probe.py")


def test_last_residual_gives_the_models_own_next_token_logits(probe):
    from rookworld.policy import build_random
    policy = build_random(n_layer=2, n_embd=32, n_head=2, n_positions=64)
    prompts = ["P: 8/8/8/8/8/8/8/K6k w - - 0 1 ", "P: 4k3/8/8/8/8/8/8/4K3 b - - 3 9 "]
    ids = [policy.encode_prompt(p) for p in prompts]
    states = probe.residuals(policy.model, ids)
    assert states.shape == (2, 3, 32)
    model = policy.model
    for row, state in zip(ids, states):
        want = model(torch.tensor([row])).logits[0, -1]
        got = model.lm_head(model.transformer.ln_f(state[-1]))
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_auc_and_balanced_accuracy_on_known_scores(probe):
    y = torch.tensor([1.0, 1.0, 0.0, 0.0])
    assert probe.auc(torch.tensor([2.0, 1.0, -1.0, -2.0]), y) == 1.0
    assert probe.auc(torch.tensor([-2.0, -1.0, 1.0, 2.0]), y) == 0.0
    assert probe.auc(torch.zeros(4), y) == 0.5
    assert probe.balanced_accuracy(torch.tensor([1.0, -1.0, -1.0, -1.0]), y) == 0.75


def test_probe_separates_a_linear_label_and_not_noise(probe):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(400, 8, generator=gen)
    y = (x[:, 3] > 1.0).float()  # imbalanced, as being in check is
    score = probe.fit(x[:300], y[:300])(x[300:])[:, 0].detach()
    assert probe.auc(score, y[300:]) > 0.95
    noise = torch.randint(0, 2, (400,), generator=gen).float()
    score = probe.fit(x[:300], noise[:300])(x[300:])[:, 0].detach()
    assert abs(probe.auc(score, noise[300:]) - 0.5) < 0.15
