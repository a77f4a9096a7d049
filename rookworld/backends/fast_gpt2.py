"""The fast CPU GPT-2 backend: rookworld's functional forward (`forward.py`), its KV-cache
sampler with native kernels (`sampling.py`) and the rollout tape (`tape.py`)."""

from __future__ import annotations

from ..forward import CompletionLogits, completion_logprobs
from ..sampling import sample


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

    def prepare(self, model):
        return model.float()
