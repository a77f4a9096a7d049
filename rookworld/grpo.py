"""GRPO maths: log-probs, entropy, KL estimators, aggregators, advantages, policy loss.

Pure functions of tensors (no config, no model, no logging) and two tiny classes,
`GroupAdvantage` and `PolicyLoss`, that hold the settings chosen in conf/algorithm/.

Shapes: N sequences (= prompts * G, each prompt's G completions contiguous),
T completion length (padded), V vocabulary. `mask` [N, T] (bool or 0/1 float) is
1 on real completion tokens (the end-of-text token included), 0 on padding.

Papers behind the variants:
- GRPO: Shao et al. 2024 (DeepSeekMath), https://arxiv.org/abs/2402.03300
- DAPO: Yu et al. 2025, https://arxiv.org/abs/2503.14476
- Dr. GRPO: Liu et al. 2025 (Understanding R1-Zero-Like Training), https://arxiv.org/abs/2503.20783
- GSPO: Zheng et al. 2025 (Group Sequence Policy Optimization), https://arxiv.org/abs/2507.18071
- KL estimators k1/k2/k3: Schulman 2020, http://joschu.net/blog/kl-approx.html
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from .errors import check_int

# |log ratio| above this is clamped before exp, as verl does: exp(20) ~ 4.9e8 is
# finite in float32, so an exploding ratio shows in `ratio_max` instead of
# turning gradients into inf * 0 = NaN.
MAX_LOG_RATIO = 20.0



def token_logprobs(logits: Tensor, ids: Tensor) -> Tensor:
    """log pi(ids): logits [N, T, V], ids [N, T] (long) -> [N, T] float32.

    logits[:, t] must be the logits that predicted ids[:, t] (already shifted by one).
    Computed as logits[id] - logsumexp(logits) in float32: no [N, T, V] log-softmax is
    kept for backward. logsumexp still needs one [N, T, V] float32 temporary (and bf16
    logits are upcast), so with a 50k vocabulary callers chunk over N (a few sequences
    per call) instead of passing the whole batch.
    """
    logits = logits.float()
    picked = logits.gather(-1, ids.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of softmax(logits) in nats: [..., V] -> [...] float32.

    H = logsumexp(l) - sum_v p_v * l_v. Logits must be finite (raw model output, not
    top-k-masked with -inf). Chunk over N for big vocabularies, as for token_logprobs.
    """
    logits = logits.float()
    p = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (p * logits).sum(-1)


# Tokens are sampled from pi (the policy); r = ref(y) / pi(y), log r = ref_logp - logp.
# Schulman's estimators of KL(pi || ref) = E_pi[-log r]: k1 unbiased, high variance, can be
# negative; k2 biased, low variance; k3 unbiased, low variance, always >= 0 (GRPO's choice).

def kl_k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k1 = -log r = logp - ref_logp: [N, T], [N, T] -> [N, T]."""
    return logp - ref_logp


def kl_k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k2 = (log r)^2 / 2: [N, T], [N, T] -> [N, T]."""
    return 0.5 * (ref_logp - logp) ** 2


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 = r - 1 - log r = exp(ref_logp - logp) - (ref_logp - logp) - 1: [N, T] -> [N, T].

    The estimator in the GRPO paper. Padded positions must hold finite values;
    the aggregators then drop them.
    """
    log_r = ref_logp - logp
    return torch.exp(log_r) - log_r - 1.0


KL_DIRECTIONS = ("forward", "reverse", "symmetric")
FULL_CHUNK_ELEMENTS = 1 << 22  # logits per chunk of kl_full's temporaries (16 MiB in float32)


def kl_full(logits: Tensor, ref_logits: Tensor, direction: str = "forward") -> Tensor:
    """Exact KL per position over the whole vocabulary: logits [N, T, V], ref_logits
    [N, T, V] -> [N, T] float32.
      forward    KL(pi || ref) = sum_v pi_v (log pi_v - log ref_v)
      reverse    KL(ref || pi) = sum_v ref_v (log ref_v - log pi_v)
      symmetric  the mean of the two.
    Both models' logits are inputs (two [N, T, V] tensors); the log-softmaxes and products
    are taken over chunks of rows of about FULL_CHUNK_ELEMENTS logits, so the temporaries
    do not grow with N x T x V."""
    if direction not in KL_DIRECTIONS:
        raise ValueError(f"KL direction must be one of {KL_DIRECTIONS}, got {direction!r}")
    n, t, v = logits.shape
    rows = max(1, FULL_CHUNK_ELEMENTS // max(t * v, 1))
    out = []
    for i in range(0, n, rows):
        logp = torch.log_softmax(logits[i:i + rows].float(), dim=-1)
        ref = torch.log_softmax(ref_logits[i:i + rows].float(), dim=-1)
        diff = logp - ref
        fwd = (logp.exp() * diff).sum(-1) if direction != "reverse" else None
        rev = (ref.exp() * -diff).sum(-1) if direction != "forward" else None
        out.append(fwd if rev is None else rev if fwd is None else 0.5 * (fwd + rev))
    return torch.cat(out) if out else logits.new_zeros((0, t))


KL_ESTIMATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "k1": kl_k1, "k2": kl_k2, "k3": kl_k3,
}
# full_<direction>: exact KL from both models' logits (the engine calls kl_full); "full" is
# an alias of full_forward
FULL_ESTIMATORS = {"full": "forward", **{f"full_{d}": d for d in KL_DIRECTIONS}}
KL_ESTIMATOR_NAMES = (*KL_ESTIMATORS, *FULL_ESTIMATORS)


def masked_kl(name: str, logp: Tensor, ref_logp: Tensor, mask: Tensor) -> Tensor:
    """Per-token KL estimator `name` with both log-prob tensors zeroed at padded positions
    first: a pad's policy log-prob can lie far below the reference's (zeroed) one, and
    exp(ref - logp) would overflow to inf there, whose gradient `where` cannot remove."""
    m = mask.bool()
    return KL_ESTIMATORS[name](torch.where(m, logp, 0.0), torch.where(m, ref_logp, 0.0))



def _masked(x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """x with padded positions set to 0 (where, not multiply: inf * 0 would be NaN)."""
    m = mask.bool()
    return torch.where(m, x, 0.0), m


def token_mean(x: Tensor, mask: Tensor) -> Tensor:
    """DAPO's token-level mean: sum over every real token in the batch / their number.
    Long completions weigh more than short ones. [N, T], [N, T] -> scalar."""
    xm, m = _masked(x, mask)
    return xm.sum() / m.sum().clamp_min(1)


def seq_mean_token_mean(x: Tensor, mask: Tensor) -> Tensor:
    """GRPO's mean: each sequence's mean over its real tokens, then the mean over the
    sequences (`rows_in_batch`: a row with no real token, a dropped group's, is not one).
    [N, T], [N, T] -> scalar."""
    xm, m = _masked(x, mask)
    per_seq = xm.sum(-1) / m.sum(-1).clamp_min(1)
    return per_seq.sum() / max(rows_in_batch(m), 1)


def seq_mean_token_sum_norm(x: Tensor, mask: Tensor, max_len: int) -> Tensor:
    """Dr. GRPO's aggregator: sum over real tokens / (rows x max_len), with max_len a
    constant (the generation budget), so no length bias enters through the normaliser;
    rows as in `rows_in_batch`. [N, T], [N, T] -> scalar."""
    xm, m = _masked(x, mask)
    return xm.sum() / (max(rows_in_batch(m), 1) * max_len)


def rows_in_batch(mask: Tensor) -> int:
    """How many rows of mask [N, T] hold a real token: the sequences the aggregators
    average over. A row masked out whole (`zero_variance=drop`'s groups) has left the
    batch, under every agg_mode as under token_mean."""
    return int(mask.bool().any(-1).sum())


# algorithm.loss.agg_mode: how per-token values become the loss (verl's names)
AGG_MODES = ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm")


def aggregate(x: Tensor, mask: Tensor, agg_mode: str, max_len: int | None = None) -> Tensor:
    """Per-token values [N, T] -> scalar by agg_mode: seq_mean_token_mean (GRPO, GSPO),
    token_mean (DAPO) or seq_mean_token_sum_norm (Dr. GRPO, needs max_len)."""
    if agg_mode == "token_mean":
        return token_mean(x, mask)
    if agg_mode == "seq_mean_token_mean":
        return seq_mean_token_mean(x, mask)
    if agg_mode == "seq_mean_token_sum_norm":
        return seq_mean_token_sum_norm(x, mask, max_len)
    raise ValueError(f"agg_mode must be one of {AGG_MODES}, got {agg_mode!r}")


def chunk_weight(agg_mode: str, chunk_mask: Tensor, total_tokens: float, total_rows: int
                 ) -> float:
    """The share of the aggregator's normaliser held by a chunk of rows (chunk_mask [n, T]),
    so that the chunks' losses, each aggregated on its own and weighted by this, sum to the
    whole batch's loss: its share of real tokens under token_mean, of the batch's rows
    otherwise (total_rows: `rows_in_batch` of the whole batch)."""
    if agg_mode == "token_mean":
        return float(chunk_mask.sum() / max(total_tokens, 1.0))
    return rows_in_batch(chunk_mask) / max(total_rows, 1)


ADVANTAGE_SCALES = ("group", "batch", "none")
GROUP_BASELINES = ("mean", "leave_one_out")


def _grouped(rewards: Tensor, group_size: int) -> Tensor:
    """rewards [N] -> [N // G, G] float64, checking the shapes."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
    if group_size < 2 or rewards.numel() % group_size:
        raise ValueError(f"group_size must be >= 2 and divide N={rewards.numel()}, "
                         f"got {group_size}")
    return rewards.double().view(-1, group_size)


def normalise_groups(r: Tensor, scale: str = "group", min_std: float = 1e-6,
                     shift: bool = True) -> Tensor:
    """The group normaliser: values r [groups, G] -> [groups * G] in r's dtype, each value
    minus its group's mean, then divided by
      "group": the group's std (unbiased, as TRL and verl), floored at min_std (GRPO);
      "batch": the std of all values, floored at min_std (group mean, batch std);
      "none":  nothing (Dr. GRPO: std scaling over-weights near-uniform groups).
    shift: subtract each group's first value before the mean is taken, so a group whose
    values are all equal gets exactly 0 whatever the rounding (0/1 values tie exactly
    without it). GRPO's group advantages, move credit (`credit.move_advantages`) and the
    running advantages' group baseline (`advantages.RunningAdvantage`) all call this."""
    centered = r - r[:, :1] if shift else r
    adv = centered - centered.mean(dim=1, keepdim=True)
    if scale == "group":
        adv = adv / centered.std(dim=1, keepdim=True).clamp_min(min_std)
    elif scale == "batch":
        adv = adv / r.reshape(-1).std().clamp_min(min_std)
    elif scale != "none":
        raise ValueError(f"scale must be one of {ADVANTAGE_SCALES}, got {scale!r}")
    return adv.reshape(-1)


def group_advantages(rewards: Tensor, group_size: int, scale: str = "group",
                     min_std: float = 1e-6, clip: float | None = None,
                     baseline: str = "mean") -> Tensor:
    """rewards [N] (groups of group_size contiguous) -> advantages [N] float32:
    `relative_advantages` in float64 with the tie shift."""
    return relative_advantages(_grouped(rewards, group_size), scale, min_std, clip,
                               baseline).float()


def relative_advantages(groups: Tensor, scale: str, min_std: float, clip: float | None = None,
                        baseline: str = "mean", shift: bool = True) -> Tensor:
    """values [groups, k] -> advantages [groups * k] in their dtype: `normalise_groups`
    (shift: its tie shift), times k / (k - 1) for the leave-one-out baseline (RLOO, Ahmadian
    et al. 2024: each value minus the mean of the other k - 1 of its group, which is
    k / (k - 1) times its distance from the group's mean), clamped to [-clip, clip] when clip
    is given. GRPO's group advantages and move credit's slots (`within`) share it."""
    adv = normalise_groups(groups, scale, min_std, shift=shift)
    if baseline == "leave_one_out":
        k = groups.shape[1]
        adv = adv * (k / (k - 1))
    return adv if clip is None else adv.clamp(-clip, clip)


def zero_variance_groups(rewards: Tensor, group_size: int, tol: float = 0.0) -> Tensor:
    """rewards [N] -> bool [N // G]: True where a group's rewards all lie within tol of
    each other (max - min <= tol). Such groups carry no learning signal."""
    r = _grouped(rewards, group_size)
    return (r.amax(dim=1) - r.amin(dim=1)) <= tol


def silent_groups(advantages: Tensor, group_size: int) -> Tensor:
    """advantages [N] or [N, T] (per token) -> bool [N // G]: True where every advantage of
    a group's rows is 0, so its rows give the policy loss no gradient (what
    `zero_variance=drop` drops: a group of equal rewards still moves the policy under a
    running baseline or through its move slots)."""
    n = advantages.shape[0]
    if group_size < 1 or n % group_size:
        raise ValueError(f"{n} rows do not split into groups of {group_size}")
    return advantages.reshape(n // group_size, -1).eq(0).all(-1)


class GroupAdvantage:
    """Advantages from rewards, per group of G completions of one prompt.

    scale: "group" (GRPO, arXiv 2402.03300), "batch" (group mean, batch std), or "none"
    (Dr. GRPO, arXiv 2503.20783). min_std: floor on the std divided by (TRL adds 1e-4;
    a floor differs only when the std is below ~1e-2). clip: optional |advantage| bound.
    baseline: "mean" (the group's mean) | "leave_one_out" (the mean of the others: RLOO,
    arXiv 2402.14740). Call: (rewards [N], group_size) -> advantages [N] float32.
    """

    def __init__(self, scale: str = "group", min_std: float = 1e-6, clip: float | None = None,
                 baseline: str = "mean"):
        if baseline not in GROUP_BASELINES:
            raise ValueError(f"algorithm.advantage.baseline must be one of {GROUP_BASELINES}, "
                             f"got {baseline!r}")
        if scale not in ADVANTAGE_SCALES:
            raise ValueError(f"algorithm.advantage.scale must be one of {ADVANTAGE_SCALES}, "
                             f"got {scale!r}")
        if scale != "none" and not min_std > 0:
            raise ValueError("algorithm.advantage.min_std must be > 0 when scaling by a std, "
                             f"got {min_std}")
        if clip is not None and not clip > 0:
            raise ValueError(f"algorithm.advantage.clip must be > 0 or null, got {clip}")
        self.scale, self.min_std, self.clip = scale, float(min_std), clip
        self.baseline = baseline

    def __call__(self, rewards: Tensor, group_size: int, tasks=None, step: int = 0) -> Tensor:
        """tasks and step are for stateful advantages (rookworld.advantages); unused here."""
        return group_advantages(rewards, group_size, self.scale, self.min_std, self.clip,
                                self.baseline)

    def within(self, values: Tensor, step: int = 0) -> Tensor:
        """Advantages of one group's values [k] (k >= 2), compared as a group's rewards
        are: move credit's slots (`credit.move_advantages`). A slot's batch is its group, so
        scale=batch divides by the group's own std."""
        return relative_advantages(values[None], "group" if self.scale == "batch" else self.scale,
                                   self.min_std, self.clip, self.baseline, shift=False)

    def __repr__(self) -> str:
        return (f"GroupAdvantage(scale={self.scale!r}, min_std={self.min_std}, clip={self.clip}, "
                f"baseline={self.baseline!r})")



RATIO_LEVELS = ("token", "sequence")


def token_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """log(pi / pi_old) per token, 0 on padding, clamped to +-MAX_LOG_RATIO:
    [N, T], [N, T], [N, T] -> [N, T]."""
    return torch.where(mask.bool(), logp - old_logp, 0.0).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)


def sequence_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """GSPO's length-normalised sequence log ratio, log s_i = mean_t log(pi / pi_old) over
    the sequence's real tokens, broadcast to every position: [N, T] x3 -> [N, T].

    Broadcasting keeps GSPO's gradient: mean_t of f(s_i) is f(s_i), and
    d s_i = s_i * mean_t d log pi_t (arXiv 2507.18071)."""
    m = mask.bool()
    per_seq = torch.where(m, logp - old_logp, 0.0).sum(-1) / m.sum(-1).clamp_min(1)
    return per_seq.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO).unsqueeze(-1).expand_as(logp)


# the policy-loss metrics; under num_iterations > 1 the engine reports their mean over the
# updates of a batch, and ratio_max its maximum (with one update the ratio is 1 by
# construction)
RATIO_STATS = ("policy/clip_frac_low", "policy/clip_frac_high", "policy/ratio_mean",
               "policy/ratio_max")


def is_token_mean(metric: str) -> bool:
    """Whether `compute_loss` measures this metric as a mean over real tokens (the KL
    estimates, the clip fractions, the mean ratio, the entropy) whatever the loss's
    agg_mode: chunks combine it by their share of tokens."""
    return metric.startswith("kl/") or metric in RATIO_STATS[:3] or metric == "policy/entropy"


def clip_stats(ratio: Tensor, adv: Tensor, mask: Tensor, clip_low: float,
               clip_high: float) -> dict[str, Tensor]:
    """Shares of real tokens whose gradient the clip removes, and ratio summaries, keyed
    by RATIO_STATS. ratio [N, T], adv [N, 1] or [N, T], mask [N, T] -> detached scalars.
    clip_frac_low: ratio < 1 - clip_low with a negative advantage;
    clip_frac_high: ratio > 1 + clip_high with a positive advantage."""
    ratio, m = ratio.detach(), mask.bool()
    low = (ratio < 1 - clip_low) & (adv < 0)
    high = (ratio > 1 + clip_high) & (adv > 0)
    return dict(zip(RATIO_STATS, (
        token_mean(low.float(), m),
        token_mean(high.float(), m),
        token_mean(ratio, m),
        torch.where(m, ratio, 0.0).amax(),  # 0 when there is no real token
    )))


@dataclass(frozen=True)
class PolicyLoss:
    """The clipped surrogate's settings (`algorithm.loss`).

    clip_low, clip_high: the ratio's clip range [1 - clip_low, 1 + clip_high]: 0.2 and 0.2
      in GRPO/PPO (arXiv 2402.03300); DAPO's clip-higher raises clip_high to 0.28 (arXiv
      2503.14476); GSPO clips the sequence ratio at 3e-4 / 4e-4 (arXiv 2507.18071).
    ratio_level: "token" (PPO/GRPO) or "sequence" (GSPO: s_i = exp(mean_t(logp - old_logp))).
    agg_mode: one of AGG_MODES; the KL and entropy terms are aggregated the same way.
    max_len: seq_mean_token_sum_norm's constant (the generation budget).
    """

    clip_low: float = 0.2
    clip_high: float = 0.2
    ratio_level: str = "token"
    agg_mode: str = "seq_mean_token_mean"
    max_len: int | None = None

    def __post_init__(self):
        if not 0 < self.clip_low < 1:
            raise ValueError(f"algorithm.loss.clip_low must be in (0, 1), got {self.clip_low}")
        if not self.clip_high > 0:
            raise ValueError(f"algorithm.loss.clip_high must be > 0, got {self.clip_high}")
        if self.ratio_level not in RATIO_LEVELS:
            raise ValueError(f"algorithm.loss.ratio_level must be one of {RATIO_LEVELS}, "
                             f"got {self.ratio_level!r}")
        if self.agg_mode not in AGG_MODES:
            raise ValueError(f"algorithm.loss.agg_mode must be one of {AGG_MODES}, "
                             f"got {self.agg_mode!r}")
        m = self.max_len
        if self.agg_mode == "seq_mean_token_sum_norm" and (
                isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise ValueError("algorithm.loss.max_len must be an integer >= 1 with agg_mode="
                             f"seq_mean_token_sum_norm, got {m!r}")


def policy_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
                loss: PolicyLoss) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO-style clipped surrogate, per token -min(ratio * A, clip(ratio) * A), aggregated
    by loss.agg_mode: (scalar, clip_stats).

    The ratio is always pi_theta / pi_old, with old_logp the log-probs of the policy that
    sampled the completions (kept from the rollout), never the reference: a ratio against
    the reference sits outside the clip range and zeroes most gradients. With one update
    per rollout the ratio is exactly 1 and the clip is inert.
    logp, old_logp, mask [N, T]; advantages [N] or [N, T] (per token: move credit)."""
    log_ratio_fn = token_log_ratio if loss.ratio_level == "token" else sequence_log_ratio
    ratio = torch.exp(log_ratio_fn(logp, old_logp.detach(), mask))
    adv = advantages.detach().to(ratio.dtype)
    adv = adv if adv.dim() == 2 else adv.unsqueeze(-1)
    clipped = ratio.clamp(1 - loss.clip_low, 1 + loss.clip_high)
    per_token = -torch.minimum(ratio * adv, clipped * adv)
    return (aggregate(per_token, mask, loss.agg_mode, loss.max_len),
            clip_stats(ratio, adv, mask, loss.clip_low, loss.clip_high))


CRITICS = ("head", "model")
KL_PENALTIES = ("loss", "reward")


@dataclass(frozen=True)
class CriticSettings:
    """`algorithm.critic`: PPO's value function and how its advantages are made (the maths:
    rookworld/ppo.py).

    kind: head (a linear value head on the policy's final hidden state; the value loss also
      trains the shared trunk) | model (a separate critic, a copy of the policy's weights
      with its own value head); gamma, lam: GAE's discount and lambda over completion
      tokens; vf_coef: the value loss's weight; cliprange_value: the new value's bound
      around the rollout's (null: unclipped); lr: the critic's learning rate (null: the
      policy's); warmup_steps: steps that train the critic only, before the policy moves;
      kl_penalty: loss (beta x KL in the loss, as GRPO) | reward (classic RLHF PPO:
      -beta x the per-token k1 KL joins each token's reward); whiten: advantages
      normalised to mean 0 and std 1 over the batch's tokens.
    """

    kind: str = "head"
    gamma: float = 1.0
    lam: float = 0.95
    vf_coef: float = 0.1
    cliprange_value: float | None = 0.2
    lr: float | None = None
    warmup_steps: int = 0
    kl_penalty: str = "loss"
    whiten: bool = True

    def __post_init__(self):
        if self.kind not in CRITICS:
            raise ValueError(f"algorithm.critic.kind must be head or model, got {self.kind!r}")
        if self.kl_penalty not in KL_PENALTIES:
            raise ValueError("algorithm.critic.kl_penalty must be loss or reward, got "
                             f"{self.kl_penalty!r}")
        for name in ("gamma", "lam"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"algorithm.critic.{name} must be in [0, 1], got "
                                 f"{getattr(self, name)}")
        if not self.vf_coef > 0:
            raise ValueError(f"algorithm.critic.vf_coef must be > 0, got {self.vf_coef}")
        if self.cliprange_value is not None and not self.cliprange_value > 0:
            raise ValueError("algorithm.critic.cliprange_value must be > 0 or null, got "
                             f"{self.cliprange_value}")
        if self.lr is not None and not self.lr > 0:
            raise ValueError(f"algorithm.critic.lr must be > 0 or null, got {self.lr}")
        check_int("algorithm.critic.warmup_steps", self.warmup_steps, 0)


CREDITS = ("sequence", "moves")


@dataclass(frozen=True)
class Algorithm:
    """The `algorithm` group: what the update optimises.

    advantage: rewards [N] -> advantages [N] (`GroupAdvantage`, or a running one from
      rookworld.advantages); loss: the clipped surrogate's `PolicyLoss`; num_iterations: PPO
      updates per rollout batch; kl_estimator: one of KL_ESTIMATOR_NAMES, the KL term in the
      loss; entropy_coef: weight of the entropy bonus (entropy is logged either way);
    credit: sequence (every token its sequence's advantage) | moves (each P move's
      characters the advantage of its own legality, rookworld/credit.py); move_quality:
      under move credit, weight of a legal B: move's labelled engine quality beside its
      legality (`credit.labelled_quality`; 0 = legality alone); listed_quality: the same
      for each legal listed move; distinct_moves: under move credit, a listed move that
      repeats an earlier one of its list is worth what an illegal one is; critic: a
      `CriticSettings` for PPO with a value function (the loss's advantages come from
      GAE over its values; `advantage` then only summarises the groups in the logs), or
      None (GRPO and its kin).
    """

    advantage: Callable = field(default_factory=lambda: GroupAdvantage(min_std=1e-4))
    loss: PolicyLoss = field(default_factory=PolicyLoss)
    num_iterations: int = 1
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    credit: str = "sequence"
    move_quality: float = 0.0
    listed_quality: float = 0.0
    distinct_moves: bool = False
    critic: CriticSettings | None = None

    def __post_init__(self):
        check_int("algorithm.num_iterations", self.num_iterations, 1)
        if self.kl_estimator not in KL_ESTIMATOR_NAMES:
            raise ValueError(f"algorithm.kl_estimator must be one of "
                             f"{', '.join(KL_ESTIMATOR_NAMES)}, got {self.kl_estimator!r}")
        if self.credit not in CREDITS:
            raise ValueError(f"algorithm.credit must be sequence or moves, got {self.credit!r}")
        for name in ("move_quality", "listed_quality"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0 or (value and self.credit != "moves"):
                raise ValueError(f"algorithm.{name}={value} must be finite, >= 0, and above 0 "
                                 "only with algorithm.credit=moves (it weighs a move's slot "
                                 "in move credit)")
        if self.distinct_moves and self.credit != "moves":
            raise ValueError("algorithm.distinct_moves values a move credit's slots; set "
                             "algorithm.credit=moves")
        if self.credit == "moves" and not hasattr(self.advantage, "within"):
            raise ValueError(f"algorithm.credit=moves needs an advantage with within(values, "
                             f"step) for a group's move slots; {self.advantage!r} has none")
        if self.critic is not None and self.credit != "sequence":
            raise ValueError("algorithm.critic gives every token its own GAE advantage; "
                             "set algorithm.credit=sequence (move credit is GRPO's)")
        if not callable(self.advantage):
            raise ValueError("algorithm.advantage must be callable (rewards, group_size) -> "
                             f"advantages, got {self.advantage!r}")


def compute_loss(logits: Tensor, ids: Tensor, old_logp: Tensor | None, advantages: Tensor,
                 mask: Tensor, ref_logp: Tensor | None = None, ref_logits: Tensor | None = None,
                 *, loss: PolicyLoss, beta: float = 0.0, kl_estimator: str = "k3",
                 entropy_coef: float = 0.0) -> tuple[Tensor, dict[str, Tensor]]:
    """The objective the update minimises, for one chunk of rows: the clipped surrogate,
    minus entropy_coef x the entropy, plus beta x the KL to the reference (each term
    aggregated by loss.agg_mode). -> (loss, metrics: detached scalars).

    logits [N, T, V] (already divided by the sampling temperature; logits[:, t] predicts
    ids[:, t]); ids [N, T]; old_logp [N, T] (the sampling policy's; None when these logits
    are the sampling policy's own, before any step: their detached log-probs, ratio 1);
    advantages [N] or [N, T]; mask [N, T]. ref_logp [N, T]: the reference's token
    log-probs (None: no reference, no KL term or KL metrics); ref_logits [N, T, V]: the
    reference's logits, needed by the full_* estimators only. Metrics: loss/policy,
    policy/entropy, the RATIO_STATS, kl/k1, kl/k2, kl/k3 (with a reference),
    kl/full_<direction> for every direction under a full_* estimator (and kl/full under
    "full"), loss/kl when beta > 0."""
    logp = token_logprobs(logits, ids)
    pg, stats = policy_loss(logp, logp.detach() if old_logp is None else old_logp, advantages,
                            mask, loss)
    agg = functools.partial(aggregate, agg_mode=loss.agg_mode, max_len=loss.max_len)
    ent = entropy_from_logits(logits)
    # the metric is nats per token whatever the loss's aggregation (Dr. GRPO's divides by
    # max_len); the bonus below takes the loss's
    metrics = {"loss/policy": pg.detach(), "policy/entropy": token_mean(ent.detach(), mask)}
    total = pg - entropy_coef * agg(ent, mask) if entropy_coef else pg
    if ref_logp is not None:
        for name in KL_ESTIMATORS:
            metrics[f"kl/{name}"] = token_mean(masked_kl(name, logp.detach(), ref_logp, mask),
                                               mask)
        kl_tok = None
        if kl_estimator in FULL_ESTIMATORS:
            if ref_logits is None:
                raise ValueError(f"kl_estimator={kl_estimator} needs the reference's logits")
            want = FULL_ESTIMATORS[kl_estimator]
            kl_tok = kl_full(logits, ref_logits, want)
            with torch.no_grad():
                for d in KL_DIRECTIONS:
                    tok = kl_tok.detach() if d == want else kl_full(logits.detach(), ref_logits,
                                                                    d)
                    metrics[f"kl/full_{d}"] = token_mean(tok, mask)
            if kl_estimator == "full":
                metrics["kl/full"] = metrics["kl/full_forward"]
        elif beta > 0:
            kl_tok = masked_kl(kl_estimator, logp, ref_logp, mask)
        if beta > 0:
            kl_term = agg(kl_tok, mask)
            metrics["loss/kl"] = kl_term.detach() * beta
            total = total + beta * kl_term
    metrics.update({k: v.detach() for k, v in stats.items()})
    return total, metrics
