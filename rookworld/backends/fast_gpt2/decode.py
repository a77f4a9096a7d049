"""The fast backend's sampler: a preallocated KV cache, the prompts' prefill and one
decoding step at a time, through the token loop every backend shares
(`sampling.decode_tokens`).

Prompts are left-padded; every real token's position counts real tokens only
(`gpt2.positions_from_mask`), as in the model's training. The loop writes keys/values into
a cache allocated once and stops early when every row has written end-of-text.

A GRPO batch repeats each prompt G times in a row: the prompt is run once and
its keys/values stored once per group (`KVCache`'s prompt slots); each decoding step
meets them with the group's G queries in one product (`decode_attention`).

With a tape budget the forward is kept (`tape.Tape`: every layer's input, queries and
residual after attention, and the cache's keys and values), for the update to
differentiate without running most of the policy's forward again.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import Tensor

from ...sampling import Rollout, SamplingSettings, decode_tokens, left_pad
from . import native
from .attention import group_order, left_pad_starts, unique_prompts
from .blocks import final_norm, lm_head
from .forward import check_gpt2, prompt_forward
from .matmul import Packed, linear, pack_weights
from .tape import Tape

# Decode with oneDNN-packed weight copies below this many rows: packing speeds up the
# products of 16-32 rows and buys nothing at 64, where the copy (one more set of weights
# in memory) is not worth holding (benchmarks/README.md). ROOKWORLD_PACK_BELOW_ROWS=0
# never packs: the benchmarks' switch.
PACK_BELOW_ROWS = int(os.environ.get("ROOKWORLD_PACK_BELOW_ROWS", "64"))


class KVCache:
    """Keys and values of every layer, allocated once, one block per group (the G rows
    that share a prompt): k, v [L, U, H, P + T_max * G, D] (views of one [L, 2, ...]
    tensor, so that a decoding step writes a layer's keys and values in one copy). Slots
    0..P-1 hold the group's prompt (stored once, not G times); completion token t of the
    group's row r sits at P + t * G + r (time-major), so the slots written by step t are
    one contiguous prefix and a decoding step reads them with one attention call per layer.

    bias [U, 1, G, P + T_max * G]: 0 where row r may attend (a real prompt token, or one
    of its own completion tokens), -inf elsewhere (padding, the other rows' tokens).

    A decoding step's attention (`attend`) goes through the native kernel where it runs
    (float32 on CPU, heads of 64, left-padded prompts; `native`): each row reads only its
    own keys there, where torch's attention runs each group's G queries over the whole
    block with the bias (G times the work)."""

    def __init__(self, n_layer: int, prompt_keys: int, max_new: int, group: int, n_groups: int,
                 n_head: int, head_dim: int, dtype, device):
        self.kv = torch.empty((n_layer, 2, n_groups, n_head, prompt_keys + max_new * group,
                               head_dim), dtype=dtype, device=device)
        self.k, self.v = self.kv[:, 0], self.kv[:, 1]
        self.p, self.group = prompt_keys, group
        self.bias = torch.empty(0)
        # the native kernel (float32 CPU, heads of 64) once set_bias finds every prompt
        # mask a suffix (left padding): start [U] int32, each group's first prompt key
        self.kernel = native.decode_attention_kernel() if torch.device(device).type == "cpu" \
            and dtype == torch.float32 and head_dim == 64 else None
        self.start: Tensor | None = None

    def set_bias(self, prompt_mask: Tensor) -> None:
        """prompt_mask [U,P] (one row per group) -> the attention bias (see class)."""
        u, g = prompt_mask.shape[0], self.group
        own = torch.eye(g, dtype=torch.bool, device=prompt_mask.device).repeat(
            1, (self.k.shape[3] - self.p) // g)  # [G, T_max*G]: slot t*G + r is row r's
        ok = torch.cat([prompt_mask.bool()[:, None, :].expand(u, g, self.p),
                        own.expand(u, g, own.shape[1])], dim=-1)
        zero = torch.zeros(ok.shape, dtype=self.k.dtype, device=ok.device)
        self.bias = zero.masked_fill(~ok, float("-inf"))[:, None]
        if self.kernel is not None:
            self.start = left_pad_starts(prompt_mask)

    def attend(self, layer: int, t: int, qkv: Tensor) -> Tensor:
        """Completion token t's attention in this layer: its keys and values (from qkv
        [N,3C], a block's attention input product) into their slots, then each row over
        its prompt and its own tokens 0..t -> [N,C]. Through the native kernel where it
        runs (`native`), else `write` and `decode_attention`."""
        if self.start is None:
            return decode_attention(self.write(layer, t, qkv), self, layer, t)
        n, c = qkv.shape[0], self.k.shape[2] * self.k.shape[4]
        if qkv.stride(1) != 1:
            qkv = qkv.contiguous()
        out = torch.empty((n, c), dtype=qkv.dtype)
        kv = self.kv[layer]
        if self.kernel(qkv.data_ptr(), qkv.stride(0), kv.data_ptr(), self.start.data_ptr(),
                       out.data_ptr(), kv.shape[1], self.group, kv.shape[2], kv.shape[3],
                       self.p, t, kv.shape[4] ** -0.5):
            raise MemoryError("native decoding attention: out of memory for its work space")
        return out

    def write(self, layer: int, t: int, qkv: Tensor) -> Tensor:
        """qkv [N,3C] of completion token t (rows in group order, a block's attention
        input product): its keys and values into their slots; returns the queries as
        [U,H,G,D] (a view)."""
        u, g, h, d = self.k.shape[1], self.group, self.k.shape[2], self.k.shape[4]
        lo = self.p + t * g
        parts = qkv.view(u, g, 3, h, d)
        self.kv[layer, :, :, :, lo:lo + g] = parts[:, :, 1:].permute(2, 0, 3, 1, 4)
        return parts[:, :, 0].transpose(1, 2)


def decode_attention(q: Tensor, cache: KVCache, layer: int, t: int) -> Tensor:
    """Attention of one new token per row over its prompt and its completion tokens
    0..t: q [U,H,G,D] (`KVCache.write`) -> [N,C]. Each group's G queries meet the
    group's block in one product; the bias keeps every row to its own tokens (the G-1
    other rows' products are wasted work, cheaper than G separate row-sized products).
    One fused attention call instead of a product, a bias add, a softmax and a product
    (torch's path, where the native kernel does not run)."""
    u, h, g, d = q.shape
    end = cache.p + (t + 1) * g
    out = F.scaled_dot_product_attention(q, cache.k[layer, :, :, :end],
                                         cache.v[layer, :, :, :end],
                                         attn_mask=cache.bias[..., :end])  # [U,H,G,D]
    return out.transpose(1, 2).reshape(u * g, h * d)


def decode_block(x: Tensor, blk, cache: KVCache, layer: int, t: int,
                 packed: Packed | None = None, tape: Tape | None = None,
                 rows: slice | None = None) -> Tensor:
    """One GPT-2 block for one token per row: x [N,C] -> [N,C] (as `blocks.block`, with
    fewer operations: per-operation overhead is most of a decoding step at small widths).
    With a tape, the queries are copied into it and both residual sums written straight
    into it (tape rows `rows`, `Tape.step_rows`)."""
    c = x.shape[1]
    attn, mlp, ln_1, ln_2 = blk.attn, blk.mlp, blk.ln_1, blk.ln_2
    qkv = linear(F.layer_norm(x, (c,), ln_1.weight, ln_1.bias, ln_1.eps),
                 attn.c_attn.weight, attn.c_attn.bias, packed=packed)
    if tape is not None:
        tape.q[layer][rows] = qkv[:, :c]
    att = cache.attend(layer, t, qkv)
    x = torch.add(x, linear(att, attn.c_proj.weight, attn.c_proj.bias, packed=packed),
                  out=tape.xm[layer][rows] if tape is not None else None)
    h = linear(F.layer_norm(x, (c,), ln_2.weight, ln_2.bias, ln_2.eps),
               mlp.c_fc.weight, mlp.c_fc.bias, gelu=True, packed=packed)
    return torch.add(x, linear(h, mlp.c_proj.weight, mlp.c_proj.bias, packed=packed),
                     out=tape.x[layer + 1][rows] if tape is not None else None)


def decode_forward(model, tok: Tensor, positions: Tensor, cache: KVCache, t: int,
                   packed: Packed | None = None, tape: Tape | None = None) -> Tensor:
    """Forward of one token per row, tok/positions [N], written at completion slot t.
    packed: pack_weights(model, N); tape: keeps the step's activations. Returns
    next-token logits [N,V]."""
    tr = model.transformer
    rows = tape.step_rows(t, tok, positions) if tape is not None else None
    x = torch.add(tr.wte(tok), tr.wpe(positions),
                  out=tape.x[0][rows] if tape is not None else None)
    for i, blk in enumerate(tr.h):
        x = decode_block(x, blk, cache, i, t, packed, tape, rows)
    return lm_head(model, final_norm(model, x), packed)


def prefill(model, prompt_ids: Tensor, prompt_mask: Tensor, max_new: int, tape_budget: int = 0
            ) -> tuple[Tensor, KVCache, Tape | None]:
    """Run each distinct prompt once; allocate the cache with its keys/values as every
    group's prompt slots. tape_budget: bytes a `Tape` of the prompts and max_new - 1
    decoding steps may take (kept, and returned, only when it fits). Returns (next-token
    logits [N,V], cache, tape or None)."""
    uniq, u_mask, index = unique_prompts(prompt_ids, prompt_mask)
    order, g = group_order(index, uniq.shape[0])
    cfg, w = model.config, model.transformer.wte.weight
    n, steps = prompt_ids.shape[0], max_new - 1
    tape = None
    if tape_budget and Tape.size(cfg, uniq.shape[0], uniq.shape[1], n, steps, order.shape[0],
                                 w.element_size()) <= tape_budget:
        tape = Tape(model, uniq, u_mask, order, g, n, steps)
    cache = KVCache(cfg.n_layer, prompt_ids.shape[1], max_new, g, order.shape[0], cfg.n_head,
                    cfg.n_embd // cfg.n_head, w.dtype, w.device)
    p = prompt_ids.shape[1]
    if tape is not None:
        tape.attach(cache)

    def on_kv(i, k, v):
        cache.k[i, :, :, :p] = k[order]
        cache.v[i, :, :, :p] = v[order]
    last = prompt_forward(model, uniq, u_mask, on_kv, tape.prompt_keeper() if tape else None)
    cache.set_bias(u_mask[order])
    return lm_head(model, last)[index], cache, tape


@torch.no_grad()
def sample(model, prompts: list[list[int]], settings: SamplingSettings, eos_id: int,
           generator: torch.Generator | None = None, tape_budget: int = 0,
           constraint=None) -> Rollout:
    """Sample one completion per prompt (repeat prompts for G per group, rows of a
    group next to each other: their prompt is then run and stored once).

    prompts: N id lists (any lengths). tape_budget: keep the forward (`tape.Tape`, in
    Rollout.tapes) when it takes at most this many bytes (0: never). constraint: limits
    the tokens each row may write (`sampling.decode_tokens`; `legal_mask.legal_move_constraint`).
    Returns a `Rollout` on the model's device.
    """
    check_gpt2(model)
    device = model.transformer.wte.weight.device
    prompt_ids, prompt_mask = (t.to(device) for t in left_pad(prompts, eos_id,
                                                              settings.pad_to_multiple_of))
    n = prompt_ids.shape[0]
    longest = max(len(p) for p in prompts)  # positions count real tokens, not the padding
    t_max = settings.max_new_tokens
    cfg = model.config
    if longest + t_max > cfg.n_positions:
        raise ValueError(f"prompt ({longest}) + sampler.max_new_tokens ({t_max}) exceeds the "
                         f"model's {cfg.n_positions} positions")
    logits, cache, tape = prefill(model, prompt_ids, prompt_mask, t_max, tape_budget)
    packed = pack_weights(model, n) if 1 < t_max and n < PACK_BELOW_ROWS else None
    next_pos = prompt_mask.sum(-1)

    def forward_one(tok: Tensor, t: int) -> Tensor:
        nonlocal next_pos
        out = decode_forward(model, tok, next_pos, cache, t, packed, tape)
        next_pos = next_pos + 1
        return out

    out, logps, done, width, comp_mask = decode_tokens(logits, forward_one, settings, eos_id,
                                                       generator, constraint)
    if tape is not None:
        assert tape.steps == width - 1, (tape.steps, width)
    return Rollout(prompt_ids, prompt_mask, out[:, :width], comp_mask,
                   logps[:, :width] * comp_mask, ~done,
                   [(torch.arange(n, device=device), tape)] if tape is not None else [])
