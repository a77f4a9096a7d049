"""Why a model's P best move is illegal: its greedy answers on the held-out P samples (or
another file's, --data), each best move sorted into one kind, and how often it is legal in
each kind of position.

    python experiments/embedded_baseline/illegal_moves.py [MODEL ...] [--samples N] [--group G]
        [--data FILE]

MODEL: `shipped` (the default) or a model directory in the embedded layout (a run's
checkpoints/step-N/model). Kinds, for a best move that parses as UCI:
  legal
  not the mover's piece      the from-square is empty or holds the opponent's piece
  not a move of that piece   the mover's piece cannot make it (geometry, a blocked line,
                             castling without the right, a pawn's capture onto nothing)
  king steps into check      a king move to an attacked square
  does not answer a check    the side to move is in check and another piece's move
                             leaves it there
  moves a pinned piece       another piece's move that exposes the king
  no best move               the `B:` field is missing or not UCI
Positions: in check; not in check with at most FEW legal moves; the rest. With --group G,
also what a training group would hold there: G completions per position sampled at the
default sampler's temperature (generator seed 0), the share whose best move is legal and
the positions where at least one is (without one, a group gives its best moves no signal).
"""

from __future__ import annotations

import argparse
from collections import Counter

import chess

KINDS = ("legal", "not the mover's piece", "not a move of that piece",
         "king steps into check", "does not answer a check", "moves a pinned piece",
         "no best move")
FEW = 5
POSITIONS = ("in check", f"not in check, <= {FEW} legal moves", "the rest")


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
    if piece.piece_type == chess.KING:
        return "king steps into check"
    return "does not answer a check" if board.is_check() else "moves a pinned piece"


def position(fen: str) -> str:
    """The kind (POSITIONS) of position `fen`."""
    board = chess.Board(fen)
    if board.is_check():
        return POSITIONS[0]
    return POSITIONS[1] if board.legal_moves.count() <= FEW else POSITIONS[2]


def count(model: str, samples: int, group: int = 0, data: str | None = None
          ) -> tuple[Counter, ...]:
    """-> (best moves per kind, positions per kind, legal best moves per kind of position;
    with group > 0 also sampled legal best moves and positions with one, per kind)."""
    from rookworld import runtime
    from rookworld.chess_tasks import parse_policy
    from rookworld.config import compose, instantiate
    from rookworld.data.load import read_samples
    from rookworld.held_out import Evaluator
    from rookworld.policy import load_embedded

    runtime.setup()
    cfg = compose([])
    held = [s for s in read_samples(data or cfg.data.eval) if s.task == "P"][:samples]
    policy = load_embedded(None if model == "shipped" else model)
    texts = Evaluator(held, instantiate(cfg.sampler)).completions(policy, "P")
    kinds = [kind(s.truth.fen, parse_policy(t).best) for s, t in zip(held, texts)]
    where = [position(s.truth.fen) for s in held]
    out = (Counter(kinds), Counter(where),
           Counter(w for w, k in zip(where, kinds) if k == "legal"))
    if group:
        import torch

        from rookworld.backends.fast_gpt2.decode import sample
        settings, gen, texts = instantiate(cfg.sampler)["P"], torch.Generator().manual_seed(0), []
        for i in range(0, len(held), 16):  # 16 positions x group rows a batch
            prompts = [policy.encode_prompt(s.prompt) for s in held[i:i + 16]
                       for _ in range(group)]
            r = sample(policy.model, prompts, settings, policy.eos_id, gen)
            texts += policy.decode_completions(r.completion_ids, r.completion_mask)
        legal = [kind(held[i // group].truth.fen, parse_policy(t).best) == "legal"
                 for i, t in enumerate(texts)]
        out += (Counter(w for w, ok in zip((w for w in where for _ in range(group)), legal)
                        if ok),
                Counter(w for i, w in enumerate(where) if any(legal[i * group:(i + 1) * group])))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", default=["shipped"],
                    help="`shipped` or model directories (default: shipped)")
    ap.add_argument("--samples", type=int, default=500, help="P samples (default 500)")
    ap.add_argument("--data", default=None,
                    help="samples file (default: the held-out split, data.eval)")
    ap.add_argument("--group", type=int, default=0,
                    help="completions sampled per position (default 0: none)")
    args = ap.parse_args()
    models = args.models
    counts = [count(m, args.samples, args.group, args.data) for m in models]
    print("| kind | " + " | ".join(models) + " |")
    print("|---|" + "---|" * len(models))
    for k in KINDS:
        print(f"| {k} | " + " | ".join(str(c[0][k]) for c in counts) + " |")
    print("\n| position (legal best moves / positions) | " + " | ".join(models) + " |")
    print("|---|" + "---|" * len(models))
    for p in POSITIONS:
        print(f"| {p} | " + " | ".join(f"{c[2][p]} / {c[1][p]}" for c in counts) + " |")
    if args.group:
        print(f"\n| position (sampled best moves legal; positions whose {args.group} hold a legal "
              "one) | " + " | ".join(models) + " |")
        print("|---|" + "---|" * len(models))
        for p in POSITIONS:
            print(f"| {p} | " + " | ".join(
                f"{c[3][p] / (args.group * c[1][p]) if c[1][p] else 0:.3f}; {c[4][p]} / {c[1][p]}"
                for c in counts)
                + " |")


if __name__ == "__main__":
    main()
