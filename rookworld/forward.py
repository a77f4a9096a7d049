"""Teacher-forced forward passes over (prompt, completion) batches.

Left-padded batches need explicit `position_ids = cumsum(mask) - 1`: a plain
transformers forward would count the padding (SPEC: ~9 nats off per sequence).
Rows are processed in chunks so [N,T,V] log-softmax is never materialised for
the whole batch at once.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .sampling import positions_from_mask


def completion_logits(model, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
                      completion_mask: Tensor, temperature: float = 1.0) -> Tensor:
    """-> logits [N,T,V] predicting each completion token (divided by temperature)."""
    ids = torch.cat([prompt_ids, completion_ids], dim=1)
    # Completion tokens after end-of-text are masked for the loss but kept attendable
    # (they are never attended to by a scored token anyway: they come later).
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
