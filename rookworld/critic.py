"""PPO's value function: a linear value head on a trunk's final hidden state.

kind "head": the trunk is the policy itself, so the value loss's gradient joins the
policy's in the shared weights (the value-head model of RLHF PPO); the critic's own
optimiser holds the head. kind "model": the trunk is a copy of the policy's weights, and
the critic's optimiser holds it and the head. The maths (GAE, the clipped value loss) is
rookworld/ppo.py; the engine calls `values` at rollout (no gradients) and in the update.
"""

from __future__ import annotations

import copy
import math
import warnings

import torch
from torch import Tensor, nn

from .grpo import CriticSettings
from .optim import AdamWSpec, load_schedule_state, scale_lr


def hidden_size(config) -> int:
    """The width of a model's final hidden state (GPT-2's n_embd, transformers' hidden_size)."""
    for name in ("n_embd", "hidden_size", "d_model"):
        if getattr(config, name, None):
            return int(getattr(config, name))
    raise ValueError(f"cannot tell the hidden size of {type(config).__name__} for a value head")


class Critic:
    """settings: `grpo.CriticSettings`; policy_model: the engine's (prepared) model;
    backend: its `backends.Backend`; optim: the policy's `optim.AdamWSpec` (the critic's
    lr replaces its lr when set); steps: the run's steps (the lr schedule); seed: the
    value head's initialisation (its own generator, so that the run's random streams stay
    those of a run without a critic)."""

    def __init__(self, settings: CriticSettings, policy_model, backend, optim: AdamWSpec,
                 steps: int, seed: int):
        self.settings, self.backend, self.optim = settings, backend, optim
        device = next(policy_model.parameters()).device
        self.trunk = policy_model if settings.kind == "head" else copy.deepcopy(policy_model)
        self.trunk.requires_grad_(True)
        self.head = nn.Linear(hidden_size(policy_model.config), 1).to(device)
        g = torch.Generator().manual_seed(seed * 1_000_003 + 17)
        with torch.no_grad():  # small values at first: advantages start as the returns
            self.head.weight.copy_(torch.randn(self.head.weight.shape, generator=g) * 0.01)
            self.head.bias.zero_()
        spec = copy.copy(optim)
        if settings.lr is not None:
            spec.lr = float(settings.lr)
        self.optimizer, self.scheduler = spec.build(self.parameters(), steps)

    def parameters(self) -> list[nn.Parameter]:
        """What the critic's optimiser steps: the head, and the trunk when it is a copy."""
        own = list(self.head.parameters())
        return own if self.settings.kind == "head" else own + list(self.trunk.parameters())

    def values(self, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor) -> Tensor:
        """[N,T] float32: the value of the state before each completion token."""
        hidden = self.backend.hidden(self.trunk, prompt_ids, prompt_mask, completion_ids)
        return self.head(hidden.float()).squeeze(-1)

    def step(self) -> float:
        """Clip the critic's gradients and step its optimiser (once per iteration of an
        update); -> the gradient norm before clipping (the shared trunk's gradient is the
        policy optimiser's)."""
        norm = float(self.optim.clip_gradients(self.parameters()))
        if math.isfinite(norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def end_update(self, backoff: float | None = None) -> None:
        """Step the critic's schedule once per training step, as the policy's; backoff: the
        NaN guard's lr factor after a skipped update, applied to the critic's lr too."""
        if backoff is not None:
            scale_lr(self.scheduler, backoff)
        with warnings.catch_warnings():  # a skipped update: the schedule moves on unstepped
            warnings.filterwarnings("ignore", r"Detected call of `lr_scheduler\.step\(\)`")
            self.scheduler.step()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def state_dict(self) -> dict:
        d = {"head": self.head.state_dict(), "optimizer": self.optimizer.state_dict(),
             "scheduler": self.scheduler.state_dict()}
        if self.settings.kind == "model":
            d["trunk"] = self.trunk.state_dict()
        return d

    def load_state_dict(self, d: dict) -> None:
        self.head.load_state_dict(d["head"])
        if self.settings.kind == "model":
            self.trunk.load_state_dict(d["trunk"])
        self.optimizer.load_state_dict(d["optimizer"])
        load_schedule_state(self.scheduler, d["scheduler"])
