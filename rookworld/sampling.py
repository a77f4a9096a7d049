"""Batched sampling for GPT-2 with a preallocated KV cache.

Prompts are left-padded; every real token's position counts real tokens only
(`position = cumsum(mask) - 1`), as in the model's training. The loop writes
keys/values into a cache allocated once, stops early when every row has
written end-of-text, and keeps each sampled token's log-probability under the
policy (`log_softmax(logits / temperature)`, full vocabulary, before top-k/top-p
filtering) so the PPO ratio can use it as the old policy's log-prob; with a token
constraint (`legal_mask`: evaluation and play only) it is the masked distribution's. The loss
trains on exactly these sampled ids; nothing is re-tokenised.

A GRPO batch repeats each prompt G times in a row: the prompt is run once and
its keys/values stored once per group (`KVCache.prefix_*`); each decoding step
meets them with the group's G queries in one product (`decode_attention`).

With a tape budget the forward is kept (`tape.Tape`: every layer's input, queries and
residual after attention, and the cache's keys and values), for the update to
differentiate without running most of the policy's forward again.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from . import native
from .forward import (
    Packed,
    check_gpt2,
    final_norm,
    group_order,
    left_pad_starts,
    linear,
    lm_head,
    pack_weights,
    positions_from_mask,
    prefill_mask,
    prompt_forward,
    unique_prompts,
)
from .tape import Tape

__all__ = ["KVCache", "Rollout", "SamplingSettings", "decode_tokens", "filter_logits",
           "group_order", "left_pad", "per_task_settings", "positions_from_mask", "prefill_mask",
           "sample"]


# Decode with oneDNN-packed weight copies below this many rows: packing speeds up the
# products of 16-32 rows and buys nothing at 64, where the copy (one more set of weights
# in memory) is not worth holding (benchmarks/README.md). ROOKWORLD_PACK_BELOW_ROWS=0
# never packs: the benchmarks' switch.
PACK_BELOW_ROWS = int(os.environ.get("ROOKWORLD_PACK_BELOW_ROWS", "64"))
LEGAL_MOVES = ("free", "mask")  # SamplingSettings.legal_moves


@dataclass(frozen=True)
class SamplingSettings:
    """temperature: 0 means greedy; top_k: 0 = off; top_p: 1.0 = off;
    max_new_tokens: completion budget; min_new_tokens: end-of-text is masked before it;
    pad_to_multiple_of: prompts are left-padded (masked) to a width that is a multiple of
    this (`left_pad`); 1 = the longest prompt's, the default: on CPU a wider pad buys
    neither memory nor speed (benchmarks/README.md, ablations); legal_moves: "free" or
    "mask" (the P task's B: move decoded only along legal moves: callers pass
    `legal_mask.legal_move_constraint` to `sample`; evaluation and play only)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 160
    min_new_tokens: int = 0
    pad_to_multiple_of: int = 1
    legal_moves: str = "free"

    def __post_init__(self):
        checks = [(self.temperature >= 0, "temperature", ">= 0"),
                  (self.top_k >= 0, "top_k", ">= 0"),
                  (0 < self.top_p <= 1, "top_p", "in (0, 1]"),
                  (self.max_new_tokens >= 1, "max_new_tokens", ">= 1"),
                  (0 <= self.min_new_tokens <= self.max_new_tokens, "min_new_tokens",
                   "in [0, max_new_tokens]"),
                  (self.pad_to_multiple_of >= 1, "pad_to_multiple_of", ">= 1"),
                  (self.legal_moves in LEGAL_MOVES, "legal_moves", " or ".join(LEGAL_MOVES)),
                  (self.legal_moves == "free" or self.min_new_tokens == 0, "min_new_tokens",
                   "0 with legal_moves=mask (end-of-text may be the only legal token)")]
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
    # (row indices, tape): the kept forward of those rows (sample's tape_budget)
    tapes: list[tuple[Tensor, Tape]] = field(default_factory=list)


def left_pad(seqs: list[list[int]], pad_id: int, multiple: int = 1) -> tuple[Tensor, Tensor]:
    """list of N id lists -> (ids [N,P], mask [N,P]) padded on the left, P the longest
    list's length rounded up to a multiple of `multiple`."""
    width = -(-max(len(s) for s in seqs) // multiple) * multiple
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
    """One GPT-2 block for one token per row: x [N,C] -> [N,C] (as `forward.block`, with
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


def decode_tokens(logits: Tensor, forward_one: Callable[[Tensor, int], Tensor],
                  settings: SamplingSettings, eos_id: int, generator=None, constraint=None):
    """The token loop both samplers share: logits [N,V] of the first completion token;
    forward_one(tokens [N], t) -> the next logits. Stops when every row has ended or at
    max_new_tokens. constraint: None, or an object with mask(logits [N,V]) -> logits with
    -inf at the tokens a row may not write (it may write into the step's logits, which
    nothing else reads), and advance(tokens [N]) after each choice
    (`legal_mask.LegalMoveConstraint`); the log-probs are then those of the masked
    distribution. -> (tokens [N,T], their log-probs [N,T], ended [N], width, mask [N,w])."""
    n, t_max, device = logits.shape[0], settings.max_new_tokens, logits.device
    if constraint is not None and settings.min_new_tokens:
        raise ValueError("a token constraint needs sampler.min_new_tokens=0 (end-of-text may "
                         f"be the only token it allows), got {settings.min_new_tokens}")
    out = torch.full((n, t_max), eos_id, dtype=torch.long, device=device)
    logps = torch.zeros((n, t_max), dtype=torch.float32, device=device)
    done = torch.zeros(n, dtype=torch.bool, device=device)
    length = torch.full((n,), t_max, dtype=torch.long, device=device)
    for t in range(t_max):
        banned = eos_id if t < settings.min_new_tokens else None
        step = logits.float() if constraint is None else constraint.mask(logits.float())
        tok, logp = _choose(step, settings, generator, banned)
        tok = torch.where(done, eos_id, tok)
        if constraint is not None:
            constraint.advance(tok)
        out[:, t] = tok
        logps[:, t] = torch.where(done, 0.0, logp)
        ended = ~done & (tok == eos_id)
        length = torch.where(ended, t + 1, length)
        done |= ended
        if bool(done.all()) or t == t_max - 1:
            break
        logits = forward_one(tok, t)
    width = int(length.max())
    comp_mask = (torch.arange(width, device=device)[None, :] < length[:, None]).long()
    return out, logps, done, width, comp_mask


@torch.no_grad()
def sample(model, prompts: list[list[int]], settings: SamplingSettings, eos_id: int,
           generator: torch.Generator | None = None, tape_budget: int = 0,
           constraint=None) -> Rollout:
    """Sample one completion per prompt (repeat prompts for G per group, rows of a
    group next to each other: their prompt is then run and stored once).

    prompts: N id lists (any lengths). tape_budget: keep the forward (`tape.Tape`, in
    Rollout.tapes) when it takes at most this many bytes (0: never). constraint: limits
    the tokens each row may write (`decode_tokens`; `legal_mask.legal_move_constraint`).
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


class NonFiniteLogits(FloatingPointError):
    """The policy's logits hold inf or NaN: its weights diverged."""


def _choose(logits: Tensor, s: SamplingSettings, generator, banned: int | None = None
            ) -> tuple[Tensor, Tensor]:
    """logits [N,V] -> (token [N], its log-prob [N] under logits / temperature before any
    filter: top-k, top-p, the `banned` id of min_new_tokens; as the update computes it).
    Raises NonFiniteLogits when torch refuses to sample inf/NaN logits (no normal-path cost)."""
    scaled = logits / s.temperature if s.temperature else logits
    logp_all = scaled.log_softmax(-1)
    if banned is not None:  # out of place: logits may be the caller's tensor
        scaled = scaled.index_fill(-1, torch.tensor([banned], device=scaled.device), -torch.inf)
    if s.temperature == 0:
        tok = scaled.argmax(-1)
        return tok, logp_all.gather(-1, tok[:, None]).squeeze(-1)
    probs = filter_logits(scaled, s.top_k, s.top_p).softmax(-1)
    try:
        tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    except RuntimeError as e:
        if not torch.isfinite(logits).all():
            raise NonFiniteLogits("the policy's logits are not finite (inf or NaN): its "
                                  "weights diverged") from e
        raise
    return tok, logp_all.gather(-1, tok[:, None]).squeeze(-1)


def per_task_settings(temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                      max_new_tokens: int = 160, min_new_tokens: int = 0,
                      pad_to_multiple_of: int = 1, legal_moves: str = "free",
                      per_task: dict | None = None) -> dict[str, SamplingSettings]:
    """The `sampler` group: shared settings, each overridable per task, e.g.
    per_task={"A": {"max_new_tokens": 110}} -> {"P": SamplingSettings, "A": ...}."""
    base = dict(temperature=temperature, top_k=top_k, top_p=top_p,
                max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens,
                pad_to_multiple_of=pad_to_multiple_of, legal_moves=legal_moves)
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
