"""The supervised next-token loss on samples, shared by pre-training and GRPO's anchor term:
completion tokens only (prompt and padding masked), in the exact task formats.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import precision


def encode(policy, samples) -> list[tuple[list[int], int]]:
    """-> (prompt + completion + end-of-text ids, prompt length) per sample."""
    out = []
    for s in samples:
        p = policy.encode_prompt(s.prompt)
        c = policy.tokenizer(s.completion, add_special_tokens=False)["input_ids"]
        out.append((p + c + [policy.eos_id], len(p)))
    return out


def make_batch(rows: list[tuple[list[int], int]], pad_id: int):
    """Right-padded ids [B,S], labels [B,S] (-100 on prompt and padding)."""
    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (seq, plen) in enumerate(rows):
        ids[i, :len(seq)] = torch.tensor(seq)
        labels[i, plen:len(seq)] = torch.tensor(seq[plen:])
    return ids, labels


def lm_loss(model, ids, labels, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Mean next-token cross-entropy over the labelled positions; the forward runs
    under `dtype` autocast (None: as the weights are), the loss in float32."""
    with precision.autocast(dtype, ids.device):
        logits = model(input_ids=ids, use_cache=False).logits[:, :-1]
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                           labels[:, 1:].reshape(-1), ignore_index=-100)
