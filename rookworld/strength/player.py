"""The model as a chess player: its P-task answer's B: move, for many positions at once.

`ModelPlayer(policy, settings, legal_moves="mask")` decodes the B: move only along the
position's legal moves (`rookworld.legal_mask`); "free" reads whatever the model writes,
so an illegal or unparseable answer is the model's own. Greedy by default; with a
temperature above 0 the draws come from the player's seeded generator.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .. import backends
from ..chess_tasks import parse_policy, policy_prompt
from ..sampling import SamplingSettings

MODES = ("free", "mask")


@dataclass
class Answer:
    """move: the B: move as written (UCI), or None when the answer has none; text: the
    whole completion."""

    move: str | None
    text: str


class ModelPlayer:
    """Answers P prompts in batches of `batch_size`. settings: the P sampling settings
    (max_new_tokens etc.); temperature: 0 = greedy; seed: the generator's for sampling."""

    def __init__(self, policy, settings: SamplingSettings, legal_moves: str = "free",
                 temperature: float = 0.0, seed: int = 0, batch_size: int = 64):
        if legal_moves not in MODES:
            raise ValueError(f"legal_moves must be one of {MODES}, got {legal_moves!r}")
        self.policy, self.legal_moves, self.batch_size = policy, legal_moves, batch_size
        self.settings = replace(settings, temperature=temperature, top_k=0, top_p=1.0)
        if legal_moves == "mask":  # the constraint lets a row end once its move is whole
            self.settings = replace(self.settings, min_new_tokens=0)
        device = next(policy.model.parameters()).device
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.on_batch = None  # on_batch(n) after each batch of n answers (a progress bar)

    def answers(self, fens: list[str]) -> list[Answer]:
        out: list[Answer] = []
        backend = backends.of(self.policy)
        for i in range(0, len(fens), self.batch_size):
            chunk = fens[i:i + self.batch_size]
            extra = {}
            if self.legal_moves == "mask":
                from ..legal_mask import legal_move_constraint
                extra["constraint"] = legal_move_constraint(self.policy, chunk)
            r = backend.sample(self.policy.model,
                               [self.policy.encode_prompt(policy_prompt(f)) for f in chunk],
                               self.settings, self.policy.eos_id, generator=self.generator,
                               **extra)
            texts = self.policy.decode_completions(r.completion_ids, r.completion_mask)
            out += [Answer(parse_policy(t).best or None, t) for t in texts]
            if self.on_batch is not None:
                self.on_batch(len(chunk))
        return out

    def __call__(self, fens: list[str]) -> list[str | None]:
        """The B: move of each position (None: no parseable move)."""
        return [a.move for a in self.answers(fens)]
