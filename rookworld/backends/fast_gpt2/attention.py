"""Masks and prompt sharing for left-padded (prompt, completion) batches, and the
attention of distinct prompts and their groups' completions
(`prompt_completion_attention`, through the native kernel where it builds); positions are
`gpt2.positions_from_mask`."""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import Tensor

from . import native
from .blocks import Attend


def prefill_mask(prompt_mask: Tensor) -> Tensor:
    """[N,P] left-padded mask -> [N,1,P,P] bool: causal over real keys; a pad query
    attends to itself only (no all-masked rows, no NaN)."""
    p = prompt_mask.shape[1]
    causal = torch.ones(p, p, dtype=torch.bool, device=prompt_mask.device).tril()
    eye = torch.eye(p, dtype=torch.bool, device=prompt_mask.device)
    return causal & (prompt_mask.bool()[:, None, None, :] | eye)


# ROOKWORLD_SHARE_PROMPTS=0 treats every row as its own prompt: the benchmarks' switch
# for measuring what running each prompt once per group saves (benchmarks/README.md)
SHARE_PROMPTS = os.environ.get("ROOKWORLD_SHARE_PROMPTS", "1") != "0"


def unique_prompts(prompt_ids: Tensor, prompt_mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """[N,P] ids and mask -> (ids [U,P], mask [U,P], index [N]) with row i = unique
    row index[i]; U <= N distinct (ids, mask) rows (U = N without SHARE_PROMPTS)."""
    if not SHARE_PROMPTS:
        return prompt_ids, prompt_mask, torch.arange(len(prompt_ids), device=prompt_ids.device)
    both = torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], dim=1)
    uniq, index = torch.unique(both, dim=0, return_inverse=True)
    p = prompt_ids.shape[1]
    return uniq[:, :p], uniq[:, p:].to(prompt_mask.dtype), index


def group_order(index: Tensor, n_unique: int) -> tuple[Tensor, int]:
    """index [N] (row -> distinct prompt) -> (order [N/G], G) when rows come in blocks of
    G equal prompts (a GRPO batch); else (index, 1): every row its own block."""
    n = index.shape[0]
    if n % n_unique == 0:
        blocks = index.view(n_unique, n // n_unique)
        if bool((blocks == blocks[:, :1]).all()):
            return blocks[:, 0], n // n_unique
    return index, 1


def to_rows(x: Tensor, order: Tensor, g: int) -> Tensor:
    """Per-distinct-prompt x [U,...] -> per-row [N,...] for group_order's (order, g): a
    gather, then a broadcast over each block of g rows (its backward is a sum over the
    block, not a scatter)."""
    x = x[order]
    if g == 1:
        return x
    return x.unsqueeze(1).expand(x.shape[0], g, *x.shape[1:]).reshape(-1, *x.shape[1:])


def prompt_completion_attention(u_mask: Tensor, row_mask: Tensor, order: Tensor, g: int,
                                s: int, time_major: bool = False) -> Attend:
    """attend(q, k, v) for [1,H,M,D] tokens: first the distinct prompts' U x P tokens
    (u_mask [U,P]), then N x s completion tokens (row n's token j at n*s + j; time_major:
    at j*N + n); rows map to prompts by group_order's (order, g), row_mask [N,P] is their
    prompt mask. Prompts attend causally among themselves, completions over their
    group's prompt and their own earlier tokens."""
    u, p = u_mask.shape
    n, mp = row_mask.shape[0], u * p
    prompt_attn = prefill_mask(u_mask)
    causal = torch.ones(s, s, dtype=torch.bool, device=u_mask.device).tril()
    attn_mask = torch.cat([row_mask.bool()[:, None, None, :].expand(n, 1, s, p),
                           causal.expand(n, 1, s, s)], dim=-1)

    def completions(z):  # [H, N*s, D] -> [N,H,s,D] (a view)
        return z.unflatten(1, (s, n)).permute(2, 0, 1, 3) if time_major \
            else z.unflatten(1, (n, s)).transpose(0, 1)

    def attend(q, k, v):  # [1,H,M,D] each -> [1,H,M,D]
        def split(z):  # -> prompts [U,H,P,D], completions [N,H,s,D] (views)
            # squeeze and split, not indexing and slicing: their backward is a
            # concatenation, where a slice's zero-fills a whole [H,M,D] gradient per part
            zp, zc = torch.split(z.squeeze(0), [mp, z.shape[2] - mp], dim=1)
            return zp.unflatten(1, (u, p)).transpose(0, 1), completions(zc)
        (qp, qc), (kp, kc), (vp, vc) = split(q), split(k), split(v)
        out_p = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=prompt_attn)
        out_p = out_p.transpose(0, 1).flatten(1, 2)
        if s == 0:
            return out_p[None]
        keys = torch.cat([to_rows(kp, order, g), kc], dim=2)
        values = torch.cat([to_rows(vp, order, g), vc], dim=2)
        out_c = F.scaled_dot_product_attention(qc, keys, values, attn_mask=attn_mask)
        out_c = out_c.permute(1, 2, 0, 3) if time_major else out_c.transpose(0, 1)
        return torch.cat([out_p, out_c.flatten(1, 2)], dim=1)[None]
    attend.native = _native_prefix_attention(u_mask, order, g, s, time_major)
    return attend


def left_pad_starts(mask: Tensor) -> Tensor | None:
    """[R,P] 0/1 mask -> each row's first real position, int32 [R], when every row is
    left-padded (real from there to the end, what the native kernels index), else None."""
    p = mask.shape[1]
    start = p - mask.bool().sum(-1)
    if not torch.equal(torch.arange(p, device=mask.device)[None, :] >= start[:, None],
                       mask.bool()):
        return None
    return start.to(torch.int32).contiguous()


def _native_prefix_attention(u_mask: Tensor, order: Tensor, g: int, s: int, time_major: bool):
    """For `prompt_completion_attention`: a function (qkv [M,3C], n_head) -> attention
    output [M,C] through the native kernel (`native.prefix_attention_kernels`), None where
    it does not take the call (heads other than 64, not float32 on CPU); or None where the
    kernel does not run here or the prompts are not left-padded."""
    kernels = native.prefix_attention_kernels()
    start = left_pad_starts(u_mask) if kernels is not None and u_mask.device.type == "cpu" \
        else None
    if start is None:
        return None
    u, p = u_mask.shape
    meta = (u, p, start, order.shape[0], g,
            order.to(torch.int32).contiguous(), s, int(time_major))

    def run(qkv: Tensor, n_head: int) -> Tensor | None:
        c = qkv.shape[1] // 3
        if qkv.dtype != torch.float32 or c != 64 * n_head or qkv.device.type != "cpu":
            return None
        if qkv.shape[0] != u * p + order.shape[0] * g * s:  # the kernel indexes every row
            raise ValueError(f"attention input has {qkv.shape[0]} rows, the layout "
                             f"{u * p + order.shape[0] * g * s}")
        return _PrefixAttention.apply(qkv, kernels, meta, n_head)
    return run


class _PrefixAttention(torch.autograd.Function):
    """`prompt_completion_attention`'s attention through the native kernel: qkv [M,3C]
    -> [M,C], keeping its output and log-sum-exp for the backward (as flash attention
    does), which writes the gradient of qkv as one [M,3C] tensor."""

    @staticmethod
    def forward(ctx, qkv, kernels, meta, n_head):
        qkv = qkv if qkv.stride(1) == 1 else qkv.contiguous()
        m, c = qkv.shape[0], qkv.shape[1] // 3
        out = torch.empty((m, c), dtype=qkv.dtype)
        lse = torch.empty((m, n_head), dtype=torch.float32)
        u, p, start, b, g, order, s, tm = meta
        if kernels[0](qkv.data_ptr(), qkv.stride(0), out.data_ptr(), c, lse.data_ptr(), u, p,
                      start.data_ptr(), b, g, order.data_ptr(), s, tm, n_head, 64 ** -0.5):
            raise MemoryError("native attention: out of memory for its work space")
        ctx.save_for_backward(qkv, out, lse)
        ctx.kernels, ctx.meta, ctx.n_head = kernels, meta, n_head
        return out

    @staticmethod
    def backward(ctx, d_out):
        qkv, out, lse = ctx.saved_tensors
        d_out = d_out if d_out.stride(1) == 1 else d_out.contiguous()
        d_qkv = torch.zeros_like(qkv)
        u, p, start, b, g, order, s, tm = ctx.meta
        if ctx.kernels[1](qkv.data_ptr(), qkv.stride(0), out.data_ptr(), out.stride(0),
                          lse.data_ptr(), d_out.data_ptr(), d_out.stride(0), d_qkv.data_ptr(),
                          d_qkv.stride(0), u, p, start.data_ptr(), b, g, order.data_ptr(), s,
                          tm, ctx.n_head, 64 ** -0.5):
            raise MemoryError("native attention backward: out of memory for its work space")
        return d_qkv, None, None, None

