"""The cached sampler agrees with transformers and with the teacher-forced forward."""

import pytest
import torch
from reference_forward import plain_completion_logits

from rookworld.backends.fast_gpt2.decode import sample
from rookworld.gpt2 import positions_from_mask
from rookworld.policy import build_random
from rookworld.sampling import SamplingSettings, filter_logits, left_pad


@pytest.fixture(scope="module")
def policy():
    return build_random(n_layer=2, n_embd=64, n_head=2, n_positions=128, seed=1)


def prompts(policy):
    return [policy.encode_prompt(t) for t in ("P: abc ", "A: a longer prompt here+", "P: x ")]


def test_left_pad_and_positions():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert positions_from_mask(mask).tolist() == [[0, 1, 2], [0, 0, 0]]


def test_left_pad_to_a_multiple_of_a_width():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0, multiple=4)
    assert ids.tolist() == [[0, 5, 6, 7], [0, 0, 0, 8]]
    assert mask.tolist() == [[0, 1, 1, 1], [0, 0, 0, 1]]
    assert left_pad([[5] * 8], pad_id=0, multiple=4)[0].shape == (1, 8)  # already a multiple


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_padding_prompts_to_a_multiple_leaves_samples_unchanged(policy, temperature):
    """pad_to_multiple_of only widens the masked padding: the same seed samples the same
    tokens with the same log-probs, and the batch is as wide as the setting says."""
    ps, out = prompts(policy) * 2, {}
    for multiple in (1, 8, 16):
        s = SamplingSettings(temperature=temperature, max_new_tokens=12,
                             pad_to_multiple_of=multiple)
        out[multiple] = sample(policy.model, ps, s, policy.eos_id, torch.Generator().manual_seed(4))
        assert out[multiple].prompt_ids.shape[1] % multiple == 0
    longest = max(len(p) for p in ps)
    assert out[1].prompt_ids.shape[1] == longest < out[16].prompt_ids.shape[1]
    for multiple in (8, 16):
        assert torch.equal(out[multiple].completion_ids, out[1].completion_ids)
        assert torch.equal(out[multiple].completion_mask, out[1].completion_mask)
        torch.testing.assert_close(out[multiple].logprobs, out[1].logprobs, atol=1e-5, rtol=0)


def test_the_position_limit_counts_real_prompt_tokens_not_padding(policy):
    """A prompt that fits the model's positions with max_new_tokens still fits when the
    batch's padding makes it wider than that (positions count real tokens only)."""
    n_pos = policy.model.config.n_positions
    prompt = [1 + i % 90 for i in range(n_pos - 4 - 2)]  # + 4 new tokens: 2 positions spare
    s = SamplingSettings(temperature=0, max_new_tokens=4, pad_to_multiple_of=32)
    r = sample(policy.model, [prompt], s, policy.eos_id)
    assert r.prompt_ids.shape[1] + 4 > n_pos
    with pytest.raises(ValueError, match="positions"):
        sample(policy.model, [prompt + [1, 2, 3]], s, policy.eos_id)


def test_filter_logits_top_k_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(filter_logits(logits, 2, 1.0)).tolist() == [[False, False, True, True]]
    # nucleus 0.7: 0.5 alone is below 0.7, 0.5+0.3 crosses it: keep the first two
    assert torch.isinf(filter_logits(logits, 0, 0.7)).tolist() == [[False, False, True, True]]


def test_greedy_matches_transformers_generate(policy):
    model = policy.model.to_transformers()  # transformers' class, the same weights
    for p in prompts(policy):
        r = sample(policy.model, [p], SamplingSettings(temperature=0, max_new_tokens=12),
                   policy.eos_id)
        hf = model.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False,
                                   pad_token_id=policy.eos_id)
        width = r.completion_ids.shape[1]
        assert r.completion_ids[0].tolist() == hf[0, len(p):len(p) + width].tolist()


def test_batched_left_padded_greedy_equals_one_by_one(policy):
    ps = prompts(policy)
    s = SamplingSettings(temperature=0, max_new_tokens=10)
    batch = sample(policy.model, ps, s, policy.eos_id)
    for i, p in enumerate(ps):
        one = sample(policy.model, [p], s, policy.eos_id)
        n = int(one.completion_mask.sum())
        assert batch.completion_ids[i, :n].tolist() == one.completion_ids[0, :n].tolist()
        assert torch.allclose(batch.logprobs[i, :n], one.logprobs[0, :n], atol=1e-5)


def test_sampling_logprobs_equal_teacher_forced_logprobs(policy):
    g = torch.Generator().manual_seed(0)
    s = SamplingSettings(temperature=0.7, top_k=20, max_new_tokens=16)
    r = sample(policy.model, prompts(policy) * 2, s, policy.eos_id, g)
    logits = plain_completion_logits(policy.model, r.prompt_ids, r.prompt_mask,
                                     r.completion_ids, temperature=0.7)
    lp = logits.log_softmax(-1).gather(-1, r.completion_ids[..., None]).squeeze(-1)
    assert torch.allclose(lp * r.completion_mask, r.logprobs, atol=1e-5)


def test_same_seed_same_samples_and_min_new_tokens(policy):
    s = SamplingSettings(temperature=1.0, max_new_tokens=8, min_new_tokens=8)
    a = sample(policy.model, prompts(policy), s, policy.eos_id, torch.Generator().manual_seed(3))
    b = sample(policy.model, prompts(policy), s, policy.eos_id, torch.Generator().manual_seed(3))
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert (a.completion_ids[:, :8] != policy.eos_id).all()  # EOS masked before min_new_tokens
    assert a.completion_mask.sum().item() == 3 * 8


@pytest.mark.parametrize("key,value", [("temperature", -1), ("top_p", 0.0), ("top_p", 1.5),
                                       ("max_new_tokens", 0), ("min_new_tokens", 99),
                                       ("pad_to_multiple_of", 0)])
def test_settings_reject_bad_values_naming_the_key(key, value):
    with pytest.raises(ValueError, match=f"sampler.{key}"):
        SamplingSettings(**{key: value, "max_new_tokens": 10} if key != "max_new_tokens"
                         else {key: value})
