"""The tests' reference for the fast forward: a model's own plain forward over prompt +
completion (rookworld's `gpt2.GPT2LMHeadModel`, or transformers' class from
`to_transformers()`), with positions from the mask as every rookworld forward takes them."""

import torch
from torch import Tensor

from rookworld.gpt2 import positions_from_mask


def plain_completion_logits(model, prompt_ids: Tensor, prompt_mask: Tensor,
                            completion_ids: Tensor, temperature: float = 1.0) -> Tensor:
    """Logits [N,T,V] float32 predicting each completion token, divided by temperature,
    from one forward of the model over the left-padded prompts and the completions."""
    ids = torch.cat([prompt_ids, completion_ids], dim=1)
    mask = torch.cat([prompt_mask, torch.ones_like(completion_ids)], dim=1)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask),
                use_cache=False)
    p, t = prompt_ids.shape[1], completion_ids.shape[1]
    logits = out.logits[:, p - 1:p - 1 + t].float()
    return logits / temperature if temperature not in (0, 1) else logits
