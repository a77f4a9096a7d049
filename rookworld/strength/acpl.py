"""Centipawn loss of a player's moves against Stockfish at a stated search limit.

The loss of a legal move is eval(engine's best move) - eval(the move), both from the
side to move's view and both by searching the position after the move at the pool's limit
(`stockfish_pool.against_best`), so that a move as good as the engine's loses nothing on
average (the best move's root eval would be a search one ply shallower than the move's);
each eval is first clipped to +-CAP centipawns, as Lichess clips before it averages, so one
position's loss is at most 2 x CAP (a missed mate against a mate of our own), not 100,000.
A blunder loses BLUNDER_CP or more. Illegal or missing answers are counted apart and never
enter the mean.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import chess

from ..chess_tasks import legal_move
from ..chess_tasks.stockfish_pool import against_best
from ..held_out import mean_se

CAP = 1000  # centipawns
BLUNDER_CP = 300


def clip_cp(pawns: float) -> float:
    """Pawns -> centipawns clipped to [-CAP, CAP]."""
    return max(-CAP, min(CAP, pawns * 100))


def centipawn_loss(best_pawns: float, move_pawns: float) -> float:
    """The loss of a move (>= 0) from the best move's eval and its own, in pawns."""
    return max(0.0, clip_cp(best_pawns) - clip_cp(move_pawns))


@dataclass(frozen=True)
class MoveLoss:
    """loss: centipawns (None for an illegal or missing answer)."""

    fen: str
    move: str | None
    loss: float | None

    @property
    def blunder(self) -> bool | None:
        return None if self.loss is None else self.loss >= BLUNDER_CP


def move_losses(pool, fens: Sequence[str], moves: Sequence[str | None]) -> list[MoveLoss]:
    """The loss of each (position, move) at the pool's limit, over its processes."""

    def one(pair: tuple[str, str | None]) -> MoveLoss:
        fen, move = pair
        if legal_move(chess.Board(fen), move) is None:  # illegal, unparseable or missing
            return MoveLoss(fen, move, None)
        evals = against_best(pool, fen, move)
        return MoveLoss(fen, move, 0.0 if evals is None else centipawn_loss(*evals))

    with ThreadPoolExecutor(pool.processes) as ex:
        return list(ex.map(one, zip(fens, moves)))


def common_loss_change(before: Sequence[float | None], after: Sequence[float | None]
                       ) -> tuple[float, float, int] | None:
    """(mean of after - before, its standard error, count) over the positions both lists
    hold a loss for (None: an illegal or missing answer), position by position; None when
    the lists differ in length (not the same positions) or no position has both."""
    if len(before) != len(after):
        return None
    diffs = [b - a for a, b in zip(before, after) if a is not None and b is not None]
    if not diffs:
        return None
    mean, se = mean_se(diffs)
    return mean, se, len(diffs)
