"""GPT-2 forward passes over left-padded (prompt, completion) batches.

Left-padded batches need explicit positions `cumsum(mask) - 1`: a plain
transformers forward counts the padding (~9 nats off per sequence), so
every forward here passes them.

The fast path (`completion_hidden`, `CompletionLogits`, `completion_logprobs`)
is a functional GPT-2 over the model's own parameters that shares each prompt's
forward among its rows: a GRPO batch repeats every prompt G times, so the
prompt is run once per distinct prompt and its keys/values are gathered for the
G completions (gradients flow back through the gather and sum over the group).
Same maths as one forward per row, about half the FLOPs at G = 8 when prompt
and completion are of similar length. GELU is GPT-2's tanh form (`gelu_new`): fused
into oneDNN's product where that runs it; without gradients otherwise, and in the update's
replay, on CPU as a * sigmoid(2u) (`gelu_tanh`, the native kernel where it builds), the same
function at a fraction of torch's tanh cost; the teacher-forced training forward keeps
torch's (its backward keeps one tensor less).
Log-probs are taken in row chunks sized by the vocabulary, so an [N, T, V] log-softmax is
never materialised for the whole batch at once.

On CPU the matrix products go through oneDNN or MKL (`linear`, `CPU_MATMUL`, set by the
`cpu_matmul` setting: a fixed choice per machine, recorded in each checkpoint). Decoding uses oneDNN weights packed once per rollout
(`pack_weights`). torch.compile is not used: inductor cannot lower oneDNN's linear over
packed or training weights, and compiled unpacked decoding ran slower than eager.
Recomputing layer norms and GELUs in backward (`recompute`) trades time for memory, so it
is an option. Measured figures: benchmarks/README.md.

`block` can hand its activations to a `tape.Tape` while sampling, and `replay_attention`
and `replay_mlp` differentiate a block from them, running only one of its four matrix
products again (the update then skips two thirds of the policy's forward).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import native

# Elements of [rows, T, V] float32 logits per log-prob chunk (64 MiB).
LOGPROB_CHUNK_ELEMENTS = 1 << 24

Attend = Callable[[Tensor, Tensor, Tensor], Tensor]


def positions_from_mask(mask: Tensor) -> Tensor:
    """[N,S] attention mask -> [N,S] positions counting real tokens from 0 (pads get 0)."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def check_gpt2(model) -> None:
    """Raise unless model is a GPT-2 whose maths the functional forward reproduces."""
    cfg = model.config
    if cfg.model_type != "gpt2" or cfg.activation_function not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ValueError(f"the fast GPT-2 forward supports GPT-2 with tanh GELU, got "
                         f"{cfg.model_type}/{cfg.activation_function}")
    if getattr(cfg, "scale_attn_by_inverse_layer_idx", False) or getattr(
            cfg, "reorder_and_upcast_attn", False) or not getattr(cfg, "scale_attn_weights", True):
        raise ValueError("the fast GPT-2 forward does not support GPT-2 attention variants")


ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _dnn(x: Tensor, w_out_in: Tensor, b: Tensor | None, gelu: bool = False) -> Tensor:
    """oneDNN x @ w_out_in^T + b (optionally with tanh GELU fused), any leading dims."""
    return torch.ops.mkldnn._linear_pointwise(x, w_out_in, b, "gelu" if gelu else "none", [],
                                              "tanh" if gelu else "")


def _cpu_vendor() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


CPU_MATMUL_CHOICES = ("auto", "onednn", "blas", "mkl")


def resolve_cpu_matmul(choice: str) -> str:
    """The library that takes the float32 CPU matrix products for a `cpu_matmul` setting:
    onednn: oneDNN for every product; blas: MKL for the products of training and of
    decoding, oneDNN for no-grad forwards of at least BLAS_DNN_MIN_ROWS rows (the reference
    pass); mkl: MKL for every product but decoding's, which use oneDNN-packed copies of
    every block matrix. Either way a linear followed by GELU without gradients goes
    through oneDNN with the GELU fused, except under mkl. auto: blas on Intel, mkl
    elsewhere, a fixed choice per machine (never timed: a timing race under load gave
    the same seed different weights in different processes). Without oneDNN: blas."""
    choice = str(choice).lower()
    if choice not in CPU_MATMUL_CHOICES:
        raise ValueError(f"cpu_matmul (ROOKWORLD_CPU_MATMUL) must be one of "
                         f"{', '.join(CPU_MATMUL_CHOICES)}, got {choice!r}")
    if not ONEDNN:
        return "blas"
    if choice == "auto":
        return "blas" if _cpu_vendor() == "GenuineIntel" else "mkl"
    return choice


def set_cpu_matmul(choice: str) -> str:
    """Make `choice` (resolved) the library of this process's products; returns it."""
    global CPU_MATMUL
    CPU_MATMUL = resolve_cpu_matmul(choice)
    return CPU_MATMUL


CPU_MATMUL = resolve_cpu_matmul(os.environ.get("ROOKWORLD_CPU_MATMUL", "auto"))
BLAS_DNN_MIN_ROWS = 64


def _trains_in_onednn(x: Tensor) -> bool:
    """Whether products with gradients over x go through oneDNN (CPU_MATMUL=onednn)."""
    return ONEDNN and CPU_MATMUL == "onednn" and x.device.type == "cpu" \
        and x.dtype == torch.float32


def _train_product(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    """x [M,K] @ w [K,N] + b (the GPT-2 Conv1D layout) as a product with gradients is
    taken, without a graph: for the autograd Functions below."""
    return _dnn(x, w.t(), b) if _trains_in_onednn(x) else _blas(x, w, b)


def _train_product_grads(x: Tensor, w: Tensor, gy: Tensor, needs: tuple[bool, bool, bool]
                         ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """Gradients of x @ w + b for gy: (x, w, b), None where not needed; grad_x through
    oneDNN when the product went there, grad_w through torch.mm (MKL)."""
    gx = None
    if needs[0]:
        gx = _dnn(gy, w, None) if _trains_in_onednn(gy) else gy @ w.t()
    gw = torch.mm(x.t(), gy) if needs[1] else None
    gb = gy.sum(0) if needs[2] else None
    return gx, gw, gb


# gelu_tanh(a) = a (1 + tanh(u)) / 2 = a sigmoid(2u), 2u = a (GELU_C1 + GELU_C3 a^2): the
# same function through torch's sigmoid, about twice as fast as its tanh on CPU
# (benchmarks/README.md), within 1e-6 of it in float64
GELU_C1 = 2 * math.sqrt(2 / math.pi)
GELU_C3 = GELU_C1 * 0.044715


def _gelu_gate(a: Tensor) -> Tensor:
    """sigmoid(a (C1 + C3 a^2)), a new tensor: gelu_tanh(a) = a * _gelu_gate(a)."""
    return (a * a).mul_(GELU_C3).add_(GELU_C1).mul_(a).sigmoid_()


def _native_gelu(*tensors: Tensor):
    """The native GELU kernels (`native.gelu_kernels`) when they take these tensors
    (contiguous float32 on CPU), else None."""
    if all(t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous()
           for t in tensors):
        return native.gelu_kernels()
    return None


def gelu_tanh(a: Tensor) -> Tensor:
    """GPT-2's tanh GELU of a product's fresh output a. On CPU through the sigmoid form:
    in place without gradients, `Gelu` with them, each in one pass through the native
    kernel where it runs (`native`); elsewhere torch's (the sigmoid form's speed was
    measured on CPU only)."""
    if a.device.type != "cpu":
        return F.gelu(a, approximate="tanh")
    if torch.is_grad_enabled() and a.requires_grad:
        return Gelu.apply(a)
    kernels = _native_gelu(a)
    if kernels is not None:
        kernels[0](a.data_ptr(), a.numel())
        return a
    return a.mul_(_gelu_gate(a))


class Gelu(torch.autograd.Function):
    """GPT-2's tanh GELU through the sigmoid form (see GELU_C1), keeping the gate s: its
    backward, s (1 + a (1 - s) (C1 + 3 C3 a^2)), needs no transcendental function. Each
    direction is one pass through the native kernel where it runs; through torch, the
    backward takes eight elementwise passes, still faster than torch's tanh GELU
    (benchmarks/README.md)."""

    @staticmethod
    def forward(ctx, a):
        kernels = _native_gelu(a)
        if kernels is None:
            s = _gelu_gate(a)
            y = a * s
        else:
            y, s = torch.empty_like(a), torch.empty_like(a)
            kernels[1](a.data_ptr(), y.data_ptr(), s.data_ptr(), a.numel())
        ctx.save_for_backward(a, s)
        return y

    @staticmethod
    def backward(ctx, gy):
        a, s = ctx.saved_tensors
        gy = gy.contiguous()
        kernels = _native_gelu(a, s, gy)
        if kernels is not None:
            dx = torch.empty_like(a)
            kernels[2](gy.data_ptr(), a.data_ptr(), s.data_ptr(), dx.data_ptr(), a.numel())
            return dx
        t = (a * a).mul_(3 * GELU_C3).add_(GELU_C1).mul_(a)
        return t.addcmul_(t, s, value=-1).add_(1).mul_(s).mul_(gy)


class _OneDNNLinear(torch.autograd.Function):
    """x [M,K] @ w [K,N] + b through oneDNN's matmul (CPU_MATMUL=onednn, with gradients)."""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        return _dnn(x, w.t(), b)

    @staticmethod
    def backward(ctx, gy):
        x, w = ctx.saved_tensors
        return _train_product_grads(x, w, gy, ctx.needs_input_grad)


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


Packed = dict[int, Tensor]  # id(weight) -> oneDNN-packed copy (see pack_weights)


def _blas(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    return x @ w if b is None else torch.addmm(b, x, w)


def linear(x: Tensor, w: Tensor, b: Tensor | None, gelu: bool = False,
           packed: Packed | None = None) -> Tensor:
    """x [M,K] @ w [K,N] + b, then tanh GELU when gelu. Float32 on CPU: through the library
    CPU_MATMUL picks, and through oneDNN with the GELU fused when no gradient is needed
    (not under mkl);
    elsewhere torch.addmm. packed: no-grad only, oneDNN-packed copies of weights from
    pack_weights (faster at small M)."""
    if packed is not None and id(w) in packed:
        return _dnn(x, packed[id(w)], b, gelu)
    cpu32 = ONEDNN and x.device.type == "cpu" and x.dtype == torch.float32
    if cpu32 and CPU_MATMUL != "mkl" and not (
            torch.is_grad_enabled() and (x.requires_grad or w.requires_grad)):
        if gelu or CPU_MATMUL == "onednn" or x.shape[0] >= BLAS_DNN_MIN_ROWS:
            return _dnn(x, w.t(), b, gelu)
    if _trains_in_onednn(x):  # with gradients
        y = _OneDNNLinear.apply(x, w, b)
    else:
        y = _blas(x, w, b)
    if not gelu:
        return y
    return F.gelu(y, approximate="tanh") if torch.is_grad_enabled() and y.requires_grad \
        else gelu_tanh(y)


def pack_weights(model, rows: int) -> Packed | None:
    """oneDNN-packed copies of the block matrices that go through oneDNN (all of them and
    the output matrix when CPU_MATMUL is onednn or mkl, the GELU ones when blas) for no-grad
    forwards of about `rows` rows (decoding); None off CPU. Pack again after the weights
    change (the copies do not follow them)."""
    w0 = model.transformer.wte.weight
    if not (ONEDNN and w0.device.type == "cpu" and w0.dtype == torch.float32):
        return None
    every = CPU_MATMUL in ("onednn", "mkl")
    with torch.no_grad():
        out = {}
        for blk in model.transformer.h:
            lins = (blk.attn.c_attn, blk.attn.c_proj, blk.mlp.c_fc, blk.mlp.c_proj) if every \
                else (blk.mlp.c_fc,)
            for lin in lins:
                # oneDNN reorders straight from the transposed view (same packed
                # result as from a contiguous copy, without making that copy)
                out[id(lin.weight)] = torch.ops.mkldnn._reorder_linear_weight(lin.weight.t(),
                                                                              rows)
        if every:
            out[id(model.lm_head.weight)] = torch.ops.mkldnn._reorder_linear_weight(
                model.lm_head.weight.contiguous(), rows)
    return out


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
    _GeluLinear), of ~17C a layer keeps otherwise: less memory for a slower update
    (benchmarks/README.md, ablations)."""
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


def prefill_mask(prompt_mask: Tensor) -> Tensor:
    """[N,P] left-padded mask -> [N,1,P,P] bool: causal over real keys; a pad query
    attends to itself only (no all-masked rows, no NaN)."""
    p = prompt_mask.shape[1]
    causal = torch.ones(p, p, dtype=torch.bool, device=prompt_mask.device).tril()
    eye = torch.eye(p, dtype=torch.bool, device=prompt_mask.device)
    return causal & (prompt_mask.bool()[:, None, None, :] | eye)


def unique_prompts(prompt_ids: Tensor, prompt_mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """[N,P] ids and mask -> (ids [U,P], mask [U,P], index [N]) with row i = unique
    row index[i]; U <= N distinct (ids, mask) rows."""
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


def prompt_forward(model, ids: Tensor, mask: Tensor, on_kv: Callable[[int, Tensor, Tensor], None],
                   keep: Callable[[int], Keep] | None = None) -> Tensor:
    """Forward of left-padded prompts ids/mask [U,P]; on_kv(layer, k, v) receives every
    layer's keys/values [U,H,P,D]; keep(layer) gives each block's `keep` (keep(n_layer)
    receives the final residual as "x"). Returns the final-normed last-position hidden
    [U,C]."""
    tr = model.transformer
    x = tr.wte(ids) + tr.wpe(positions_from_mask(mask))
    attn_mask = prefill_mask(mask)
    for i, blk in enumerate(tr.h):
        def attend(q, k, v, i=i):
            on_kv(i, k, v)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        x = block(x, blk, attend, keep=keep(i) if keep else None)
    if keep:
        keep(len(tr.h))("x", x)
    return final_norm(model, x[:, -1])


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


def completion_hidden(model, prompt_ids: Tensor, prompt_mask: Tensor,
                      completion_ids: Tensor, recompute: bool = False) -> Tensor:
    """Teacher-forced final hidden states [N,T,C]: row t predicts completion_ids[:, t].

    prompt_ids/prompt_mask [N,P] left-padded, completion_ids [N,T]. Each distinct prompt
    runs once; completion tokens after end-of-text stay attendable (nothing scored
    attends to them: they come later). The distinct prompts' tokens and the completion
    tokens go through every matrix product of a layer together, as one [U*P + N*(T-1), C]
    matrix; only attention treats them apart (prompts causally among themselves,
    completions over their group's prompt and their own earlier tokens). recompute: the
    layer norms and GELUs are recomputed in backward instead of kept (`block`)."""
    uniq, u_mask, index = unique_prompts(prompt_ids, prompt_mask)
    order, g = group_order(index, uniq.shape[0])
    n, t = completion_ids.shape
    if t == 1:
        return to_rows(prompt_forward(model, uniq, u_mask, lambda i, k, v: None),
                       order, g)[:, None]
    tr, p = model.transformer, prompt_ids.shape[1]
    u, mp, mc = uniq.shape[0], uniq.shape[0] * p, n * (t - 1)
    ids = completion_ids[:, :-1]  # the last token predicts nothing that is scored
    pos = prompt_mask.sum(-1, keepdim=True) + torch.arange(t - 1, device=ids.device)
    x = torch.cat([(tr.wte(uniq) + tr.wpe(positions_from_mask(u_mask))).reshape(mp, -1),
                   (tr.wte(ids) + tr.wpe(pos)).reshape(mc, -1)])[None]  # [1, M, C]
    attend = prompt_completion_attention(u_mask, prompt_mask, order, g, t - 1)
    for blk in tr.h:
        x = block(x, blk, attend, recompute=recompute)
    last = to_rows(final_norm(model, x[0, :mp].view(u, p, -1)[:, -1]), order, g)
    return torch.cat([last[:, None], final_norm(model, x[0, mp:]).view(n, t - 1, -1)], dim=1)


class CompletionLogits(nn.Module):
    """The policy's teacher-forced logits as a module, so DistributedDataParallel can
    wrap it: forward(prompt_ids, prompt_mask, completion_ids) -> logits [N,T,V] float32.
    recompute: layer norms and GELUs recomputed in backward (less activation memory)."""

    def __init__(self, model, recompute: bool = False):
        super().__init__()
        check_gpt2(model)
        self.model, self.recompute = model, recompute

    def forward(self, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor) -> Tensor:
        hidden = completion_hidden(self.model, prompt_ids, prompt_mask, completion_ids,
                                   self.recompute)
        return lm_head(self.model, hidden).float()


def logprob_chunk_rows(t: int, v: int, elements: int = LOGPROB_CHUNK_ELEMENTS) -> int:
    """Rows per log-prob chunk so that [rows, t, v] holds at most `elements` (>= 1)."""
    return max(1, elements // max(1, t * v))


def token_logprobs_from_hidden(model, hidden: Tensor, ids: Tensor, temperature: Tensor) -> Tensor:
    """log softmax(lm_head(hidden) / temperature)[ids]: hidden [N,T,C], ids [N,T] long,
    temperature [N] -> [N,T] float32, in row chunks (no whole-batch [N,T,V] tensor)."""
    n, t = ids.shape
    rows = logprob_chunk_rows(t, model.lm_head.weight.shape[0])
    out = []
    for i in range(0, n, rows):
        logits = lm_head(model, hidden[i:i + rows]).float() / temperature[i:i + rows, None, None]
        picked = logits.gather(-1, ids[i:i + rows, :, None]).squeeze(-1)
        out.append(picked - torch.logsumexp(logits, dim=-1))
    return torch.cat(out)


@torch.no_grad()
def completion_logprobs(model, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
                        temperature: Tensor, micro_batch: int = 0) -> Tensor:
    """No-grad log-probs [N,T] of completion_ids under model (reference or old policy),
    rows in chunks of micro_batch (0 = all) for the forward, vocab-sized chunks for
    the log-softmax. temperature [N]."""
    def fn(pi, pm, ci, tt):
        hidden = completion_hidden(model, pi, pm, ci)
        return token_logprobs_from_hidden(model, hidden, ci, tt)
    return chunked(fn, micro_batch, prompt_ids, prompt_mask, completion_ids, temperature)


def completion_logits(model, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
                      completion_mask: Tensor, temperature: float = 1.0) -> Tensor:
    """A model's own forward (rookworld's `gpt2.GPT2LMHeadModel`, or transformers' class
    from `to_transformers()`): logits [N,T,V] predicting each completion token, divided by
    temperature. Reference for the fast path's tests."""
    ids = torch.cat([prompt_ids, completion_ids], dim=1)
    mask = torch.cat([prompt_mask, torch.ones_like(completion_mask)], dim=1)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask),
                use_cache=False)
    p, t = prompt_ids.shape[1], completion_ids.shape[1]
    logits = out.logits[:, p - 1:p - 1 + t].float()
    return logits / temperature if temperature not in (0, 1) else logits


def chunked(fn: Callable[..., Tensor], chunk: int, *tensors: Tensor) -> Tensor:
    """Apply fn to row-chunks of the tensors and concatenate the results along dim 0."""
    n = tensors[0].shape[0]
    chunk = n if chunk <= 0 else chunk
    return torch.cat([fn(*(t[i:i + chunk] for t in tensors)) for i in range(0, n, chunk)])
