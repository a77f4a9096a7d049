"""Learning-rate schedules and the optimiser spec (the `optim` config group).

Schedules are multipliers of the peak lr, pure functions of the 0-based optimiser step
(nanoGPT's get_lr, as ratios), wrapped in frozen dataclasses that torch's LambdaLR calls:
    Constant(warmup_steps)                        warmup, then 1
    Cosine(warmup_steps, min_ratio, total_steps)  warmup, cosine from 1 down to min_ratio
    Linear(warmup_steps, min_ratio, total_steps)  warmup, straight line down to min_ratio
Warmup is linear, (step + 1) / (warmup_steps + 1), so step 0 already learns.
total_steps is usually left out of the YAML: AdamWSpec.build(params, total_steps) fills it.

AdamW runs on fp32 weights, because an optimiser stepping bf16 weights rounds small updates
to zero; mixed precision is autocast over them (`precision.py`). build() refuses non-fp32
parameters. On the CPU and CUDA it is `FusedAdamW`: torch's fused AdamW kernel and state,
stepped without importing torch's compiler stack.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


def warmup_ratio(step: int, warmup_steps: int) -> float:
    """(step + 1) / (warmup_steps + 1) during warmup, then 1."""
    return (step + 1) / (warmup_steps + 1) if step < warmup_steps else 1.0


def _progress(step: int, warmup_steps: int, total_steps: int) -> float:
    """Share of the post-warmup steps done, in [0, 1]."""
    return min(max((step - warmup_steps) / max(total_steps - warmup_steps, 1), 0.0), 1.0)


def cosine_schedule(step: int, warmup_steps: int, total_steps: int, floor: float,
                    peak: float = 1.0, warmup_to_peak: bool = False) -> float:
    """Linear warmup, peak * (step + 1) / (warmup_steps + 1), then
    floor + (peak - floor) * (1 + cos(pi * progress)) / 2; floor from total_steps on.

    peak=1 gives the ratio the `Cosine` schedule multiplies the lr by; warmup_to_peak
    divides by warmup_steps instead (nanoGPT's get_lr, which pretraining uses: the last
    warmup step already at the peak)."""
    if step < warmup_steps:
        return peak * (step + 1) / (warmup_steps if warmup_to_peak else warmup_steps + 1)
    cos = 0.5 * (1.0 + math.cos(math.pi * _progress(step, warmup_steps, total_steps)))
    return floor + (peak - floor) * cos


def linear_ratio(step: int, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """Warmup, then 1 - (1 - min_ratio) * progress; min_ratio from total_steps on."""
    if step < warmup_steps:
        return warmup_ratio(step, warmup_steps)
    return 1.0 - (1.0 - min_ratio) * _progress(step, warmup_steps, total_steps)


def _check(ok: bool, key: str, rule: str, value) -> None:
    if not ok:
        raise ValueError(f"optim.{key} must be {rule}, got {value!r}")


def _check_schedule(warmup_steps, min_ratio, total_steps) -> None:
    ok_int = isinstance(warmup_steps, int) and not isinstance(warmup_steps, bool)
    _check(ok_int and warmup_steps >= 0, "schedule.warmup_steps", "an integer >= 0", warmup_steps)
    _check(0.0 <= min_ratio <= 1.0, "schedule.min_ratio", "in [0, 1]", min_ratio)
    if total_steps is not None:
        _check(total_steps >= max(warmup_steps, 1), "schedule.total_steps",
               f"an integer >= max(1, warmup_steps={warmup_steps})", total_steps)


@dataclass(frozen=True)
class Constant:
    """Linear warmup over warmup_steps, then the peak lr."""

    warmup_steps: int = 0
    total_steps: int | None = None  # accepted so every schedule binds alike; unused

    def __post_init__(self):
        _check_schedule(self.warmup_steps, 0.0, self.total_steps)

    def __call__(self, step: int) -> float:
        return warmup_ratio(step, self.warmup_steps)


@dataclass(frozen=True)
class Cosine:
    """Linear warmup, then cosine decay to min_ratio * peak at total_steps."""

    warmup_steps: int = 0
    min_ratio: float = 0.1
    total_steps: int | None = None

    def __post_init__(self):
        _check_schedule(self.warmup_steps, self.min_ratio, self.total_steps)

    def __call__(self, step: int) -> float:
        _check(self.total_steps is not None, "schedule.total_steps", "set (build() sets it)", None)
        return cosine_schedule(step, self.warmup_steps, self.total_steps, self.min_ratio)


@dataclass(frozen=True)
class Linear:
    """Linear warmup, then linear decay to min_ratio * peak at total_steps."""

    warmup_steps: int = 0
    min_ratio: float = 0.0
    total_steps: int | None = None

    def __post_init__(self):
        _check_schedule(self.warmup_steps, self.min_ratio, self.total_steps)

    def __call__(self, step: int) -> float:
        _check(self.total_steps is not None, "schedule.total_steps", "set (build() sets it)", None)
        return linear_ratio(step, self.warmup_steps, self.total_steps, self.min_ratio)


Schedule = Constant | Cosine | Linear


class AdamWSpec:
    """AdamW settings plus an lr schedule; the engine calls build() once it knows the
    number of steps and clip_gradients() before each optimiser step.

    lr: peak learning rate. weight_decay: decoupled decay, applied to matrices only
    (params with dim >= 2, as nanoGPT; biases, LayerNorm and other vectors are not
    decayed). betas, eps: Adam's. grad_clip: max global grad norm, or None for no clip.
    schedule: a Constant / Cosine / Linear (default Constant()).
    """

    def __init__(self, lr: float, weight_decay: float = 0.0, betas=(0.9, 0.999),
                 eps: float = 1e-8, grad_clip: float | None = 1.0,
                 schedule: Schedule | None = None):
        _check(lr > 0, "lr", "> 0", lr)
        _check(weight_decay >= 0, "weight_decay", ">= 0", weight_decay)
        betas = tuple(float(b) for b in betas)
        _check(len(betas) == 2 and all(0 <= b < 1 for b in betas), "betas",
               "two numbers in [0, 1)", betas)
        _check(eps > 0, "eps", "> 0", eps)
        _check(grad_clip is None or grad_clip > 0, "grad_clip", "> 0 or null (no clipping)",
               grad_clip)
        self.lr, self.weight_decay, self.betas, self.eps = (float(lr), float(weight_decay), betas,
                                                            float(eps))
        self.grad_clip = None if grad_clip is None else float(grad_clip)
        self.schedule = Constant() if schedule is None else schedule

    def build(self, params: Iterable[torch.nn.Parameter],
              total_steps: int) -> tuple[torch.optim.AdamW, LambdaLR]:
        """AdamW over the trainable params, and a LambdaLR stepping the schedule bound to
        total_steps. Raises if any trainable parameter is not float32."""
        params = [p for p in params if p.requires_grad]
        low = sorted({str(p.dtype) for p in params if p.dtype != torch.float32})
        if low:
            raise ValueError(f"AdamW needs fp32 master weights, got parameters in {low}: "
                             "keep the model in float32")
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": self.weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        # the fused kernel (CPU and CUDA): one pass over each tensor instead of a dozen
        # elementwise ops (figures: benchmarks/README.md); ROOKWORLD_FUSED_ADAMW=0 is the
        # benchmarks' switch for torch's default form
        fused = (os.environ.get("ROOKWORLD_FUSED_ADAMW", "1") != "0"
                 and all(p.device.type in ("cpu", "cuda") for p in params))
        opt = (FusedAdamW if fused else torch.optim.AdamW)(
            [g for g in groups if g["params"]], lr=self.lr, betas=self.betas, eps=self.eps,
            fused=fused or None)
        schedule = dataclasses.replace(self.schedule, total_steps=total_steps)
        return opt, LambdaLR(opt, schedule)

    def clip_gradients(self, params: Iterable[torch.nn.Parameter]) -> torch.Tensor:
        """Clip the global grad norm to grad_clip (no-op when None); return the norm
        measured before clipping (inf/NaN when a gradient is non-finite)."""
        max_norm = math.inf if self.grad_clip is None else self.grad_clip
        return torch.nn.utils.clip_grad_norm_(list(params), max_norm)

    def __repr__(self) -> str:
        return (f"AdamWSpec(lr={self.lr}, weight_decay={self.weight_decay}, betas={self.betas}, "
                f"eps={self.eps}, grad_clip={self.grad_clip}, schedule={self.schedule})")


class FusedAdamW(torch.optim.AdamW):
    """torch's AdamW with fused=True, the same kernel (`torch._fused_adamw_`), state and
    state_dict, stepped without torch.optim's compiler guards: those import torch._dynamo
    and sympy on an optimiser's first use (the memory that saves: benchmarks/README.md).
    Plain AdamW only: no AMSGrad, maximize or closure; a GradScaler checks the gradients
    itself."""

    # torch wraps these four in a lazy `torch._disable_dynamo`; their bodies, unchanged
    # (load_state_dict's is `_load`, which the override below calls)
    add_param_group = getattr(Optimizer.add_param_group, "__wrapped__", Optimizer.add_param_group)
    zero_grad = getattr(Optimizer.zero_grad, "__wrapped__", Optimizer.zero_grad)
    state_dict = getattr(Optimizer.state_dict, "__wrapped__", Optimizer.state_dict)
    _load = getattr(Optimizer.load_state_dict, "__wrapped__", Optimizer.load_state_dict)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._step_supports_amp_scaling = False  # a GradScaler unscales and checks first

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's, then the fused layout for a state saved by torch's unfused AdamW (a
        float32 step on each parameter's device)."""
        self._load(state_dict)
        for group in self.param_groups:
            group["fused"] = True
            for p in group["params"]:
                st = self.state.get(p)
                if st and "step" in st:
                    st["step"] = torch.as_tensor(st["step"], dtype=torch.float32).to(p.device)

    @torch.no_grad()
    def step(self, closure=None) -> None:
        if closure is not None:
            raise ValueError("FusedAdamW takes no closure")
        for group in self.param_groups:
            if group["amsgrad"] or group["maximize"]:
                raise ValueError("FusedAdamW runs plain AdamW: amsgrad and maximize off")
            lists: dict = {}  # one kernel call per (device, dtype), as torch's fused path
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:  # torch's fused state: a float32 step on the parameter's device
                    st["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                    st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                for out, x in zip(lists.setdefault((p.device, p.dtype), ([], [], [], [], [])),
                                  (p, p.grad, st["exp_avg"], st["exp_avg_sq"], st["step"])):
                    out.append(x)
            beta1, beta2 = group["betas"]
            for params, grads, exp_avgs, exp_avg_sqs, steps in lists.values():
                torch._foreach_add_(steps, 1)
                torch._fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, [], steps,
                                    lr=group["lr"], beta1=beta1, beta2=beta2,
                                    weight_decay=group["weight_decay"], eps=group["eps"],
                                    amsgrad=False, maximize=False)


def load_schedule_state(scheduler: LambdaLR, state: dict) -> None:
    """Resume a schedule: its step and peak lrs (base_lrs, which the NaN guard's back-off
    scales) from the checkpoint, its shape (warm-up, floor, total_steps) from this run's
    config, so that a resume with a raised `steps` runs the longer schedule instead of
    sitting at the saved one's end. Call it after loading the optimiser's state, whose lr it
    sets for the next step."""
    scheduler.load_state_dict({**state, "lr_lambdas": [None] * len(scheduler.lr_lambdas)})
    # the next step's lr from this schedule (the optimiser's state holds the saved one's)
    lrs = [base * fn(scheduler.last_epoch)
           for base, fn in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
    for group, lr in zip(scheduler.optimizer.param_groups, lrs):
        group["lr"] = lr
    scheduler._last_lr = lrs


def scale_lr(scheduler: LambdaLR, factor: float) -> None:
    """Multiply the peak lr (every base lr) and the current lr by factor, e.g. 0.5 for the
    NaN guard's back-off. base_lrs is in scheduler.state_dict(), so a resume keeps it."""
    if not factor > 0:
        raise ValueError(f"scale_lr: factor must be > 0, got {factor!r}")
    scheduler.base_lrs = [b * factor for b in scheduler.base_lrs]
    for group in scheduler.optimizer.param_groups:
        group["lr"] *= factor
