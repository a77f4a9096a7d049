"""Batched sampling for GPT-2 with a preallocated KV cache.

Prompts are left-padded; every real token's position counts real tokens only
(`position = cumsum(mask) - 1`), as in the model's training. The loop writes
keys/values into a cache allocated once, stops early when every row has
written end-of-text, and keeps each sampled token's log-probability under the
policy (`log_softmax(logits / temperature)`, full vocabulary, before top-k/top-p
filtering) so the PPO ratio can use it as the old policy's log-prob. The loss
trains on exactly these sampled ids; nothing is re-tokenised.

A GRPO batch repeats each prompt G times in a row: the prompt is run once and
its keys/values stored once per group (`KVCache.prefix_*`); each decoding step
meets them with the group's G queries in one product (`decode_attention`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .forward import (
    Packed,
    block,
    check_gpt2,
    final_norm,
    group_order,
    lm_head,
    pack_weights,
    positions_from_mask,
    prefill_mask,
    prompt_forward,
    unique_prompts,
)

__all__ = ["KVCache", "Rollout", "SamplingSettings", "filter_logits", "group_order", "left_pad",
           "per_task_settings", "positions_from_mask", "prefill_mask", "sample"]


# Decode with oneDNN-packed weight copies below this many rows: packing took GPT-2-small
# products from 38-55 to 55-83 GFLOP/s at 16-32 rows and bought nothing at 64, where
# the copy (one more set of weights in memory) is not worth holding.
PACK_BELOW_ROWS = 64


@dataclass(frozen=True)
class SamplingSettings:
    """temperature: 0 means greedy; top_k: 0 = off; top_p: 1.0 = off;
    max_new_tokens: completion budget; min_new_tokens: end-of-text is masked before it."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 160
    min_new_tokens: int = 0

    def __post_init__(self):
        checks = [(self.temperature >= 0, "temperature", ">= 0"),
                  (self.top_k >= 0, "top_k", ">= 0"),
                  (0 < self.top_p <= 1, "top_p", "in (0, 1]"),
                  (self.max_new_tokens >= 1, "max_new_tokens", ">= 1"),
                  (0 <= self.min_new_tokens <= self.max_new_tokens, "min_new_tokens",
                   "in [0, max_new_tokens]")]
        for ok, key, rule in checks:
            if not ok:
                raise ValueError(f"sampler.{key} must be {rule}, got {getattr(self, key)!r}")


@dataclass
class Rollout:
    """prompt_ids/prompt_mask [N,P] left-padded; completion_ids/completion_mask [N,T]
    (mask 1 on generated tokens up to and including end-of-text); logprobs [N,T]
    policy log-probs of the sampled ids (0 where masked); truncated [N] bool:
    no end-of-text within max_new_tokens."""

    prompt_ids: Tensor
    prompt_mask: Tensor
    completion_ids: Tensor
    completion_mask: Tensor
    logprobs: Tensor
    truncated: Tensor


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """list of N id lists -> (ids [N,P], mask [N,P]) padded on the left."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s):] = 1
    return ids, mask


def filter_logits(logits: Tensor, top_k: int, top_p: float) -> Tensor:
    """[N,V] -> [N,V] with -inf outside the top-k and outside the top-p nucleus."""
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = (cum - sorted_logits.softmax(-1)) >= top_p  # keep the token crossing top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


class KVCache:
    """Keys and values, allocated once. The prompt part is stored once per distinct
    prompt and shared by the rows that repeat it; the completion part per row.

    prefix_k/prefix_v: L lists of [U,H,P,D] (group j's prompt, read by rows j*G..j*G+G-1);
    prefix_bias [U,1,1,P]: 0 on real prompt keys, -inf on padding;
    k/v: [L,N,H,T_max,D] completion keys/values."""

    def __init__(self, n_layer, n, n_head, max_new, head_dim, dtype, device):
        shape = (n_layer, n, n_head, max_new, head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.prefix_k: list[Tensor] = []
        self.prefix_v: list[Tensor] = []
        self.prefix_bias = torch.empty(0)
        self.group = 1


def decode_attention(q: Tensor, cache: KVCache, layer: int, t: int) -> Tensor:
    """Attention of one new token per row over its prompt (shared per group) and its
    first t + 1 completion slots: q [N,H,1,D] -> [N,H,1,D]. Each group's G queries meet
    their prompt's keys in one [G,D] x [D,P] product instead of G copies of the prompt."""
    n, h, _, d = q.shape
    g = cache.group
    u = n // g
    q = q * d ** -0.5
    keys, values = cache.k[layer, :, :, :t + 1], cache.v[layer, :, :, :t + 1]
    s_prompt = torch.matmul(q.reshape(u, g, h, d).transpose(1, 2),
                            cache.prefix_k[layer].transpose(-1, -2)) + cache.prefix_bias
    s_own = torch.matmul(q, keys.transpose(-1, -2)).view(u, g, h, t + 1).transpose(1, 2)
    w_prompt, w_own = torch.cat([s_prompt, s_own], dim=-1).softmax(-1).split(
        [s_prompt.shape[-1], t + 1], dim=-1)
    out = torch.matmul(w_prompt, cache.prefix_v[layer]).transpose(1, 2).reshape(n, h, 1, d)
    return out + torch.matmul(w_own.transpose(1, 2).reshape(n, h, 1, t + 1), values)


def decode_forward(model, tok: Tensor, positions: Tensor, cache: KVCache, t: int,
                   packed: Packed | None = None) -> Tensor:
    """Forward of one token per row, tok/positions [N], written at completion slot t.
    packed: pack_weights(model, N). Returns next-token logits [N,V]."""
    tr = model.transformer
    x = (tr.wte(tok) + tr.wpe(positions))[:, None]
    for i, blk in enumerate(tr.h):
        def attend(q, k, v, i=i):
            cache.k[i, :, :, t:t + 1] = k
            cache.v[i, :, :, t:t + 1] = v
            return decode_attention(q, cache, i, t)
        x = block(x, blk, attend, packed)
    return lm_head(model, final_norm(model, x[:, -1]), packed)


def prefill(model, prompt_ids: Tensor, prompt_mask: Tensor, cache: KVCache) -> Tensor:
    """Run each distinct prompt once and keep its keys/values in the cache's shared
    prompt part. Returns next-token logits [N,V]."""
    uniq, u_mask, index = unique_prompts(prompt_ids, prompt_mask)
    order, cache.group = group_order(index, uniq.shape[0])

    def on_kv(i, k, v):
        cache.prefix_k.append(k[order])
        cache.prefix_v.append(v[order])
    last = prompt_forward(model, uniq, u_mask, on_kv)
    bias = torch.zeros(u_mask.shape, dtype=last.dtype, device=last.device)
    cache.prefix_bias = bias.masked_fill(u_mask == 0, float("-inf"))[order][:, None, None, :]
    return lm_head(model, last)[index]


@torch.no_grad()
def sample(model, prompts: list[list[int]], settings: SamplingSettings, eos_id: int,
           generator: torch.Generator | None = None) -> Rollout:
    """Sample one completion per prompt (repeat prompts for G per group, rows of a
    group next to each other: their prompt is then run and stored once).

    prompts: N id lists (any lengths). Returns a `Rollout` on the model's device.
    """
    check_gpt2(model)
    device = model.transformer.wte.weight.device
    dtype = model.transformer.wte.weight.dtype
    prompt_ids, prompt_mask = (t.to(device) for t in left_pad(prompts, eos_id))
    n, p = prompt_ids.shape
    t_max = settings.max_new_tokens
    cfg = model.config
    if p + t_max > cfg.n_positions:
        raise ValueError(f"prompt ({p}) + sampler.max_new_tokens ({t_max}) exceeds the "
                         f"model's {cfg.n_positions} positions")
    cache = KVCache(cfg.n_layer, n, cfg.n_head, t_max, cfg.n_embd // cfg.n_head, dtype, device)
    logits = prefill(model, prompt_ids, prompt_mask, cache)
    packed = pack_weights(model, n) if 1 < t_max and n < PACK_BELOW_ROWS else None
    next_pos = prompt_mask.sum(-1)
    out = torch.full((n, t_max), eos_id, dtype=torch.long, device=device)
    logps = torch.zeros((n, t_max), dtype=torch.float32, device=device)
    done = torch.zeros(n, dtype=torch.bool, device=device)
    length = torch.full((n,), t_max, dtype=torch.long, device=device)
    for t in range(t_max):
        logits = logits.float()
        if t < settings.min_new_tokens:
            logits[:, eos_id] = float("-inf")
        tok, logp = _choose(logits, settings, generator)
        tok = torch.where(done, eos_id, tok)
        out[:, t] = tok
        logps[:, t] = torch.where(done, 0.0, logp)
        ended = ~done & (tok == eos_id)
        length = torch.where(ended, t + 1, length)
        done |= ended
        if bool(done.all()) or t == t_max - 1:
            break
        logits = decode_forward(model, tok, next_pos, cache, t, packed)
        next_pos = next_pos + 1
    width = int(length.max())
    steps = torch.arange(width, device=device)[None, :]
    comp_mask = (steps < length[:, None]).long()
    return Rollout(prompt_ids, prompt_mask, out[:, :width], comp_mask,
                   logps[:, :width] * comp_mask, ~done)


def _choose(logits: Tensor, s: SamplingSettings, generator) -> tuple[Tensor, Tensor]:
    """logits [N,V] -> (token [N], its policy log-prob [N])."""
    if s.temperature == 0:
        tok = logits.argmax(-1)
        return tok, logits.log_softmax(-1).gather(-1, tok[:, None]).squeeze(-1)
    scaled = logits / s.temperature
    logp_all = scaled.log_softmax(-1)
    probs = filter_logits(scaled, s.top_k, s.top_p).softmax(-1)
    tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tok, logp_all.gather(-1, tok[:, None]).squeeze(-1)


def per_task_settings(temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                      max_new_tokens: int = 160, min_new_tokens: int = 0,
                      per_task: dict | None = None) -> dict[str, SamplingSettings]:
    """The `sampler` group: shared settings, each overridable per task, e.g.
    per_task={"A": {"max_new_tokens": 110}} -> {"P": SamplingSettings, "A": ...}."""
    base = dict(temperature=temperature, top_k=top_k, top_p=top_p,
                max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens)
    per_task = dict(per_task or {})
    unknown = set(per_task) - {"P", "A"}
    if unknown:
        raise ValueError(f"sampler.per_task has unknown tasks {sorted(unknown)}; use P and A")
    out = {}
    for task in ("P", "A"):
        over = dict(per_task.get(task) or {})
        bad = set(over) - set(base)
        if bad:
            raise ValueError(f"sampler.per_task.{task} has unknown keys {sorted(bad)}; "
                             f"allowed: {sorted(base)}")
        try:
            out[task] = SamplingSettings(**(base | over))
        except ValueError as e:
            raise ValueError(str(e).replace("sampler.", f"sampler.per_task.{task}.")
                             if over else str(e)) from None
    return out
