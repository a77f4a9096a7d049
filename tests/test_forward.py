"""The fast GPT-2 forward (prompt run once per group) equals the transformers forward:
logits, gradients, chunked log-probs; the sampler's grouped cache equals one row at a time."""

import pytest
import torch
from reference_forward import plain_completion_logits

from rookworld.backends.fast_gpt2 import attention, gelu, matmul, native
from rookworld.backends.fast_gpt2.attention import group_order, unique_prompts
from rookworld.backends.fast_gpt2.decode import sample
from rookworld.backends.fast_gpt2.forward import CompletionLogits, completion_logprobs
from rookworld.backends.logprobs import logprob_chunk_rows
from rookworld.policy import build_random
from rookworld.sampling import SamplingSettings, left_pad


@pytest.fixture(scope="module")
def policy():
    return build_random(n_layer=2, n_embd=64, n_head=4, n_positions=128, seed=3)


@pytest.fixture(scope="module")
def hf(policy):
    """transformers' GPT2LMHeadModel with the policy's weights: the independent reference."""
    return policy.model.to_transformers()


pytestmark = pytest.mark.usefixtures("cpu_matmul")  # each CPU matrix library (conftest)


@pytest.mark.parametrize("value, vendor, want", [
    ("auto", "GenuineIntel", "blas"), ("auto", "AuthenticAMD", "mkl"), ("auto", "", "mkl"),
    ("BLAS", "AuthenticAMD", "blas"), ("onednn", "GenuineIntel", "onednn"),
    ("mkl", "AuthenticAMD", "mkl")])
def test_cpu_matmul_choice_is_fixed_per_machine(monkeypatch, value, vendor, want):
    monkeypatch.setattr(matmul, "cpu_vendor", lambda: vendor)
    assert matmul.resolve_cpu_matmul(value) == (want if matmul.ONEDNN else "blas")


def test_cpu_matmul_rejects_unknown_values():
    with pytest.raises(ValueError, match="cpu_matmul .* must be one of auto, onednn, blas, "
                                         "mkl, got 'openblas'"):
        matmul.resolve_cpu_matmul("openblas")


def batch(policy, texts, g, t=9, seed=0):
    """Prompts repeated g times in blocks (a GRPO batch), random completions [N,t]."""
    ids, mask = left_pad([policy.encode_prompt(x) for x in texts for _ in range(g)], 0)
    comp = torch.randint(1, 96, (ids.shape[0], t), generator=torch.Generator().manual_seed(seed))
    return ids, mask, comp


@pytest.mark.parametrize("size", [4001, 100_003])  # odd tails; one thread, then several
@pytest.mark.parametrize("kernel", ["native", "torch"])
def test_sigmoid_form_gelu_is_gpt2s_tanh_gelu(kernel, size, monkeypatch):
    """gelu.Gelu and gelu_tanh (the sigmoid form on CPU; through the native kernels
    where they run, and through torch's operations) equal torch's tanh GELU, values and
    gradients, across the range where the gate saturates; Gelu passes gradcheck;
    gelu_tanh works in place without gradients and through Gelu with them."""
    if kernel == "torch":
        monkeypatch.setattr(native, "gelu_kernels", lambda: None)
    elif native.gelu_kernels() is None:
        pytest.skip("the native kernels do not run here (tests/test_native.py says why)")
    a64 = torch.linspace(-12, 12, size, dtype=torch.float64).requires_grad_()
    gy = torch.randn(size, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    torch.nn.functional.gelu(a64, approximate="tanh").backward(gy)
    a = a64.detach().float().requires_grad_()
    y = gelu.Gelu.apply(a)
    y.backward(gy.float())
    assert torch.allclose(y.double(), torch.nn.functional.gelu(a64.detach(), approximate="tanh"),
                          rtol=1e-6, atol=1e-6)
    assert torch.allclose(a.grad.double(), a64.grad, rtol=1e-5, atol=1e-5)
    inplace = a.detach().clone()
    with torch.no_grad():
        assert gelu.gelu_tanh(inplace) is inplace and torch.equal(inplace, y.detach())
    a2 = a.detach().clone().requires_grad_()
    y2 = gelu.gelu_tanh(a2)
    assert type(y2.grad_fn).__name__ == "GeluBackward" and torch.equal(y2, y)
    x = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(gelu.Gelu.apply, (x * 3,))


def test_unique_prompts_and_group_order():
    ids, mask = left_pad([[5, 6], [7], [5, 6], [7], [0, 7]], pad_id=0)
    u_ids, u_mask, index = unique_prompts(ids, mask)
    assert u_ids.shape[0] == 3  # [0,7] with mask [1,1] differs from [7] padded with 0
    assert torch.equal(u_ids[index], ids) and torch.equal(u_mask[index], mask)
    blocks = torch.tensor([2, 2, 0, 0, 1, 1])
    assert group_order(blocks, 3)[0].tolist() == [2, 0, 1] and group_order(blocks, 3)[1] == 2
    for irregular in ([0, 1, 0], [0, 1, 1, 0]):  # every row its own block, in row order
        order, g = group_order(torch.tensor(irregular), 2)
        assert g == 1 and order.tolist() == irregular


def test_fast_logits_equal_transformers(policy, hf):
    ids, mask, comp = batch(policy, ["P: abc ", "A: a much longer prompt+", "P: q "], g=3)
    fast = CompletionLogits(policy.model)(ids, mask, comp)
    ref = plain_completion_logits(hf, ids, mask, comp)
    assert fast.shape == ref.shape == (9, 9, 96)
    assert torch.allclose(fast, ref, atol=2e-5)
    # the model's own plain forward (pretraining) too
    plain = plain_completion_logits(policy.model, ids, mask, comp)
    assert torch.allclose(plain, ref, atol=2e-5)


@pytest.mark.parametrize("recompute", [True, False])
def test_fast_gradients_equal_transformers(policy, hf, recompute):
    """With the layer norms and GELUs recomputed in backward and without; transformers'
    model holds the same weights under the same names."""
    ids, mask, comp = batch(policy, ["P: abc ", "A: longer prompt here+"], g=4)
    w = torch.randn(8, comp.shape[1], 96, generator=torch.Generator().manual_seed(1))
    grads = []
    for model, fn in ((policy.model, lambda: CompletionLogits(policy.model, recompute)(
            ids, mask, comp)), (hf, lambda: plain_completion_logits(hf, ids, mask, comp))):
        model.zero_grad()
        (fn() * w).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for name, g in grads[0].items():
        assert torch.allclose(g, grads[1][name], atol=1e-4, rtol=1e-4), name


def test_every_row_as_its_own_prompt_gives_the_same_logits(policy, monkeypatch):
    """The benchmarks' switch (ROOKWORLD_SHARE_PROMPTS=0) changes the work, not the maths."""
    ids, mask, comp = batch(policy, ["P: abc ", "A: a much longer prompt+"], g=3)
    shared = CompletionLogits(policy.model)(ids, mask, comp)
    monkeypatch.setattr(attention, "SHARE_PROMPTS", False)
    assert len(attention.unique_prompts(ids, mask)[0]) == 6
    assert torch.allclose(CompletionLogits(policy.model)(ids, mask, comp), shared, atol=2e-5)


def test_chunked_logprobs_equal_full_log_softmax(policy):
    ids, mask, comp = batch(policy, ["P: abc ", "P: de "], g=3, t=5)
    temps = torch.tensor([1.0, 0.7, 1.3, 1.0, 2.0, 0.5])
    full = plain_completion_logits(policy.model, ids, mask, comp)
    want = (full / temps[:, None, None]).log_softmax(-1).gather(-1, comp[..., None]).squeeze(-1)
    for micro in (0, 1, 4):
        got = completion_logprobs(policy.model, ids, mask, comp, temps, micro)
        assert torch.allclose(got, want, atol=2e-5)


def test_logprob_chunk_rows_bounds_the_chunk():
    assert logprob_chunk_rows(t=100, v=50257, elements=1 << 24) == 3  # 3 x 100 x 50257 < 2^24
    assert logprob_chunk_rows(t=10_000, v=50257, elements=1 << 24) == 1  # never 0


def test_grouped_cache_samples_like_one_group_at_a_time(policy):
    s = SamplingSettings(temperature=0, max_new_tokens=10)
    texts = ["P: abc ", "A: a longer prompt here+", "P: x "]
    grouped = sample(policy.model, [policy.encode_prompt(x) for x in texts for _ in range(3)],
                     s, policy.eos_id)
    irregular = [policy.encode_prompt(x) for x in (texts[0], texts[1], texts[0], texts[2])]
    mixed = sample(policy.model, irregular, s, policy.eos_id)
    for i, x in enumerate(texts):
        one = sample(policy.model, [policy.encode_prompt(x)], s, policy.eos_id)
        n = int(one.completion_mask.sum())
        for row in range(3 * i, 3 * i + 3):
            assert grouped.completion_ids[row, :n].tolist() == one.completion_ids[0, :n].tolist()
            assert torch.allclose(grouped.logprobs[row, :n], one.logprobs[0, :n], atol=1e-5)
        for row in [j for j, p in enumerate(irregular) if p == policy.encode_prompt(x)]:
            assert mixed.completion_ids[row, :n].tolist() == one.completion_ids[0, :n].tolist()
