"""GPT-2 forward passes over left-padded (prompt, completion) batches.

Left-padded batches need explicit positions `cumsum(mask) - 1`
(`gpt2.positions_from_mask`): a plain transformers forward counts the padding (~9 nats
off per sequence), so every forward here passes them.

The fast path (`completion_hidden`, `CompletionLogits`, `completion_logprobs`)
is a functional GPT-2 over the model's own parameters that shares each prompt's
forward among its rows: a GRPO batch repeats every prompt G times, so the
prompt is run once per distinct prompt and its keys/values are gathered for the
G completions (gradients flow back through the gather and sum over the group).
Same maths as one forward per row, about half the FLOPs at G = 8 when prompt
and completion are of similar length. GELU is GPT-2's tanh form (`gelu_new`): fused
into oneDNN's product where that runs it; without gradients otherwise, and in the update's
replay, on CPU as a * sigmoid(2u) (`gelu.gelu_tanh`, the native kernel where it builds), the
same function at a fraction of torch's tanh cost; the teacher-forced training forward keeps
torch's (its backward keeps one tensor less).
Log-probs are taken in row chunks sized by the vocabulary (`backends.logprobs`), so an
[N, T, V] log-softmax is never materialised for the whole batch at once.

On CPU the matrix products go through oneDNN or MKL (`matmul.linear`, `CPU_MATMUL`,
set by `runtime.setup` from the `cpu_matmul` setting: a fixed choice per machine, recorded
in each checkpoint). Decoding uses oneDNN weights packed once per rollout
(`matmul.pack_weights`). torch.compile is not used: inductor cannot lower oneDNN's linear
over packed or training weights, and compiled unpacked decoding ran slower than eager.
Recomputing layer norms and GELUs in backward (`recompute`) trades time for memory, so it
is an option. Measured figures: benchmarks/README.md.

`blocks.block` can hand its activations to a `tape.Tape` while sampling, and
`blocks.replay_attention` and `blocks.replay_mlp` differentiate a block from them, running
only one of its four matrix products again (the update then skips two thirds of the
policy's forward).

This module holds the whole-model passes; the parts are `matmul` (matrix library,
`linear`, packing), `gelu`, `blocks` (blocks, replay, output matrix) and `attention`
(masks, prompt sharing, attention).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...gpt2 import positions_from_mask
from ..logprobs import chunked, chunked_token_logprobs, logprob_chunk_rows
from .attention import (
    group_order,
    prefill_mask,
    prompt_completion_attention,
    to_rows,
    unique_prompts,
)
from .blocks import Keep, block, final_norm, lm_head


def check_gpt2(model) -> None:
    """Raise unless model is a GPT-2 whose maths the functional forward reproduces."""
    cfg = model.config
    if cfg.model_type != "gpt2" or cfg.activation_function not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ValueError(f"the fast GPT-2 forward supports GPT-2 with tanh GELU, got "
                         f"{cfg.model_type}/{cfg.activation_function}")
    if getattr(cfg, "scale_attn_by_inverse_layer_idx", False) or getattr(
            cfg, "reorder_and_upcast_attn", False) or not getattr(cfg, "scale_attn_weights", True):
        raise ValueError("the fast GPT-2 forward does not support GPT-2 attention variants")


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


def token_logprobs_from_hidden(model, hidden: Tensor, ids: Tensor, temperature: Tensor) -> Tensor:
    """log softmax(lm_head(hidden) / temperature)[ids]: hidden [N,T,C], ids [N,T] long,
    temperature [N] -> [N,T] float32, in row chunks (no whole-batch [N,T,V] tensor)."""
    rows = logprob_chunk_rows(ids.shape[1], model.lm_head.weight.shape[0])
    return chunked_token_logprobs(lambda chunk: lm_head(model, hidden[chunk]).float(), ids,
                                  temperature, rows)


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
