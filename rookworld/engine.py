"""The GRPO engine: `rollout()` samples and scores, `update()` takes the PPO steps.

It owns the policy, the frozen reference and the optimiser. What the update optimises is
one `grpo.Algorithm` (advantages, clipped surrogate, KL estimator, entropy, credit) and
its loss one pure function, `grpo.compute_loss`; every other choice is one
`EngineSettings`. The batch it hands from rollout to update is `batch.Batch`.
Built from Python without Hydra as in docs/python_api.md.
"""

from __future__ import annotations

import copy
import functools
import math
import time
import warnings
from collections import defaultdict
from collections.abc import Callable
from contextlib import nullcontext

import torch
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel

from . import backends, credit, grpo, ppo, precision
from .backends.fast_gpt2.blocks import final_norm, lm_head
from .batch import Batch, merge_rollouts, micro_batch_rows, rollout_metrics
from .chess_tasks import Sample
from .critic import Critic
from .distributed import DistContext
from .engine_settings import EngineSettings, micro_batch_tokens
from .optim import load_schedule_state, scale_lr
from .runtime import choose_allocator, mmap_threshold_during, release_freed_memory
from .sampling import Rollout, SamplingSettings

RATIO_MAX = "policy/ratio_max"


class GRPOEngine:
    """policy: `policy.Policy`; reward: `rewards.Reward` (its `at(step)` picks the
    curriculum stage); algorithm: `grpo.Algorithm`; settings: `EngineSettings`; kl: a
    `kl_schedule` schedule (beta per step); optim: `optim.AdamWSpec`; sampling: per-task
    `sampling.SamplingSettings` (`sampling.per_task_settings`); dist: a
    `distributed.DistContext` under torchrun (None: one process): each rank samples its
    share of the prompts and DistributedDataParallel averages gradients; anchor: an
    `anchor.Anchor` whose cross-entropy on ground-truth samples (`Batch.anchor`) each update
    adds (PPO-ptx), or None; nan_lr_backoff: the learning-rate factor after an update skipped
    for non-finite loss or gradients (guard.nan.lr_backoff). Building an engine makes the
    process-wide allocator choice for the model's size (`runtime.choose_allocator`).
    """

    def __init__(self, policy, reward, algorithm: grpo.Algorithm, settings: EngineSettings, *,
                 kl, optim, sampling: dict[str, SamplingSettings],
                 dist: DistContext | None = None, anchor=None, nan_lr_backoff: float = 0.5):
        s = self.settings = settings
        self.nan_lr_backoff = nan_lr_backoff
        self.policy, self.reward, self.algorithm, self.kl = policy, reward, algorithm, kl
        self.sampling, self.G, self.dist = sampling, s.num_generations, dist
        self.move_credit = credit.MoveCredit(policy.tokenizer, algorithm.move_quality,
                                             algorithm.listed_quality,
                                             algorithm.distinct_moves, algorithm.advantage) \
            if algorithm.credit == "moves" else None
        self.device = dist.device if dist else torch.device(s.device)
        self.ref_device = torch.device(s.reference.device) if s.reference.device else self.device
        n_params = sum(q.numel() for q in policy.model.parameters())
        self.micro_batch_tokens = micro_batch_tokens(s.micro_batch_tokens, n_params)
        self.update_mmap_kib = choose_allocator(s.mmap_threshold_kib, n_params, self.device)
        # one precision for the run, the reference's too (amp: torch.autocast's dtype, hf;
        # products: fast_gpt2's own bf16 products)
        self.backend, self.amp, self.products = backends.choose(
            s.backend, policy.model, self.device, s.autocast)
        policy.model = self.backend.prepare(policy.model.to(self.device)).to(self.device)
        policy.backend = self.backend
        self.model = policy.model.eval()  # dropout is 0; eval anyway
        # the policy's teacher-forced forward
        self.logits_fn = self.backend.logits_module(self.model, recompute=s.recompute_activations)
        if dist:  # DDP copies rank 0's weights to every rank here, before the reference
            self.logits_fn = DistributedDataParallel(
                self.logits_fn, device_ids=[self.device] if self.device.type == "cuda" else None,
                forward_sync_buffers=False)
        self.ref = None
        if s.reference.enabled:
            self.ref = copy.deepcopy(self.model).requires_grad_(False).eval().to(self.ref_device)
        self.optim = optim
        self.optimizer, self.scheduler = optim.build(
            [p for p in self.model.parameters() if p.requires_grad], s.steps)
        self.tape_budget = s.rollout_tape_mib * 2**20 if self.backend.uses_tape else 0
        self.anchor = anchor if anchor is not None and anchor.active else None
        self.critic = None
        if algorithm.critic is not None:  # PPO (one process: config.validate refuses torchrun)
            self.critic = Critic(algorithm.critic, self.model, self.backend, optim, s.steps,
                                 s.seed)
        # the policy's log-probs of a rollout are read before the update only by PPO's KL in
        # the rewards (`gae`): under autocast or bf16 products they come from a teacher-forced
        # pass then, as the reference's, so that the KL starts at 0 (the sampler's cached
        # one-token steps round apart from it; the update takes its own, `chunk_loss`)
        self.teacher_forced_logprobs = (self.amp is not None or self.products is not None) \
            and algorithm.critic is not None and algorithm.critic.kl_penalty == "reward"

    # ---------------------------------------------------------------- rollout
    def _generator(self, step: int, salt: int) -> torch.Generator:
        g = torch.Generator(device=self.device)
        rank = self.dist.rank if self.dist else 0
        return g.manual_seed(self.settings.seed * 1_000_003 + step * 101 + salt
                             + rank * 7_919_000_017)

    def sample_rows(self, samples: list[Sample], step: int) -> tuple[Rollout, Tensor]:
        rows = [s for s in samples for _ in range(self.G)]
        parts, temps = [], torch.ones(len(rows), device=self.device)
        budget = self.tape_budget  # shared by the tasks' tapes
        for salt, task in enumerate(sorted({s.task for s in rows})):
            idx = [i for i, s in enumerate(rows) if s.task == task]
            settings = self.sampling[task]
            prompts = [self.policy.encode_prompt(rows[i].prompt) for i in idx]
            with precision.autocast(self.amp, self.device):
                r = self.backend.sample(self.model, prompts, settings, self.policy.eos_id,
                                        self._generator(step, salt), tape_budget=budget)
            # a task without its tape: no later one keeps one (the update uses all or none)
            budget = budget - sum(tape.nbytes for _, tape in r.tapes) if r.tapes else 0
            parts.append((idx, r))
            temps[idx] = settings.temperature or 1.0
        return merge_rollouts(parts, len(rows), self.policy.eos_id), temps

    def sample_prompts(self, prompts: list[str], task: str, step: int, salt: int) -> Rollout:
        """One completion per prompt under the task's sampling settings, without the rollout
        tape (episodes gather a batch over many such calls); salt: distinct per call."""
        rank = self.dist.rank if self.dist else 0
        g = torch.Generator(device=self.device).manual_seed(
            hash((self.settings.seed, step, salt, rank)) % 2**62)  # ints: the same every process
        with precision.autocast(self.amp, self.device):
            return self.backend.sample(
                self.model, [self.policy.encode_prompt(p) for p in prompts], self.sampling[task],
                self.policy.eos_id, g, tape_budget=0)

    def batch_of(self, rows: list[Sample], parts: list[tuple[list[int], Rollout]],
                 texts: list[str], rewards: Tensor, advantages: Tensor, metrics: dict) -> Batch:
        """The Batch of rows sampled in parts ((row indices, rollout) each) with their
        rewards and advantages [N] given (episodes): merged, the reference's log-probs
        taken, every completion token in the loss."""
        t0 = time.perf_counter()
        r = merge_rollouts(parts, len(rows), self.policy.eos_id)
        temps = torch.tensor([self.sampling[s.task].temperature or 1.0 for s in rows],
                             device=self.device)
        if self.teacher_forced_logprobs:
            r.logprobs = self.logprobs(self.model, r, temps)
        ref_lp = self.logprobs(self.ref, r, temps) if self.ref is not None else None
        loss_mask = r.completion_mask.float()
        lengths = r.completion_mask.sum(-1).float()
        m = {"reward/mean": float(rewards.mean()), "adv/abs_mean": float(advantages.abs().mean()),
             "sample/tokens": float(lengths.sum()), "sample/len_mean": float(lengths.mean()),
             "time/ref_s": time.perf_counter() - t0, **metrics}
        for task in sorted({s.task for s in rows}):
            m[f"reward/{task}/mean"] = float(rewards[[s.task == task for s in rows]].mean())
        if self.settings.release_memory:
            release_freed_memory()
        return Batch([], r, texts, temps, rewards, advantages.to(self.device), loss_mask,
                     ref_lp, m, float(loss_mask.sum()), len(rows))

    def score(self, rows: list[Sample], texts: list[str], step: int):
        reward = self.reward.at(step)
        scored = [reward(s, t) for s, t in zip(rows, texts)]
        return torch.tensor([x.score for x in scored], dtype=torch.float32), scored

    def rollout(self, samples: list[Sample], step: int) -> Batch:
        """Sample, score and take reference log-probs for samples x G rows (under DDP:
        this rank's contiguous share of samples; advantages from every rank's rewards)."""
        if self.dist:
            samples = self.dist.shard(samples)
        t0 = time.perf_counter()
        r, temps = self.sample_rows(samples, step)
        t1 = time.perf_counter()
        rows = [s for s in samples for _ in range(self.G)]
        texts = self.policy.decode_completions(r.completion_ids, r.completion_mask)
        rewards, scored = self.score(rows, texts, step)
        if self.teacher_forced_logprobs:
            r.logprobs = self.logprobs(self.model, r, temps)
        t2 = time.perf_counter()
        adv, zero, adv_every = self._advantages(rewards, [s.task for s in rows], step)
        # what the loss weighs each token by: its sequence's advantage, or its move's
        loss_adv = self.move_credit(adv, rows, texts, r, self.G, step) \
            if self.move_credit else adv
        loss_mask = r.completion_mask.float()
        silent = None
        if self.settings.zero_variance == "drop":  # groups whose advantages are all 0
            silent = grpo.silent_groups(loss_adv, self.G)
            loss_mask = loss_mask * (~silent).repeat_interleave(self.G).float()[:, None].to(
                self.device)
        ref_lp = self.logprobs(self.ref, r, temps) if self.ref is not None else None
        values = returns = None
        if self.critic:
            loss_adv, values, returns, critic_m = self.gae(r, rewards, loss_mask, ref_lp, step)
        t3 = time.perf_counter()
        m = rollout_metrics(rows, texts, scored, rewards, adv, zero, r, self.G)
        if silent is not None:
            m["groups/dropped_share"] = float(silent.float().mean())
        if self.critic:
            m.update(critic_m)
        m.update({"time/sample_s": t1 - t0, "time/score_s": t2 - t1, "time/ref_s": t3 - t2})
        if hasattr(self.algorithm.advantage, "metrics"):  # stateful advantages' statistics
            m.update(self.algorithm.advantage.metrics())
        # the step's normalisers: a dropped group's rows have left the batch
        norm_tokens = float(loss_mask.sum())
        norm_rows = grpo.rows_in_batch(loss_mask)
        if self.dist:
            m = self._global_metrics(self.dist.combine_metrics(m), rewards, adv_every)
            total = self.dist.sum_floats({"t": norm_tokens, "r": float(norm_rows)})
            norm_tokens, norm_rows = total["t"], int(total["r"])
        if self.settings.release_memory:
            release_freed_memory()
        return Batch(samples, r, texts, temps, rewards, loss_adv, loss_mask, ref_lp, m,
                     norm_tokens, norm_rows, old_values=values, returns=returns)

    @torch.no_grad()
    def gae(self, r: Rollout, rewards: Tensor, mask: Tensor, ref_lp: Tensor | None, step: int
            ) -> tuple[Tensor, Tensor, Tensor, dict]:
        """PPO's per-token advantages [N,T] from the critic's values (`ppo.gae`), with the
        values and returns the value loss needs, and what they measure. The score is the
        last token's reward; under kl_penalty=reward each token also pays beta x its k1 KL."""
        c = self.algorithm.critic
        with precision.autocast(self.amp, self.device):
            values = torch.cat([self.critic.values(r.prompt_ids[rows], r.prompt_mask[rows],
                                                   r.completion_ids[rows])
                                for rows in self._micro_slices(r)]).float() * mask
        kl = (r.logprobs - ref_lp) if c.kl_penalty == "reward" and ref_lp is not None else None
        tok_r = ppo.token_rewards(rewards.to(self.device), mask, kl, self.kl.coef(step))
        adv, returns = ppo.gae(tok_r, values, mask, c.gamma, c.lam)
        m = {"value/explained_variance": ppo.explained_variance(values, returns, mask),
             "value/rollout_mean": float(grpo.token_mean(values, mask)),
             "value/returns_mean": float(grpo.token_mean(returns, mask)),
             "adv/gae_abs_mean": float(grpo.token_mean(adv.abs(), mask))}
        if c.whiten:
            adv = ppo.whiten(adv, mask)
        return adv, values, returns, m

    def _advantages(self, rewards: Tensor, tasks: list[str], step: int
                    ) -> tuple[Tensor, Tensor, Tensor]:
        """rewards [N] -> (advantages [N] on device, zero-variance groups [N/G], the whole
        step's advantages); under DDP from every rank's rewards (a batch-level std sees the
        whole step) and computed once, so running statistics advance once a step."""
        if not self.dist:
            adv = self.algorithm.advantage(rewards, self.G, tasks=tasks, step=step)
            return adv.to(self.device), grpo.zero_variance_groups(rewards, self.G), adv
        every = self.dist.all_gather(rewards.to(self.device)).cpu()
        n, k = len(rewards), self.dist.rank
        adv_every = self.algorithm.advantage(every, self.G,
                                             tasks=self.dist.all_gather_list(tasks), step=step)
        zero = grpo.zero_variance_groups(every, self.G)[k * n // self.G:(k + 1) * n // self.G]
        return adv_every[k * n:(k + 1) * n].to(self.device), zero, adv_every

    def _global_metrics(self, m: dict, rewards: Tensor, adv: Tensor) -> dict:
        """Replace rank-averaged reward and advantage summaries by whole-step values."""
        every = self.dist.all_gather(rewards.to(self.device)).cpu()
        m.update({"reward/mean": float(every.mean()), "reward/std": float(every.std(0)),
                  "adv/std": float(adv.std(0)), "adv/abs_mean": float(adv.abs().mean()),
                  "groups/zero_variance_share": float(
                      grpo.zero_variance_groups(every, self.G).float().mean()),
                  "sample/tokens": m["sample/tokens"] * self.dist.world})
        return m

    def _chunk_rows(self, r: Rollout) -> int:
        """Rows per forward/backward chunk for this rollout (see micro_batch)."""
        n = r.completion_ids.shape[0]
        mb = self.settings.micro_batch
        if mb != "auto":
            return n if mb <= 0 else min(mb, n)
        return micro_batch_rows(n, self.G, r.prompt_ids.shape[1], r.completion_ids.shape[1],
                                self.model.config.vocab_size, self.micro_batch_tokens)

    def logprobs(self, model, r: Rollout, temps: Tensor) -> Tensor:
        """No-grad log-probs of the rollout's completions under `model` (the reference, or
        the policy under autocast), on the model's device, returned on the policy's."""
        # without gradients a forward holds one layer's activations at a time and the
        # log-softmax is chunked by vocabulary anyway: auto runs the whole batch at once
        rows = 0 if self.settings.micro_batch == "auto" else self.settings.micro_batch
        device = next(model.parameters()).device
        with precision.autocast(self.amp, device):
            lp = self.backend.logprobs(model, *(x.to(device) for x in (
                r.prompt_ids, r.prompt_mask, r.completion_ids, temps)), rows)
        return lp.to(self.device) * r.completion_mask

    def _on_ref_device(self, *tensors: Tensor) -> tuple[Tensor, ...]:
        return tuple(x.to(self.ref_device) for x in tensors)

    # ----------------------------------------------------------------- update
    def _forward(self, b: Batch, rows: slice):
        r = b.rollout
        with precision.autocast(self.amp, self.device):
            logits = self.logits_fn(r.prompt_ids[rows], r.prompt_mask[rows],
                                    r.completion_ids[rows])
        return logits.float() / b.temperature[rows, None, None]

    def _micro_slices(self, r: Rollout) -> list[slice]:
        n, size = r.completion_ids.shape[0], self._chunk_rows(r)
        return [slice(i, min(i + size, n)) for i in range(0, n, size)]

    def _tape_chunks(self, b: Batch) -> tuple[list[tuple[slice, Callable[[], Tensor]]], list]:
        """(chunks, finals): (rows, logits()) for the update's chunks (`_micro_slices`, the
        same rows) from the rollout's tapes, and each tape's `final()` leaf whose gradient
        the chunks accumulate; ([], []) unless every row has a tape. The logits come from
        the kept final residuals (final norm and output matrix with gradients);
        `_backward_tapes` then takes the blocks."""
        r = b.rollout
        n, width = r.completion_ids.shape
        if sum(len(rows) for rows, _ in r.tapes) != n:
            return [], []
        finals = [tape.final() for _, tape in r.tapes]

        def logits(rows: slice) -> Tensor:
            hidden = finals[0].new_zeros(rows.stop - rows.start, width, finals[0].shape[1])
            for (idx, tape), final in zip(r.tapes, finals):  # idx: the tape's rows in the batch
                inside = (idx >= rows.start) & (idx < rows.stop)
                if bool(inside.any()):
                    part = tape.hidden(final, inside.nonzero().squeeze(1))
                    hidden[idx[inside] - rows.start, :part.shape[1]] = part  # rest: masked
            out = lm_head(self.model, final_norm(self.model, hidden)).float()
            return out / b.temperature[rows, None, None]
        return [(rows, functools.partial(logits, rows)) for rows in self._micro_slices(r)], finals

    def _backward_tapes(self, b: Batch, finals: list) -> None:
        """Each tape's blocks for its final leaf's gradient; the leaves are dropped first,
        so each tape frees its final residual with its top layer."""
        for k, (_, tape) in enumerate(b.rollout.tapes):
            d_final, finals[k] = finals[k].grad, None
            tape.backward(self.model, d_final)
        if self.dist:  # the loss was scaled by world, as for DDP's mean
            self.dist.average_gradients(self.model.parameters())

    def _ref_logits(self, b: Batch, rows: slice) -> Tensor:
        """The reference's logits for the rows (the full_* KL estimators need them)."""
        r = b.rollout
        with torch.no_grad(), precision.autocast(self.amp, self.ref_device):
            ref_logits = self.backend.logits_module(self.ref)(*self._on_ref_device(
                r.prompt_ids[rows], r.prompt_mask[rows], r.completion_ids[rows]))
        return ref_logits.float().to(self.device) / b.temperature[rows, None, None]

    def chunk_loss(self, b: Batch, rows: slice, beta: float,
                    logits_fn: Callable[[], Tensor] | None = None, first: bool = False):
        """`grpo.compute_loss` for the rows, from the forward (or the rollout's tape).

        first: the batch's first iteration, whose policy is the one that sampled. Its old
        log-probs are then this forward's own, detached (kept for later iterations where
        there are any), so the ratio starts at exactly 1: the sampler's cached one-token
        steps round bf16 products (and autocast) apart from a teacher-forced pass, by up to
        ~0.1 nats."""
        a = self.algorithm
        logits = logits_fn() if logits_fn else self._forward(b, rows)
        ids = b.rollout.completion_ids[rows]
        old = b.rollout.logprobs[rows]
        if first:  # one update (the default): compute_loss takes its own; else kept here
            old = None
            if a.num_iterations > 1:
                old = b.rollout.logprobs[rows] = grpo.token_logprobs(logits.detach(), ids)
        ref_lp = b.ref_logprobs[rows] if b.ref_logprobs is not None else None
        full = ref_lp is not None and a.kl_estimator in grpo.FULL_ESTIMATORS
        return grpo.compute_loss(
            logits, ids, old, b.advantages[rows], b.loss_mask[rows], ref_lp,
            self._ref_logits(b, rows) if full else None, loss=a.loss, beta=beta,
            kl_estimator=a.kl_estimator, entropy_coef=a.entropy_coef)

    def update(self, b: Batch, step: int) -> dict:
        t0 = time.perf_counter()
        if not (b.norm_tokens or float(b.loss_mask.sum())) and not (self.anchor and b.anchor):
            return self._no_update(b, step, t0)
        coef = beta = self.kl.coef(step)
        c = self.algorithm.critic
        if c and c.kl_penalty == "reward":  # the KL was paid in the rewards (`gae`)
            beta = 0.0
        # a critic warming up: the update trains the value function only
        policy_moves = not (c and step < c.warmup_steps)
        world = self.dist.world if self.dist else 1  # DDP averages gradients over ranks
        slices = self._micro_slices(b.rollout)
        if not policy_moves:  # nothing differentiates the policy: its tapes go now
            b.rollout.tapes = []
        # the first iteration differentiates the policy that sampled: its kept forward
        taped, finals = self._tape_chunks(b)
        if self.dist:  # one path on every rank: DDP's reducer and average_gradients do not pair
            have = self.dist.all_reduce(torch.tensor([float(bool(taped))], device=self.device))
            if int(have.item()) < world:  # some rank's tape did not fit: all run the forward
                taped, finals, b.rollout.tapes = [], [], []
        agg, later, values = defaultdict(float), defaultdict(float), defaultdict(float)
        peak, skipped = None, 0
        with mmap_threshold_during(self.update_mmap_kib):
            for it in range(self.algorithm.num_iterations):
                self.optimizer.zero_grad(set_to_none=True)
                total = 0.0
                chunks = taped if it == 0 and taped else [(rows, None) for rows in slices]
                chunks = chunks if policy_moves else []  # taped is [] then too
                for j, (rows, logits_fn) in enumerate(chunks):
                    w = self._weight(b, rows)
                    w_tokens = self._weight(b, rows, "token_mean")
                    with self._no_sync(j < len(chunks) - 1):
                        loss, parts = self.chunk_loss(b, rows, beta, logits_fn, it == 0)
                        (loss * (w * world)).backward()
                    total += float(loss.detach()) * w
                    for k, v in parts.items():
                        share = w_tokens if grpo.is_token_mean(k) else w
                        if k == RATIO_MAX:  # a maximum over chunks and iterations, not a mean
                            peak = float(v) if peak is None else max(peak, float(v))
                        elif it == 0:
                            agg[k] += float(v) * share
                        elif k in grpo.RATIO_STATS:  # measured after the policy moved: not all 1
                            later[k] += float(v) * share
                if it == 0 and taped:
                    self._backward_tapes(b, finals)
                    b.rollout.tapes = []  # its memory goes back before any later iteration
                if self.critic:  # its metrics: means over the iterations, as the ratio's
                    total += self._value_backward(b, slices, values)
                if self.dist:
                    total = self.dist.sum_floats({"total": total})["total"]
                    if it == 0:
                        agg = defaultdict(float, self.dist.sum_floats(agg))
                if self.anchor and b.anchor:  # the same samples on every rank: same gradient
                    with precision.autocast(self.amp, self.device):
                        ce = self.anchor.loss(self.policy, b.anchor, self.device)
                    (self.anchor.coef * ce).backward()
                    total += self.anchor.coef * float(ce.detach())
                    if it == 0:
                        agg["loss/anchor_ce"] = float(ce.detach())
                grad_norm = float(self.optim.clip_gradients(self.model.parameters()))
                if not (math.isfinite(total) and math.isfinite(grad_norm)):
                    self.optimizer.zero_grad(set_to_none=True)
                    if self.critic:
                        self.critic.zero_grad()
                    scale_lr(self.scheduler, self.nan_lr_backoff)
                    skipped = 1
                    break
                if policy_moves:
                    self.optimizer.step()
                if self.critic:
                    agg["value/grad_norm"] = self.critic.step()
            self.optimizer.zero_grad(set_to_none=True)  # no gradient memory held while sampling
        done = it + 1  # iterations whose ratio stats were gathered
        agg.update({k: v / done for k, v in values.items()})
        if done > 1:  # ratio and clip stats: the mean over every iteration, not the first
            if self.dist:
                later = self.dist.sum_floats(dict(later))
            for k in grpo.RATIO_STATS:
                if k in agg:
                    agg[k] = (agg[k] + later.get(k, 0.0)) / done
        if peak is not None:
            if self.dist:
                peak = float(self.dist.all_reduce(torch.tensor([peak], device=self.device),
                                                  "max"))
            agg[RATIO_MAX] = peak
        if self.settings.release_memory:
            release_freed_memory()
        lr = self._advance_schedule()
        if self.critic:  # its schedule, once a step too
            self.critic.end_update(self.nan_lr_backoff if skipped else None)
        if self.ref is not None and "kl/k3" in agg:
            # the estimator the run pays: the loss's, or k1 when the rewards pay it (`gae`)
            paid = "k1" if c and c.kl_penalty == "reward" else self.algorithm.kl_estimator
            agg["kl/value"] = agg[f"kl/{paid}"]
            if not skipped:  # a skipped (non-finite) update says nothing about the KL
                self.kl.update(agg["kl/value"], step)
        self._maybe_sync_reference(step)
        m = dict(agg)
        m.update({"kl/coef": coef, "loss/total": total, "optim/grad_norm": grad_norm,
                  "optim/lr": lr, "optim/micro_batches": len(slices),
                  "optim/rollout_forward_reused": float(bool(taped)),
                  "guard/nan_skipped": skipped,
                  "time/update_s": time.perf_counter() - t0})
        if c:
            m["value/policy_moves"] = float(policy_moves)
        if "loss/kl" in m:
            m["loss/kl_share"] = abs(m["loss/kl"]) / max(abs(m["loss/policy"]) + abs(m["loss/kl"]),
                                                          1e-12)
        return m

    def _no_update(self, b: Batch, step: int, t0: float) -> dict:
        """A step whose every group was dropped (zero_variance=drop): nothing to learn, so no
        optimiser step (AdamW would still decay and move by momentum); the schedule goes on.
        No KL or policy metric is logged: a zero there would read as a measurement (the KL
        guard and the adaptive controller skip the step)."""
        b.rollout.tapes = []
        lr = self._advance_schedule()
        self._maybe_sync_reference(step)
        return {"kl/coef": self.kl.coef(step), "loss/total": 0.0, "optim/lr": lr,
                "optim/empty_batch": 1.0, "time/update_s": time.perf_counter() - t0}

    def _advance_schedule(self) -> float:
        """Step the learning-rate schedule once for this step; -> the lr the step used. A
        step without an optimiser step (a critic's warm-up, every group dropped) moves the
        schedule on all the same."""
        lr = self.scheduler.get_last_lr()[0]
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", r"Detected call of `lr_scheduler\.step\(\)`")
            self.scheduler.step()
        return lr

    def _value_backward(self, b: Batch, slices: list[slice], agg: dict) -> float:
        """The critic's clipped value loss over the rows' chunks, backward with weight
        vf_coef (into the head, and the shared trunk under kind=head); -> its weighted sum.
        agg: the value metrics are added to it (each a token mean over the batch)."""
        c, total = self.algorithm.critic, 0.0
        n_tokens = float(b.loss_mask.sum()) or 1.0
        for rows in slices:
            r = b.rollout
            with precision.autocast(self.amp, self.device):
                v = self.critic.values(r.prompt_ids[rows], r.prompt_mask[rows],
                                       r.completion_ids[rows]).float()
            loss, parts = ppo.value_loss(v, b.old_values[rows], b.returns[rows],
                                         b.loss_mask[rows], c.cliprange_value)
            w = float(b.loss_mask[rows].sum()) / n_tokens  # the token mean of the whole batch
            (c.vf_coef * w * loss).backward()
            total += c.vf_coef * w * float(loss.detach())
            for k, x in parts.items():
                agg[k] += float(x) * w
        return total

    def _weight(self, b: Batch, rows: slice, agg_mode: str | None = None) -> float:
        """These rows' share of the whole step's loss (over every rank), or of a mean by
        `agg_mode` (token_mean: of its real tokens)."""
        return grpo.chunk_weight(agg_mode or self.algorithm.loss.agg_mode, b.loss_mask[rows],
                                 b.norm_tokens or float(b.loss_mask.sum()),
                                 b.norm_rows or grpo.rows_in_batch(b.loss_mask))

    def _no_sync(self, skip: bool):
        """DDP: no gradient all-reduce for this micro-batch (all but the last)."""
        return self.logits_fn.no_sync() if skip and self.dist else nullcontext()

    @torch.no_grad()
    def _maybe_sync_reference(self, step: int) -> None:
        every, alpha = self.settings.reference.sync_every, self.settings.reference.sync_alpha
        if self.ref is None or not every or (step + 1) % every:
            return
        for pr, pp in zip(self.ref.parameters(), self.model.parameters()):
            pr.mul_(1 - alpha).add_(pp.to(pr.device), alpha=alpha)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        d = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
             "kl": self.kl.state_dict()}
        if hasattr(self.algorithm.advantage, "state_dict"):  # running reward statistics
            d["advantage"] = self.algorithm.advantage.state_dict()
        if self.critic:
            d["critic"] = self.critic.state_dict()
        return d

    def load_state_dict(self, d: dict) -> None:
        self.optimizer.load_state_dict(d["optimizer"])
        load_schedule_state(self.scheduler, d["scheduler"])
        self.kl.load_state_dict(d["kl"])
        if "advantage" in d and hasattr(self.algorithm.advantage, "load_state_dict"):
            self.algorithm.advantage.load_state_dict(d["advantage"])
        if self.critic:
            if "critic" not in d:
                raise ValueError("the checkpoint has no critic: it was saved by a run without "
                                 "algorithm.critic; resume it with the algorithm it ran")
            self.critic.load_state_dict(d["critic"])
