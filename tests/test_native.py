"""The native kernels (rookworld/backends/fast_gpt2/csrc through its native.py): built once
per set of sources, switched off by ROOKWORLD_NATIVE=0, and decoding and teacher-forced
attention equal to torch's paths (the GELU kernels: tests/test_forward.py)."""

import os
import platform
import shutil
import subprocess
import sys

import pytest
import torch

from rookworld.backends.fast_gpt2 import attention, native
from rookworld.backends.fast_gpt2.decode import KVCache, sample
from rookworld.backends.fast_gpt2.tape import Tape
from rookworld.policy import build_random
from rookworld.sampling import SamplingSettings

X86_AVX2 = platform.machine() in ("x86_64", "AMD64") and {"avx2", "fma"} <= set(
    native.cpu_flags().split())
BUILDS = X86_AVX2 and shutil.which(os.environ.get("CC", "cc")) is not None
needs_kernel = pytest.mark.skipif(not BUILDS, reason="needs x86-64 with AVX2/FMA and a C compiler")


def test_kernel_builds_and_loads_where_it_can():
    """On a machine with a compiler and AVX2 the kernel must be there (a broken build
    would otherwise fall back silently and only cost speed)."""
    kernel = native.decode_attention_kernel()
    assert (kernel is not None) == (BUILDS and native.enabled())


def test_switch_off_and_bad_value(monkeypatch):
    monkeypatch.setenv("ROOKWORLD_NATIVE", "0")
    assert not native.enabled()
    monkeypatch.setenv("ROOKWORLD_NATIVE", "maybe")
    with pytest.raises(ValueError, match="ROOKWORLD_NATIVE"):
        native.enabled()


def _caches(u, g, h, p, t_max, starts, seed):
    """Two identical caches, the first through the kernel, the second through torch."""
    gen = torch.Generator().manual_seed(seed)
    made = []
    for kernel in (True, False):
        c = KVCache(3, p, t_max, g, u, h, 64, torch.float32, "cpu")
        if not kernel:
            c.kernel = None
        made.append(c)
    prompt_kv = torch.randn(made[0].kv.shape, generator=gen)
    mask = torch.arange(p)[None, :] >= torch.tensor(starts)[:, None]
    for c in made:
        c.kv.copy_(prompt_kv)  # completion slots too: unwritten slots must not be read
        c.set_bias(mask.long())
    return made, gen


@needs_kernel
@pytest.mark.parametrize("u,g,h,p,starts", [
    (1, 1, 1, 5, [0]),
    (2, 3, 4, 9, [0, 4]),
    (4, 8, 4, 13, [2, 0, 12, 7]),
    (2, 8, 12, 6, [5, 1]),
])
def test_kernel_equals_sdpa_over_a_whole_rollout(u, g, h, p, starts):
    t_max = 11
    (fast, ref), gen = _caches(u, g, h, p, t_max, starts, seed=u * 100 + g)
    assert fast.start is not None and ref.start is None
    c = h * 64
    for t in range(t_max):
        for layer in range(3):
            qkv = torch.randn(u * g, 3 * c, generator=gen) * 2
            a = fast.attend(layer, t, qkv)
            b = ref.attend(layer, t, qkv)
            assert a.shape == b.shape == (u * g, c)
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)  # float32 sums, other orders
    # the keys and values written are the same, slot for slot
    assert torch.equal(fast.kv, ref.kv)


@needs_kernel
def test_kernel_takes_a_strided_qkv_and_one_row_per_group():
    (fast, ref), gen = _caches(3, 1, 2, 4, 3, [1, 0, 3], seed=7)
    wide = torch.randn(3, 3 * 128 + 5, generator=gen)
    qkv = wide[:, :3 * 128]  # row stride 389
    torch.testing.assert_close(fast.attend(0, 0, qkv), ref.attend(0, 0, qkv.contiguous()),
                               rtol=1e-4, atol=1e-5)


@needs_kernel
def test_a_mask_that_is_not_left_padding_keeps_torch():
    c = KVCache(1, 4, 2, 2, 1, 1, 64, torch.float32, "cpu")
    assert c.kernel is not None
    c.set_bias(torch.tensor([[1, 0, 1, 1]]))
    assert c.start is None


def test_other_head_sizes_and_dtypes_keep_torch():
    assert KVCache(1, 4, 2, 2, 1, 2, 32, torch.float32, "cpu").kernel is None
    assert KVCache(1, 4, 2, 2, 1, 2, 64, torch.float64, "cpu").kernel is None


@needs_kernel
def test_sampling_and_its_tape_are_the_same_either_way(monkeypatch):
    """Heads of 64 (the kernel's): the same samples and log-probs from the same seed,
    and the tape (which keeps the cache's keys and values) gives the same gradients."""
    policy = build_random(n_layer=2, n_embd=128, n_head=2, n_positions=128, seed=3)
    prompts = [policy.encode_prompt(t) for t in
               ("P: abc ", "A: a longer prompt here+", "P: x ")] * 2
    prompts = [p for p in prompts for _ in range(4)]
    s = SamplingSettings(temperature=1.0, max_new_tokens=20)
    runs = []
    for on in (True, False):
        monkeypatch.setattr(native, "decode_attention_kernel",
                            native.decode_attention_kernel if on else lambda: None)
        r = sample(policy.model, prompts, s, policy.eos_id, torch.Generator().manual_seed(5),
                   tape_budget=1 << 30)
        (_, tape), = r.tapes
        assert isinstance(tape, Tape)
        policy.model.zero_grad(set_to_none=True)
        final = tape.final().detach().requires_grad_()
        final.square().sum().backward()
        tape.backward(policy.model, final.grad)
        grads = {k: p.grad.clone() for k, p in policy.model.named_parameters()
                 if p.grad is not None}
        runs.append((r, grads))
    (a, ga), (b, gb) = runs
    assert torch.equal(a.completion_ids, b.completion_ids)
    torch.testing.assert_close(a.logprobs, b.logprobs, rtol=0, atol=1e-5)
    assert ga.keys() == gb.keys()
    for k in ga:
        torch.testing.assert_close(ga[k], gb[k], rtol=1e-4, atol=1e-5)


@needs_kernel
def test_built_once_per_source_in_its_own_directory(tmp_path):
    """A fresh cache directory gets one library; a second process reuses it."""
    env = dict(os.environ, ROOKWORLD_NATIVE_DIR=str(tmp_path))
    code = ("from rookworld.backends.fast_gpt2 import native; "
            "assert native.decode_attention_kernel() is not None")
    for _ in range(2):
        subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=300)
    built = list(tmp_path.iterdir())  # one library, no temporary file left behind
    assert len(built) == 1 and built[0].name.startswith("kernels-"), built


@needs_kernel
@pytest.mark.parametrize("time_major", [False, True])
@pytest.mark.parametrize("u,p,starts,order,g,s,h", [
    (2, 5, [0, 3], [1, 0], 3, 4, 2),
    (3, 6, [2, 0, 5], [0, 2, 0, 1], 2, 3, 1),  # a prompt shared by two blocks
    (2, 4, [1, 0], [0, 1, 1, 0, 1], 1, 5, 3),  # one row a block
    (2, 3, [0, 1], [0, 1], 4, 0, 2),  # prompts only
])
def test_teacher_forced_attention_and_gradients_equal_sdpa(u, p, starts, order, g, s, h,
                                                           time_major):
    """attention.prompt_completion_attention through the native kernel (on qkv [M,3C])
    equals its torch path (on the q, k, v views), values and qkv gradients."""
    mask = (torch.arange(p)[None, :] >= torch.tensor(starts)[:, None]).long()
    order_t = torch.tensor(order)
    row_mask = attention.to_rows(mask, order_t, g)
    attend = attention.prompt_completion_attention(mask, row_mask, order_t, g, s, time_major)
    assert attend.native is not None
    m, c = u * p + len(order) * g * s, h * 64
    gen = torch.Generator().manual_seed(u * 10 + s)
    qkv = (torch.randn(m, 3 * c, generator=gen) * 1.5).requires_grad_()
    d_out = torch.randn(m, c, generator=gen)
    fast = attend.native(qkv, h)
    (fast * d_out).sum().backward()
    g_fast, qkv.grad = qkv.grad, None
    q, k, v = qkv.view(1, m, 3, h, 64).permute(2, 0, 3, 1, 4)
    ref = attend(q, k, v).transpose(1, 2).reshape(m, c)
    (ref * d_out).sum().backward()
    torch.testing.assert_close(fast, ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(g_fast, qkv.grad, rtol=1e-4, atol=1e-4)
    assert attend.native(qkv.detach().double(), h) is None  # not float32: torch's path
    assert attend.native(qkv.detach()[:, :3 * 96], 3) is None  # heads of 32
