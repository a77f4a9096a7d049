"""Growing a model deeper keeps its function: the embedded-baseline experiment's grow.py."""

import pytest
import torch


@pytest.fixture(scope="module")
def grow(experiment_script):
    return experiment_script("embedded_baseline/grow.py").grow


def test_grown_model_gives_the_same_logits_and_survives_a_save(grow, tmp_path):
    from rookworld.policy import build_random, load_pretrained, save_policy
    policy = build_random(n_layer=2, n_embd=32, n_head=2, n_positions=64)
    with torch.no_grad():  # nonzero biases, so a block that were not zeroed would show
        for name, p in policy.model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.1)
    grown = grow(policy, 4)
    assert grown.model.config.n_layer == 4 and len(grown.model.transformer.h) == 4
    assert policy.model.config.n_layer == 2  # the source is left as it was
    ids = torch.tensor([policy.encode_prompt("P: 4k3/8/8/8/8/8/8/4K3 b - - 3 9 ")])
    want = policy.model(ids).logits
    torch.testing.assert_close(grown.model(ids).logits, want, rtol=0, atol=1e-6)
    save_policy(grown, tmp_path / "grown")
    loaded = load_pretrained(str(tmp_path / "grown"))
    assert loaded.model.config.n_layer == 4
    torch.testing.assert_close(loaded.model(ids).logits, want, rtol=0, atol=1e-6)
    # the new blocks train: their projections are zero, not frozen or missing
    assert grown.model.transformer.h[3].mlp.c_proj.weight.abs().sum() == 0
    assert grown.model.transformer.h[3].mlp.c_fc.weight.abs().sum() > 0


def test_growing_to_fewer_blocks_is_refused(grow):
    from rookworld.policy import build_random
    with pytest.raises(ValueError, match="below"):
        grow(build_random(n_layer=2, n_embd=32, n_head=2, n_positions=64), 1)
