"""The fast CPU GPT-2 backend (`FastGPT2`), rookworld's own GPT-2 forward in modules:

    forward.py    whole-model passes: teacher-forced hidden states and logits, log-probs
    attention.py  masks, prompt sharing, the prompts' and completions' attention
    blocks.py     one block, its replay from a tape, the final norm and output matrix
    gelu.py       GPT-2's tanh GELU through its sigmoid form
    matmul.py     the CPU matrix library, `linear`, oneDNN-packed decoding weights
    decode.py     the sampler: KV cache, prefill, one decoding step at a time
    tape.py       the sampler's kept forward, replayed by the update
    native.py     C kernels (csrc/: decoding and teacher-forced attention, GELU), built with cc
"""

from __future__ import annotations

from .decode import sample
from .forward import CompletionLogits, completion_hidden, completion_logprobs


class FastGPT2:
    """`backends.Backend` for `gpt2.GPT2LMHeadModel`, in float32."""

    name = "fast_gpt2"
    uses_tape = True

    def sample(self, model, prompts, settings, eos_id, generator=None, tape_budget=0,
               constraint=None):
        return sample(model, prompts, settings, eos_id, generator, tape_budget=tape_budget,
                      constraint=constraint)

    def logprobs(self, model, prompt_ids, prompt_mask, completion_ids, temperature,
                 micro_batch=0):
        return completion_logprobs(model, prompt_ids, prompt_mask, completion_ids, temperature,
                                   micro_batch)

    def logits_module(self, model, recompute=False):
        return CompletionLogits(model, recompute=recompute)

    def hidden(self, model, prompt_ids, prompt_mask, completion_ids):
        return completion_hidden(model, prompt_ids, prompt_mask, completion_ids)

    def prepare(self, model):
        return model.float()
