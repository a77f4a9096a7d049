"""What every backend's sampler shares: its settings (`SamplingSettings`,
`per_task_settings`), left padding (`left_pad`), the token loop (`decode_tokens`) and its
result (`Rollout`).

The loop stops early when every row has written end-of-text and keeps each sampled
token's log-probability under the policy (`log_softmax(logits / temperature)`, full
vocabulary, before top-k/top-p filtering) so the PPO ratio can use it as the old policy's
log-prob; with a token constraint (`legal_mask`: evaluation and play only) it is the masked
distribution's. The loss trains on exactly these sampled ids; nothing is re-tokenised. The
backends run the model (`backends.fast_gpt2.decode`: a preallocated KV cache; `backends.hf`:
transformers' own).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

__all__ = ["LEGAL_MOVES", "NonFiniteLogits", "Rollout", "SamplingSettings", "decode_tokens",
           "filter_logits", "left_pad", "per_task_settings"]


LEGAL_MOVES = ("free", "mask")  # SamplingSettings.legal_moves


@dataclass(frozen=True)
class SamplingSettings:
    """temperature: 0 means greedy; top_k: 0 = off; top_p: 1.0 = off;
    max_new_tokens: completion budget; min_new_tokens: end-of-text is masked before it;
    pad_to_multiple_of: prompts are left-padded (masked) to a width that is a multiple of
    this (`left_pad`); 1 = the longest prompt's, the default: on CPU a wider pad buys
    neither memory nor speed (benchmarks/README.md, ablations); legal_moves: "free" or
    "mask" (the P task's B: move decoded only along legal moves: callers pass
    `legal_mask.legal_move_constraint` to `sample`; evaluation and play only)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 160
    min_new_tokens: int = 0
    pad_to_multiple_of: int = 1
    legal_moves: str = "free"

    def __post_init__(self):
        checks = [(self.temperature >= 0, "temperature", ">= 0"),
                  (self.top_k >= 0, "top_k", ">= 0"),
                  (0 < self.top_p <= 1, "top_p", "in (0, 1]"),
                  (self.max_new_tokens >= 1, "max_new_tokens", ">= 1"),
                  (0 <= self.min_new_tokens <= self.max_new_tokens, "min_new_tokens",
                   "in [0, max_new_tokens]"),
                  (self.pad_to_multiple_of >= 1, "pad_to_multiple_of", ">= 1"),
                  (self.legal_moves in LEGAL_MOVES, "legal_moves", " or ".join(LEGAL_MOVES)),
                  (self.legal_moves == "free" or self.min_new_tokens == 0, "min_new_tokens",
                   "0 with legal_moves=mask (end-of-text may be the only legal token)")]
        for ok, key, rule in checks:
            if not ok:
                raise ValueError(f"sampler.{key} must be {rule}, got {getattr(self, key)!r}")


@dataclass
class Rollout:
    """prompt_ids/prompt_mask [N,P] left-padded; completion_ids/completion_mask [N,T]
    (mask 1 on generated tokens up to and including end-of-text); logprobs [N,T]
    policy log-probs of the sampled ids (0 where masked); truncated [N] bool:
    no end-of-text within max_new_tokens."""

    prompt_ids: Tensor
    prompt_mask: Tensor
    completion_ids: Tensor
    completion_mask: Tensor
    logprobs: Tensor
    truncated: Tensor
    # (row indices, tape): the kept forward of those rows (a backend's sample with a
    # tape_budget: `fast_gpt2.tape.Tape`)
    tapes: list[tuple[Tensor, object]] = field(default_factory=list)


def left_pad(seqs: list[list[int]], pad_id: int, multiple: int = 1) -> tuple[Tensor, Tensor]:
    """list of N id lists -> (ids [N,P], mask [N,P]) padded on the left, P the longest
    list's length rounded up to a multiple of `multiple`."""
    width = -(-max(len(s) for s in seqs) // multiple) * multiple
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s):] = 1
    return ids, mask


def filter_logits(logits: Tensor, top_k: int, top_p: float) -> Tensor:
    """[N,V] -> [N,V] with -inf outside the top-k and outside the top-p nucleus."""
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = (cum - sorted_logits.softmax(-1)) >= top_p  # keep the token crossing top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def decode_tokens(logits: Tensor, forward_one: Callable[[Tensor, int], Tensor],
                  settings: SamplingSettings, eos_id: int, generator=None, constraint=None):
    """The token loop both samplers share: logits [N,V] of the first completion token;
    forward_one(tokens [N], t) -> the next logits. Stops when every row has ended or at
    max_new_tokens. constraint: None, or an object with mask(logits [N,V]) -> logits with
    -inf at the tokens a row may not write (it may write into the step's logits, which
    nothing else reads), and advance(tokens [N]) after each choice
    (`legal_mask.LegalMoveConstraint`); the log-probs are then those of the masked
    distribution. -> (tokens [N,T], their log-probs [N,T], ended [N], width, mask [N,w])."""
    n, t_max, device = logits.shape[0], settings.max_new_tokens, logits.device
    if constraint is not None and settings.min_new_tokens:
        raise ValueError("a token constraint needs sampler.min_new_tokens=0 (end-of-text may "
                         f"be the only token it allows), got {settings.min_new_tokens}")
    out = torch.full((n, t_max), eos_id, dtype=torch.long, device=device)
    logps = torch.zeros((n, t_max), dtype=torch.float32, device=device)
    done = torch.zeros(n, dtype=torch.bool, device=device)
    length = torch.full((n,), t_max, dtype=torch.long, device=device)
    for t in range(t_max):
        banned = eos_id if t < settings.min_new_tokens else None
        step = logits.float() if constraint is None else constraint.mask(logits.float())
        tok, logp = _choose(step, settings, generator, banned)
        tok = torch.where(done, eos_id, tok)
        if constraint is not None:
            constraint.advance(tok)
        out[:, t] = tok
        logps[:, t] = torch.where(done, 0.0, logp)
        ended = ~done & (tok == eos_id)
        length = torch.where(ended, t + 1, length)
        done |= ended
        if bool(done.all()) or t == t_max - 1:
            break
        logits = forward_one(tok, t)
    width = int(length.max())
    comp_mask = (torch.arange(width, device=device)[None, :] < length[:, None]).long()
    return out, logps, done, width, comp_mask


class NonFiniteLogits(FloatingPointError):
    """The policy's logits hold inf or NaN: its weights diverged."""


def _choose(logits: Tensor, s: SamplingSettings, generator, banned: int | None = None
            ) -> tuple[Tensor, Tensor]:
    """logits [N,V] -> (token [N], its log-prob [N] under logits / temperature before any
    filter: top-k, top-p, the `banned` id of min_new_tokens; as the update computes it).
    Raises NonFiniteLogits when torch refuses to sample inf/NaN logits (no normal-path cost)."""
    scaled = logits / s.temperature if s.temperature else logits
    logp_all = scaled.log_softmax(-1)
    if banned is not None:  # out of place: logits may be the caller's tensor
        scaled = scaled.index_fill(-1, torch.tensor([banned], device=scaled.device), -torch.inf)
    if s.temperature == 0:
        tok = scaled.argmax(-1)
        return tok, logp_all.gather(-1, tok[:, None]).squeeze(-1)
    probs = filter_logits(scaled, s.top_k, s.top_p).softmax(-1)
    try:
        tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    except RuntimeError as e:
        if not torch.isfinite(logits).all():
            raise NonFiniteLogits("the policy's logits are not finite (inf or NaN): its "
                                  "weights diverged") from e
        raise
    return tok, logp_all.gather(-1, tok[:, None]).squeeze(-1)


def per_task_settings(temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                      max_new_tokens: int = 160, min_new_tokens: int = 0,
                      pad_to_multiple_of: int = 1, legal_moves: str = "free",
                      per_task: dict | None = None) -> dict[str, SamplingSettings]:
    """The `sampler` group: shared settings, each overridable per task, e.g.
    per_task={"A": {"max_new_tokens": 110}} -> {"P": SamplingSettings, "A": ...}."""
    base = dict(temperature=temperature, top_k=top_k, top_p=top_p,
                max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens,
                pad_to_multiple_of=pad_to_multiple_of, legal_moves=legal_moves)
    per_task = dict(per_task or {})
    unknown = set(per_task) - {"P", "A"}
    if unknown:
        raise ValueError(f"sampler.per_task has unknown tasks {sorted(unknown)}; use P and A")
    out = {}
    for task in ("P", "A"):
        over = dict(per_task.get(task) or {})
        bad = set(over) - set(base)
        if bad:
            raise ValueError(f"sampler.per_task.{task} has unknown keys {sorted(bad)}; "
                             f"allowed: {sorted(base)}")
        try:
            out[task] = SamplingSettings(**(base | over))
        except ValueError as e:
            raise ValueError(str(e).replace("sampler.", f"sampler.per_task.{task}.")
                             if over else str(e)) from None
    return out
