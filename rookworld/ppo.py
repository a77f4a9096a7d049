"""PPO's critic maths, pure functions of tensors: per-token rewards, generalised advantage
estimation (GAE), whitening, the clipped value loss and explained variance. The critic
module that produces the values is rookworld/critic.py; the policy's clipped surrogate is
`grpo.policy_loss`, shared with GRPO.

Shapes: N rows (completions), T completion tokens; mask [N,T] is 1 on a completion's own
tokens (a right-padded prefix of each row). Value t estimates the return from the state
that emits token t (the prompt and completion[:t]); the verifiable reward arrives with
the row's last token, and the state after it is terminal (value 0).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .grpo import token_mean


def last_token_index(mask: Tensor) -> Tensor:
    """[N] index of each row's last masked token (0 for an empty row)."""
    return (mask.sum(-1).long() - 1).clamp_min(0)


def token_rewards(scores: Tensor, mask: Tensor, kl: Tensor | None = None,
                  beta: float = 0.0) -> Tensor:
    """[N,T]: each row's score on its last token, minus beta x kl [N,T] on every token (the
    KL-in-reward penalty of RLHF PPO; kl None or beta 0: none). Zero off the mask."""
    mask = mask.to(scores.dtype)
    r = torch.zeros_like(mask)
    r.scatter_(1, last_token_index(mask)[:, None], scores[:, None].to(r.dtype))
    r = r * mask
    if kl is not None and beta:
        r = r - beta * kl * mask
    return r


def gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float
        ) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over each row's tokens -> (advantages, returns),
    both [N,T] and zero off the mask:
        delta_t = r_t + gamma V_{t+1} - V_t,   A_t = delta_t + gamma lam A_{t+1},
    with V and A zero past a row's last token (the episode ends there); returns = A + V.
    lam 1 gives the discounted return minus V; lam 0 the one-step TD error."""
    mask = mask.to(values.dtype)
    values, rewards = values * mask, rewards * mask
    adv = torch.zeros_like(values)
    next_v = torch.zeros_like(values[:, 0])
    next_a = torch.zeros_like(values[:, 0])
    for t in range(values.shape[1] - 1, -1, -1):
        delta = rewards[:, t] + gamma * next_v - values[:, t]
        a = (delta + gamma * lam * next_a) * mask[:, t]
        adv[:, t] = a
        next_v, next_a = values[:, t], a
    return adv, (adv + values) * mask


def whiten(x: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """x normalised to mean 0 and std 1 over the masked entries (unbiased std, as TRL's
    and verl's masked_whiten); zero off the mask, and zero everywhere for an empty mask."""
    mask = mask.to(x.dtype)
    n = mask.sum().clamp_min(1)
    mean = (x * mask).sum() / n
    var = (((x - mean) * mask) ** 2).sum() / (n - 1).clamp_min(1)
    return (x - mean) * torch.rsqrt(var + eps) * mask


def value_loss(values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor,
               cliprange_value: float | None) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO's clipped value loss, the token mean of
        0.5 max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2)
    (unclipped 0.5 (V - R)^2 when cliprange_value is None) -> (loss, metrics:
    value/loss, value/clip_frac (share of tokens where the clipped term is larger))."""
    err = (values - returns) ** 2
    if cliprange_value is None:
        per_token, clipped = err, torch.zeros_like(err, dtype=torch.bool)
    else:
        v_clip = old_values + (values - old_values).clamp(-cliprange_value, cliprange_value)
        err_clip = (v_clip - returns) ** 2
        # clipped: outside the range (inside it, old + (v - old) can round one ulp off v)
        outside = (values - old_values).abs() > cliprange_value
        per_token, clipped = torch.maximum(err, err_clip), outside & (err_clip > err)
    loss = 0.5 * token_mean(per_token, mask)
    return loss, {"value/loss": loss.detach(),
                  "value/clip_frac": token_mean(clipped.to(values.dtype), mask).detach()}


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """1 - Var(R - V) / Var(R) over the masked tokens: 1 = the values predict the returns,
    0 = no better than their mean, negative = worse (nan when the returns do not vary)."""
    m = mask.bool()
    r, v = returns[m].double(), values[m].double()
    var = r.var(unbiased=False)
    return float("nan") if var == 0 else float(1 - (r - v).var(unbiased=False) / var)
