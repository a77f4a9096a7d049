"""Token log-probs of completions as every backend computes them: `grpo.token_logprobs`
of logits / temperature, in row chunks sized by one rule (`logprob_chunk_rows`), so that
no [N, T, V] float32 logits tensor is held for the whole batch at once."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..grpo import token_logprobs

# Elements of [rows, T, V] float32 logits per log-prob chunk (64 MiB).
LOGPROB_CHUNK_ELEMENTS = 1 << 24


def logprob_chunk_rows(t: int, v: int, elements: int = LOGPROB_CHUNK_ELEMENTS) -> int:
    """Rows per log-prob chunk so that [rows, t, v] holds at most `elements` (>= 1)."""
    return max(1, elements // max(1, t * v))


def chunked(fn: Callable[..., Tensor], chunk: int, *tensors: Tensor) -> Tensor:
    """Apply fn to row-chunks of the tensors and concatenate the results along dim 0."""
    n = tensors[0].shape[0]
    chunk = n if chunk <= 0 else chunk
    return torch.cat([fn(*(t[i:i + chunk] for t in tensors)) for i in range(0, n, chunk)])


def chunked_token_logprobs(logits: Callable[[slice], Tensor], ids: Tensor,
                           temperature: Tensor, rows: int) -> Tensor:
    """log softmax(logits / temperature)[ids] through `grpo.token_logprobs`, `rows` rows at
    a time: logits(chunk) gives the float32 logits [rows,T,V] of the rows in the slice
    chunk, predicting ids [N,T] (long); temperature [N] -> [N,T] float32."""
    return torch.cat([
        token_logprobs(logits(slice(i, i + rows)) / temperature[i:i + rows, None, None],
                       ids[i:i + rows])
        for i in range(0, ids.shape[0], rows)])
