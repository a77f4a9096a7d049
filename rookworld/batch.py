"""What the engine's rollout hands its update (`Batch`), the merge of per-task rollouts
(`merge_rollouts`), its metrics (`rollout_metrics`), the update's chunk size
(`micro_batch_rows`)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch
from torch import Tensor

from .backends.logprobs import logprob_chunk_rows
from .chess_tasks import Sample
from .sampling import Rollout


@dataclass
class Batch:
    """One rollout batch: N = prompts x G rows, in group order (row i is group i // G)."""

    samples: list[Sample]
    rollout: Rollout
    texts: list[str]
    temperature: Tensor          # [N] the temperature each row was sampled with
    rewards: Tensor              # [N]
    advantages: Tensor           # [N], or [N,T] per token under move credit (credit.py)
    loss_mask: Tensor            # [N,T] completion mask, zeroed for dropped groups
    ref_logprobs: Tensor | None  # [N,T]
    metrics: dict = field(default_factory=dict)
    norm_tokens: float = 0.0     # loss-mask tokens of the whole step (all ranks)
    norm_rows: int = 0           # rows of the whole step with a real token (all ranks)
    anchor: list[Sample] = field(default_factory=list)  # ground-truth samples of the anchor term
    old_values: Tensor | None = None  # [N,T] the critic's values at rollout (PPO; ppo.py)
    returns: Tensor | None = None     # [N,T] GAE's returns, the value loss's targets


def merge_rollouts(parts: list[tuple[list[int], Rollout]], n: int, pad_id: int) -> Rollout:
    """Scatter per-task rollouts (row indices, rollout) into one [N,...] rollout:
    prompts re-left-padded, completions right-padded to common widths."""
    p = max(r.prompt_ids.shape[1] for _, r in parts)
    t = max(r.completion_ids.shape[1] for _, r in parts)
    dev = parts[0][1].prompt_ids.device
    out = Rollout(torch.full((n, p), pad_id, dtype=torch.long, device=dev),
                  torch.zeros((n, p), dtype=torch.long, device=dev),
                  torch.full((n, t), pad_id, dtype=torch.long, device=dev),
                  torch.zeros((n, t), dtype=torch.long, device=dev),
                  torch.zeros((n, t), device=dev), torch.zeros(n, dtype=torch.bool, device=dev))
    for rows, r in parts:
        idx = torch.tensor(rows, device=dev)
        rp, rt = r.prompt_ids.shape[1], r.completion_ids.shape[1]
        out.prompt_ids[idx, p - rp:] = r.prompt_ids
        out.prompt_mask[idx, p - rp:] = r.prompt_mask
        out.completion_ids[idx, :rt] = r.completion_ids
        out.completion_mask[idx, :rt] = r.completion_mask
        out.logprobs[idx, :rt] = r.logprobs
        out.truncated[idx] = r.truncated
        out.tapes += [(idx[local], tape) for local, tape in r.tapes]
    return out


def micro_batch_rows(n: int, group: int, prompt_width: int, completion_width: int,
                     vocab: int, tokens: int) -> int:
    """Rows per forward/backward chunk for micro_batch=auto: the training forward keeps
    every layer's activations for the backward, so its memory grows with the tokens of
    a chunk, and the update's peak (and the process's) with the chunk, not the batch.

    A group (G rows sharing one prompt, which runs once) counts G x completion_width +
    prompt_width tokens; a chunk holds as many whole groups as fit in `tokens` (at least
    one), or, when one group is over the budget, as many rows of (prompt + completion)
    tokens as fit (at least one). Then at most logprob_chunk_rows(completion_width, vocab)
    rows, so no chunk's [rows, T, V] logits pass 64 MiB (a full GPT-2 vocabulary gives a
    few rows), and the chunks are evened out: 32 rows in chunks of 24 become 16 + 16."""
    per_group = group * completion_width + prompt_width
    if per_group <= tokens:
        rows = group * (tokens // per_group)
    else:
        rows = max(1, tokens // (completion_width + prompt_width))
    rows = min(rows, logprob_chunk_rows(completion_width, vocab), n)
    chunks = -(-n // rows)
    if rows % group == 0 and n % group == 0:
        return group * -(-(n // group) // chunks)
    return -(-n // chunks)


def rollout_metrics(rows, texts, scored, rewards, adv, zero, r, group: int) -> dict:
    """The rollout's reward, group, advantage and sample metrics: rows [N] samples, texts
    [N] completions, scored [N] `Scored`, rewards/adv [N], zero [N/G] zero-variance groups,
    r the rollout, group G."""
    m = {"reward/mean": float(rewards.mean()), "reward/std": float(rewards.std(0))
         if len(rewards) > 1 else 0.0}
    by_task = defaultdict(list)
    for s, x in zip(rows, scored):
        by_task[s.task].append(x)
    for task, xs in by_task.items():
        m[f"reward/{task}/mean"] = sum(x.score for x in xs) / len(xs)
        m[f"reward/{task}/std"] = float(torch.tensor([x.score for x in xs]).std(0)) \
            if len(xs) > 1 else 0.0
        for part in xs[0].parts:
            m[f"reward/{task}/{part}"] = sum(x.parts[part] for x in xs) / len(xs)
    groups = [texts[i:i + group] for i in range(0, len(texts), group)]
    lengths = r.completion_mask.sum(-1).float()
    m.update({
        "groups/zero_variance_share": float(zero.float().mean()),
        "groups/identical_share": sum(1 - len(set(g)) / len(g) for g in groups) / len(groups),
        "adv/std": float(adv.std(0)) if len(adv) > 1 else 0.0,
        "adv/abs_mean": float(adv.abs().mean()),
        "sample/len_mean": float(lengths.mean()), "sample/len_max": float(lengths.max()),
        "sample/truncated_share": float(r.truncated.float().mean()),
        "sample/tokens": float(lengths.sum()),
    })
    return m
