"""The policy interface the engine talks to, and how a run picks its implementation.

A backend runs the operations of a GRPO step on a causal LM: sample completions for
prompts (`sample` -> `sampling.Rollout`), the log-probs of given completions without
gradients (`logprobs`: the reference and old-policy passes), and the teacher-forced
logits over the completion as a module (`logits_module`: the update's forward, with
gradients, and the full_* KL estimators' reference logits). Temperatures follow the
sampler: log-probs and logits are those of logits / temperature, a tensor of each row's
(the engine passes 1 for a greedy task, whose sampled tokens are scored at temperature 1).

`fast_gpt2` (rookworld's own GPT-2 on CPU: functional forward, native kernels, rollout
tape) and `hf` (any transformers causal LM, any device) implement it, both taking token
log-probs through `logprobs` (one function, one chunking rule).
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor, nn

from .. import precision
from ..engine_settings import check_backend
from ..gpt2 import is_rookworld_gpt2
from ..sampling import Rollout, SamplingSettings


class Backend(Protocol):
    """name: as in the `backend` key; uses_tape: whether `sample` can keep its forward
    for the update (`fast_gpt2.tape.Tape`); a backend that cannot ignores tape_budget."""

    name: str
    uses_tape: bool

    def sample(self, model, prompts: list[list[int]], settings: SamplingSettings, eos_id: int,
               generator: torch.Generator | None = None, tape_budget: int = 0,
               constraint=None) -> Rollout:
        """One completion per prompt (N id lists, left-padded to
        settings.pad_to_multiple_of with eos_id), rows of a group next to each other;
        constraint: the tokens each row may write (`sampling.decode_tokens`)."""

    def logprobs(self, model, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
                 temperature: Tensor, micro_batch: int = 0) -> Tensor:
        """No-grad log-probs [N,T] float32 of completion_ids after left-padded prompts
        [N,P] under logits / temperature [N]; rows in chunks of micro_batch (0 = all)."""

    def logits_module(self, model, recompute: bool = False) -> nn.Module:
        """forward(prompt_ids, prompt_mask, completion_ids) -> logits [N,T,V] float32
        predicting each completion token (before temperature), with gradients."""

    def hidden(self, model, prompt_ids: Tensor, prompt_mask: Tensor,
               completion_ids: Tensor) -> Tensor:
        """The final (normed) hidden states [N,T,C] whose logits predict each completion
        token, with gradients: what a value head reads (rookworld/critic.py)."""

    def prepare(self, model) -> nn.Module:
        """The model as this backend runs it (the engine's copy: dtype, class)."""


def resolve(choice: str, model, device, autocast: torch.dtype | None = None) -> Backend:
    """The backend for `choice` (auto | fast_gpt2 | hf): auto is fast_gpt2 for
    rookworld's GPT-2 class on CPU, hf otherwise (autocast: the
    `precision.autocast_dtype` the run uses; fast_gpt2 takes bf16 on the CPU only, as
    bf16 products, `fast_gpt2.matmul.low_precision`)."""
    from .fast_gpt2 import FastGPT2
    from .hf import HFBackend

    check_backend(choice, "bf16" if autocast is not None else "off", str(device),
                  hf_model=not is_rookworld_gpt2(model))
    if choice == "auto":
        choice = "fast_gpt2" if is_rookworld_gpt2(model) and \
            torch.device(device).type == "cpu" else "hf"
    return FastGPT2() if choice == "fast_gpt2" else HFBackend()


def choose(choice: str, model, device, autocast: str) -> tuple[Backend, torch.dtype | None,
                                                               torch.dtype | None]:
    """(backend, amp, products) for a run's `backend` and `autocast` settings: amp is
    torch.autocast's dtype (hf), products fast_gpt2's own bf16 products
    (`precision.products_dtype`); a backend=fast_gpt2 run keeps auto's float32 on a GPU."""
    amp = None if choice == "fast_gpt2" and autocast == "auto" else \
        precision.autocast_dtype(autocast, device)
    backend = resolve(choice, model, device, amp)
    if backend.name == "fast_gpt2":
        return backend, None, precision.products_dtype(autocast, device)
    return backend, amp, None


def of(policy) -> Backend:
    """The policy's backend: the one its engine chose; else, for a policy no engine
    prepared, fast_gpt2 for rookworld's GPT-2 class on any device (the hf backend runs the
    engine's transformers copy of it, `HFBackend.prepare`) and hf for any other model."""
    backend = getattr(policy, "backend", None)
    if backend is None:
        from .fast_gpt2 import FastGPT2
        from .hf import HFBackend

        backend = FastGPT2() if is_rookworld_gpt2(policy.model) else HFBackend()
    return backend
