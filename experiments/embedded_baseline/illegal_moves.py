"""Why a model's P best move is illegal: its greedy answers on the held-out P samples, each
best move sorted into one kind.

    python experiments/embedded_baseline/illegal_moves.py [MODEL ...] [--samples N]

MODEL: `shipped` (the default) or a model directory in the embedded layout (a run's
checkpoints/step-N/model). Kinds, for a best move that parses as UCI:
  legal
  not the mover's piece      the from-square is empty or holds the opponent's piece
  not a move of that piece   the mover's piece cannot make it (geometry, a blocked line,
                             castling without the right, a pawn's capture onto nothing)
  king steps into check      a king move to an attacked square
  leaves the king in check   another piece's move that exposes the king (a pin) or does
                             not answer a check
  no best move               the `B:` field is missing or not UCI
"""

from __future__ import annotations

import argparse
from collections import Counter

import chess

KINDS = ("legal", "not the mover's piece", "not a move of that piece",
         "king steps into check", "leaves the king in check", "no best move")


def kind(fen: str, best: str) -> str:
    """The kind (KINDS) of best move `best` in position `fen`."""
    try:
        move = chess.Move.from_uci(best)
    except ValueError:
        return "no best move"
    board = chess.Board(fen)
    if board.is_legal(move):
        return "legal"
    piece = board.piece_at(move.from_square)
    if piece is None or piece.color != board.turn:
        return "not the mover's piece"
    if not board.is_pseudo_legal(move):
        return "not a move of that piece"
    return "king steps into check" if piece.piece_type == chess.KING else \
        "leaves the king in check"


def count(model: str, samples: int) -> Counter:
    from rookworld import runtime
    from rookworld.chess_tasks import parse_policy
    from rookworld.config import compose, instantiate
    from rookworld.data_io import read_samples
    from rookworld.evaluation import Evaluator
    from rookworld.model import load_embedded

    runtime.setup()
    cfg = compose([])
    held = [s for s in read_samples(cfg.data.eval) if s.task == "P"][:samples]
    policy = load_embedded(None if model == "shipped" else model)
    texts = Evaluator(held, instantiate(cfg.sampler)).completions(policy, "P")
    return Counter(kind(s.truth.fen, parse_policy(t).best) for s, t in zip(held, texts))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", default=["shipped"],
                    help="`shipped` or model directories (default: shipped)")
    ap.add_argument("--samples", type=int, default=500, help="held-out P samples (default 500)")
    args = ap.parse_args()
    models = args.models
    counts = [count(m, args.samples) for m in models]
    print("| kind | " + " | ".join(models) + " |")
    print("|---|" + "---|" * len(models))
    for k in KINDS:
        print(f"| {k} | " + " | ".join(str(c[k]) for c in counts) + " |")


if __name__ == "__main__":
    main()
