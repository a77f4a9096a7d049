"""The rollout's kept forward (`tape.Tape`) gives the update what a second, teacher-forced
forward would: the same final hidden states and the same parameter gradients."""

import pytest
import torch

from rookworld.backends.fast_gpt2.blocks import final_norm, lm_head
from rookworld.backends.fast_gpt2.decode import sample
from rookworld.backends.fast_gpt2.forward import CompletionLogits
from rookworld.backends.fast_gpt2.tape import Tape, backward_with
from rookworld.policy import build_random
from rookworld.sampling import SamplingSettings

pytestmark = pytest.mark.usefixtures("cpu_matmul")  # each CPU matrix library (conftest)


def _prompts(g: int) -> list[list[int]]:
    """Three distinct prompts of different lengths (left padding), one repeated."""
    base = [[5, 9, 11, 3, 7], [8, 2], [4, 4, 6, 1], [5, 9, 11, 3, 7]]
    return [p for p in base for _ in range(g)]


def _loss_terms(model, logits, ids, mask):
    """A loss touching every completion token's log-prob and the whole distribution."""
    logp = logits.log_softmax(-1)
    picked = logp.gather(-1, ids[..., None]).squeeze(-1)
    w = torch.linspace(0.5, 1.5, ids.shape[1])
    return -((picked * w) * mask).sum() + 0.1 * (logp.exp() * logp).sum(-1).mul(mask).sum()


@pytest.mark.parametrize("g, settings", [
    (4, SamplingSettings(temperature=1.0, max_new_tokens=9)),
    (1, SamplingSettings(temperature=1.0, max_new_tokens=6, top_k=5)),
    (3, SamplingSettings(temperature=1.0, max_new_tokens=1)),
])
def test_tape_gradients_equal_the_teacher_forced_backward(g, settings):
    model = build_random(n_layer=2, n_embd=32, n_head=4, n_positions=64, seed=1).model.eval()
    gen = torch.Generator().manual_seed(0)
    r = sample(model, _prompts(g), settings, eos_id=0, generator=gen, tape_budget=1 << 30)
    (rows, tape), = r.tapes
    assert tape.steps == r.completion_ids.shape[1] - 1
    ids, mask = r.completion_ids, r.completion_mask.float()

    model.zero_grad(set_to_none=True)
    logits = CompletionLogits(model)(r.prompt_ids, r.prompt_mask, ids)
    _loss_terms(model, logits, ids, mask).backward()
    want = {k: p.grad.clone() for k, p in model.named_parameters()}

    model.zero_grad(set_to_none=True)
    final = tape.final()
    halves = [rows[: len(rows) // 2], rows[len(rows) // 2:]]  # micro-batches of rows
    got_logits = []
    for part in halves:
        lg = lm_head(model, final_norm(model, tape.hidden(final, part))).float()
        got_logits.append(lg.detach())
        _loss_terms(model, lg, ids[part], mask[part]).backward()
    tape.backward(model, final.grad)
    torch.testing.assert_close(torch.cat(got_logits), logits.detach(), rtol=1e-4, atol=1e-4)
    for k, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[k], rtol=1e-3, atol=1e-4, msg=k)


def test_tape_kept_only_within_its_budget():
    model = build_random(n_layer=2, n_embd=32, n_head=4, n_positions=64, seed=1).model.eval()
    s = SamplingSettings(max_new_tokens=5, pad_to_multiple_of=8)
    # 3 distinct prompts (of up to 5 tokens, padded to 8) of 16 rows are not blocks of
    # equal prompts: 16 groups of one
    need = Tape.size(model.config, 3, 8, 16, 4, 16)
    gen = torch.Generator().manual_seed(0)
    (_, tape), = sample(model, _prompts(4), s, 0, gen, tape_budget=need).tapes
    assert tape.nbytes == need  # the budget check counts what the tape and its cache hold
    assert not sample(model, _prompts(4), s, 0, gen, tape_budget=need - 1).tapes
    assert not sample(model, _prompts(4), s, 0, gen).tapes


def test_tape_leaves_samples_unchanged():
    """Keeping the forward samples the same tokens with the same log-probs."""
    model = build_random(n_layer=2, n_embd=32, n_head=4, n_positions=64, seed=2).model.eval()
    s = SamplingSettings(max_new_tokens=12)
    a = sample(model, _prompts(4), s, 0, torch.Generator().manual_seed(5))
    b = sample(model, _prompts(4), s, 0, torch.Generator().manual_seed(5), tape_budget=1 << 30)
    assert torch.equal(a.completion_ids, b.completion_ids)
    torch.testing.assert_close(a.logprobs, b.logprobs)


def test_backward_with_gives_backwards_gradients_to_the_bit():
    torch.manual_seed(0)
    w = torch.randn(64, 64, requires_grad=True)
    x, g = torch.randn(32, 64), torch.randn(32, 64)
    (x @ w).tanh().backward(g)
    want, w.grad = w.grad, None
    backward_with((x @ w).tanh(), g)
    assert torch.equal(w.grad, want)
    with pytest.raises(ValueError, match="gradient of shape"):
        backward_with((x @ w).tanh(), g[0])  # backward refuses it too; broadcast would not
