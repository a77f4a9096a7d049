"""reward=engine: the P task's best move scored by the engine itself, so
positions without stored labels can be trained on."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rookworld.chess_tasks import EnvTruth, PolicyTruth, parse_policy
from rookworld.chess_tasks.stockfish_pool import against_best

from .base import Reward, Scored
from .graduated import GraduatedReward
from .parts import parsed_policy_parts

if TYPE_CHECKING:
    from rookworld.chess_tasks.stockfish_pool import EnginePool


class EngineReward(Reward):
    """P: how much the `B:` move loses against the engine's best.

      -malformed_penalty           the completion is not well-formed (format == 0)
      0.0                          well-formed, but the `B:` move is not legal
      legal_score + (1 - legal_score) * (1 - min(loss, max_loss) / max_loss)
                                   otherwise, where loss = max(0, best eval - eval
                                   of the `B:` move) in pawns, side to move's view

    Both evals come from searching the position after the move at the pool's limit
    (`stockfish_pool.against_best`, the centipawn loss's rule), so that a move as good as the
    engine's best loses nothing. The pool caches its searches per position, so the
    score of a (position, move) is fixed within a run; engine errors propagate.
    Parts: policy_parts against the sample's stored labels (for logging; a
    sample without labels scores them as empty) plus `cp_loss`, the loss in
    centipawns capped at 100 * max_loss (the cap when the move is illegal or
    the completion malformed).

    A: the environment has an exact oracle, so A samples are scored by `env`
    (default GraduatedReward(); ContinuousReward also fits).

    Range: (min(-malformed_penalty, env low), max(1.0, env high)).
    """

    def __init__(self, pool: EnginePool, env: Reward | None = None,
                 malformed_penalty: float = 0.3, legal_score: float = 0.2,
                 max_loss: float = 3.0):
        if malformed_penalty < 0:
            raise ValueError(f"reward.malformed_penalty={malformed_penalty} must be >= 0")
        if not 0.0 <= legal_score <= 1.0:
            raise ValueError(f"reward.legal_score={legal_score} must lie in [0, 1]")
        if max_loss <= 0:
            raise ValueError(f"reward.max_loss={max_loss} must be > 0 (pawns)")
        self.pool = pool
        self.env_reward = env if env is not None else GraduatedReward()
        self.malformed_penalty = float(malformed_penalty)
        self.legal_score, self.max_loss = float(legal_score), float(max_loss)
        low, high = self.env_reward.range
        self.range = (min(-self.malformed_penalty, low), max(1.0, high))

    def policy(self, truth: PolicyTruth, completion: str) -> Scored:
        parsed = parse_policy(completion)
        parts = parsed_policy_parts(truth, parsed)
        if parts["format"] != 1.0:
            return Scored(-self.malformed_penalty, dict(parts, cp_loss=100 * self.max_loss))
        if parts["best_legal"] != 1.0:
            return Scored(0.0, dict(parts, cp_loss=100 * self.max_loss))
        loss = min(self.move_loss(truth.fen, parsed.best), self.max_loss)
        score = self.legal_score + (1.0 - self.legal_score) * (1.0 - loss / self.max_loss)
        return Scored(score, dict(parts, cp_loss=100 * loss))

    def env(self, truth: EnvTruth, completion: str) -> Scored:
        return self.env_reward.env(truth, completion)

    def at(self, step: int) -> Reward:
        env = self.env_reward.at(step)
        if env is self.env_reward:
            return self
        return EngineReward(self.pool, env, self.malformed_penalty, self.legal_score,
                            self.max_loss)

    def close(self) -> None:
        """Closes the engine pool (its processes and threads) and the `env` reward."""
        try:
            self.pool.close()
        finally:
            self.env_reward.close()

    def move_loss(self, fen: str, move: str) -> float:
        """Pawns the legal `move` loses against the engine's best in `fen` (>= 0).
        A position the rules already call over (insufficient material, 75-move
        rule: the pool returns no lines) costs nothing: every move draws."""
        evals = against_best(self.pool, fen, move)
        return 0.0 if evals is None else max(0.0, evals[0] - evals[1])
