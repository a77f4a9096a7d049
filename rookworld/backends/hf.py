"""The transformers backend: any `AutoModelForCausalLM` through its own forward.

Prompts are left-padded and every real token's position counts real tokens only
(`gpt2.positions_from_mask`), as in the fast path; sampling keeps the model's own KV
cache (`past_key_values`) and chooses tokens through the fast path's loop
(`sampling.decode_tokens`: same filters, same log-prob of the sampled id under logits /
temperature).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..gpt2 import is_rookworld_gpt2, positions_from_mask
from ..sampling import Rollout, decode_tokens, left_pad
from .logprobs import chunked_token_logprobs, logprob_chunk_rows

# hf's `logprob_chunk_rows` budget (256 MiB of logits), four times the fast path's: each
# hf chunk is also a whole model forward (the fast path's is only the output layer), and
# fewer, larger forwards keep a GPU busy
LOGITS_CHUNK_ELEMENTS = 1 << 26


def max_positions(config) -> int | None:
    """The longest sequence the model's positions cover, when its config names one."""
    return getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings",
                                                            None)


def completion_logits(model, prompt_ids: Tensor, prompt_mask: Tensor,
                      completion_ids: Tensor) -> Tensor:
    """One forward over prompt + completion: logits [N,T,V] float32 predicting each
    completion token (completion positions all attended, as in the fast path)."""
    p, t = prompt_ids.shape[1], completion_ids.shape[1]
    ids = torch.cat([prompt_ids, completion_ids], dim=1)
    mask = torch.cat([prompt_mask, torch.ones_like(completion_ids)], dim=1)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask),
                   use_cache=False, logits_to_keep=t + 1).logits
    # a model that ignores logits_to_keep returns every position
    logits = logits[:, p - 1:p - 1 + t] if logits.shape[1] == p + t else logits[:, :t]
    return logits.float()


def completion_hidden(model, prompt_ids: Tensor, prompt_mask: Tensor,
                      completion_ids: Tensor) -> Tensor:
    """The final hidden states [N,T,C] (after the model's last norm, as transformers'
    last `hidden_states` entry) at the positions whose logits predict each completion
    token: the state before the token (a critic's value reads it)."""
    p, t = prompt_ids.shape[1], completion_ids.shape[1]
    ids = torch.cat([prompt_ids, completion_ids], dim=1)
    mask = torch.cat([prompt_mask, torch.ones_like(completion_ids)], dim=1)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask),
                use_cache=False, output_hidden_states=True, logits_to_keep=1)
    return out.hidden_states[-1][:, p - 1:p - 1 + t]


class CompletionLogits(nn.Module):
    """`completion_logits` as a module (DistributedDataParallel wraps it)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor) -> Tensor:
        return completion_logits(self.model, prompt_ids, prompt_mask, completion_ids)


class HFBackend:
    """`backends.Backend` for transformers causal LMs (no rollout tape)."""

    name = "hf"
    uses_tape = False

    def prepare(self, model):
        return model.to_transformers() if is_rookworld_gpt2(model) else model

    def logits_module(self, model, recompute=False):
        if recompute:
            raise ValueError("recompute_activations=true needs backend=fast_gpt2 (the hf "
                             "backend keeps transformers' forward as it is); set it to false")
        return CompletionLogits(model)

    def hidden(self, model, prompt_ids, prompt_mask, completion_ids):
        return completion_hidden(model, prompt_ids, prompt_mask, completion_ids)

    @torch.no_grad()
    def logprobs(self, model, prompt_ids, prompt_mask, completion_ids, temperature,
                 micro_batch=0):
        t = completion_ids.shape[1]  # the forward keeps t + 1 positions' logits
        rows = micro_batch if micro_batch > 0 else logprob_chunk_rows(
            t + 1, model.config.vocab_size, LOGITS_CHUNK_ELEMENTS)
        return chunked_token_logprobs(
            lambda chunk: completion_logits(model, prompt_ids[chunk], prompt_mask[chunk],
                                            completion_ids[chunk]),
            completion_ids, temperature, rows)

    @torch.no_grad()
    def sample(self, model, prompts, settings, eos_id, generator=None, tape_budget=0,
               constraint=None):
        device = next(model.parameters()).device
        prompt_ids, prompt_mask = (x.to(device) for x in left_pad(
            prompts, eos_id, settings.pad_to_multiple_of))
        n, t_max = prompt_ids.shape[0], settings.max_new_tokens
        longest, limit = max(len(p) for p in prompts), max_positions(model.config)
        if limit and longest + t_max > limit:
            raise ValueError(f"prompt ({longest}) + sampler.max_new_tokens ({t_max}) exceeds "
                             f"the model's {limit} positions")
        mask = prompt_mask
        out = model(input_ids=prompt_ids, attention_mask=mask,
                    position_ids=positions_from_mask(mask), use_cache=True, logits_to_keep=1)
        logits, cache = out.logits[:, -1], out.past_key_values
        next_pos = prompt_mask.sum(-1)

        def forward_one(tok, t):
            nonlocal mask, cache, next_pos
            mask = torch.cat([mask, mask.new_ones(n, 1)], dim=1)
            out = model(input_ids=tok[:, None], attention_mask=mask,
                        position_ids=next_pos[:, None], past_key_values=cache, use_cache=True)
            cache, next_pos = out.past_key_values, next_pos + 1
            return out.logits[:, -1]

        toks, logps, done, width, comp_mask = decode_tokens(logits, forward_one, settings,
                                                            eos_id, generator, constraint)
        return Rollout(prompt_ids, prompt_mask, toks[:, :width], comp_mask,
                       logps[:, :width] * comp_mask, ~done)
