"""One GPT-2 block (`block`), its replay from a rollout's tape (`replay_attention`,
`replay_mlp`), the recomputing autograd Functions `recompute` uses (`_NormLinear`,
`_GeluLinear`), and the final norm and output matrix (`final_norm`, `lm_head`)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from .gelu import gelu_tanh
from .matmul import Packed, _dnn, _train_product, _train_product_grads, linear

Attend = Callable[[Tensor, Tensor, Tensor], Tensor]


class _NormLinear(torch.autograd.Function):
    """layer_norm(x) @ w + b for x [M,C], keeping x (which the layer keeps anyway as its
    residual) and the norm's statistics instead of the normed [M,C] copy: the norm is
    recomputed in backward (one elementwise pass), one activation less per use."""

    @staticmethod
    def forward(ctx, x, ln_w, ln_b, eps, w, b):
        h, mean, rstd = torch.native_layer_norm(x, (x.shape[-1],), ln_w, ln_b, eps)
        ctx.eps = eps
        ctx.save_for_backward(x, ln_w, ln_b, mean, rstd, w)
        return _train_product(h, w, b)

    @staticmethod
    def backward(ctx, gy):
        x, ln_w, ln_b, mean, rstd, w = ctx.saved_tensors
        n = ctx.needs_input_grad
        h = torch.native_layer_norm(x, (x.shape[-1],), ln_w, ln_b, ctx.eps)[0]
        gh, gw, gb = _train_product_grads(h, w, gy, (any(n[:3]), n[4], n[5]))
        gx = g_lw = g_lb = None
        if gh is not None:
            gx, g_lw, g_lb = torch.ops.aten.native_layer_norm_backward(
                gh, x, (x.shape[-1],), mean, rstd, ln_w, ln_b, list(n[:3]))
        return gx, g_lw, g_lb, None, gw, gb


class _GeluLinear(torch.autograd.Function):
    """gelu_tanh(a) @ w + b for a [M,4C], keeping a (the products' input) instead of
    both a and gelu(a): the GELU is recomputed in backward."""

    @staticmethod
    def forward(ctx, a, w, b):
        ctx.save_for_backward(a, w)
        return _train_product(F.gelu(a, approximate="tanh"), w, b)

    @staticmethod
    def backward(ctx, gy):
        a, w = ctx.saved_tensors
        n = ctx.needs_input_grad
        gg, gw, gb = _train_product_grads(F.gelu(a, approximate="tanh"), w, gy, n)
        ga = torch.ops.aten.gelu_backward(gg, a, approximate="tanh") if gg is not None else None
        return ga, gw, gb


Keep = Callable[[str, Tensor], None]


def block(x: Tensor, blk, attend: Attend, packed: Packed | None = None,
          recompute: bool = False, keep: Keep | None = None) -> Tensor:
    """One GPT-2 block: x [N,S,C] -> [N,S,C]. attend(q, k, v) with q, k, v [N,H,S,D]
    returns the attention output [N,H,S,D] (it owns masking, caches and prefixes).
    packed: pack_weights' copies (no-grad decoding).

    keep(kind, value) (no-grad, `tape.Tape`): receives the block's input "x" [N,S,C],
    its attention input product "qkv" [N*S,3C] and the residual after attention "xm"
    [N,S,C], what `replay_attention` and `replay_mlp` differentiate it from.

    recompute (with gradients): keep fewer activations for the backward. The normed
    inputs (2 x C a token) and the GELU output (4C) are recomputed there (_NormLinear,
    _GeluLinear), of ~17C a layer keeps otherwise: less memory for a slower update."""
    n, s, c = x.shape
    attn, mlp, ln_1, ln_2 = blk.attn, blk.mlp, blk.ln_1, blk.ln_2
    lean = recompute and packed is None and torch.is_grad_enabled()

    def norm_linear(x, ln, lin, gelu=False):  # layer_norm(x) @ lin (+ GELU unless lean)
        if lean:
            return _NormLinear.apply(x.reshape(-1, c), ln.weight, ln.bias, ln.eps,
                                     lin.weight, lin.bias)
        h = F.layer_norm(x, (c,), ln.weight, ln.bias, ln.eps).reshape(-1, c)
        return linear(h, lin.weight, lin.bias, gelu=gelu, packed=packed)
    qkv = norm_linear(x, ln_1, attn.c_attn)
    if keep:
        keep("x", x)
        keep("qkv", qkv)
    att = _native_attend(attend, qkv, attn.num_heads) if n == 1 else None
    if att is None:
        q, k, v = qkv.view(n, s, 3, attn.num_heads, c // attn.num_heads).permute(2, 0, 3, 1, 4)
        att = attend(q, k, v).transpose(1, 2).reshape(-1, c)
    x = x + linear(att, attn.c_proj.weight, attn.c_proj.bias, packed=packed).view(n, s, c)
    if keep:
        keep("xm", x)
    h = norm_linear(x, ln_2, mlp.c_fc, gelu=True)
    proj = mlp.c_proj
    out = _GeluLinear.apply(h, proj.weight, proj.bias) if lean \
        else linear(h, proj.weight, proj.bias, packed=packed)
    return x + out.view(n, s, c)


class _Replayed(torch.autograd.Function):
    """res + x @ w + b whose value y was taken while sampling (`tape.Tape`): forward hands
    y back without the product; backward is the product's (and the residual's)."""

    @staticmethod
    def forward(ctx, x, w, b, res, y):
        ctx.save_for_backward(x, w)
        return y.view_as(y)

    @staticmethod
    def backward(ctx, gy):
        x, w = ctx.saved_tensors
        n = ctx.needs_input_grad
        gx, gw, gb = _train_product_grads(x, w, gy, n[:3])
        return gx, gw, gb, gy if n[3] else None, None


def _native_attend(attend: Attend, qkv: Tensor, n_head: int) -> Tensor | None:
    """attend's native form on the whole attention input (qkv [M,3C] -> [M,C]) where it
    has one and takes the call (`prompt_completion_attention`), else None."""
    run = getattr(attend, "native", None)
    return run(qkv, n_head) if run is not None else None


def replay_attention(x: Tensor, blk, attend: Attend, qkv: Tensor, xm: Tensor) -> Tensor:
    """The attention half of `block` over M tokens x [M,C] (the input `keep` saw), its
    products' outputs given (qkv [M,3C] and the residual after it, xm [M,C], as kept):
    the layer norm and attention are recomputed, no matrix product is; differentiating
    the result gives the half's gradients (attend as for `block`, on [1,H,M,D])."""
    m, c = x.shape
    attn, ln = blk.attn, blk.ln_1
    h = F.layer_norm(x, (c,), ln.weight, ln.bias, ln.eps)
    qkv = _Replayed.apply(h, attn.c_attn.weight, attn.c_attn.bias, None, qkv)
    att = _native_attend(attend, qkv, attn.num_heads)
    if att is None:
        q, k, v = qkv.view(1, m, 3, attn.num_heads, c // attn.num_heads).permute(2, 0, 3, 1, 4)
        att = attend(q, k, v).transpose(1, 2).reshape(m, c)
    return _Replayed.apply(att, attn.c_proj.weight, attn.c_proj.bias, x, xm)


def replay_mlp(xm: Tensor, blk, out: Tensor) -> Tensor:
    """The MLP half of `block` for rows xm [R,C] (the residual after attention), the
    block's output out [R,C] given: the layer norm, the first product and the GELU are
    run again (keeping the [R,4C] product would more than double what a tape keeps), the
    output product is not. Rows are independent here, so any subset of a block's rows
    can be replayed on its own."""
    c, mlp, ln = xm.shape[1], blk.mlp, blk.ln_2
    h = F.layer_norm(xm, (c,), ln.weight, ln.bias, ln.eps)
    g = gelu_tanh(linear(h, mlp.c_fc.weight, mlp.c_fc.bias))
    return _Replayed.apply(g, mlp.c_proj.weight, mlp.c_proj.bias, xm, out)


def lm_head(model, hidden: Tensor, packed: Packed | None = None) -> Tensor:
    """Logits [..., V] from final hidden states [..., C] (the tied output matrix, no bias)."""
    w = model.lm_head.weight  # [V, C]
    if packed is not None and id(w) in packed:
        return _dnn(hidden, packed[id(w)], None)
    return linear(hidden.reshape(-1, hidden.shape[-1]), w.t(), None).view(*hidden.shape[:-1], -1)


def final_norm(model, x: Tensor) -> Tensor:
    ln = model.transformer.ln_f
    return F.layer_norm(x, (x.shape[-1],), ln.weight, ln.bias, ln.eps)

