"""Measured parts of a completion against its ground truth: pure functions,
shared by every reward and by the evaluator's held-out metrics.

All parts are floats; "higher is better" except `eval_error`. Moves count only
in canonical UCI as python-chess writes them (castling `e1g1`, never the
king-takes-rook `e1h1`; promotions with their piece, `e7e8q`), the notation
the engine labels and the training data use.
"""

from __future__ import annotations

from functools import lru_cache

import chess

from rookworld.chess_tasks import (
    EnvTruth,
    ParsedPolicy,
    PolicyTruth,
    env_completion,
    parse_env,
    parse_policy,
)

EVAL_CAP = 10.0
"""Pawns: the most one move's eval error counts, and `eval_error` when no
listed move matches an engine move. Mate scores (~ +-999.99) stay bounded."""

POLICY_PARTS = ("format", "legal", "best_legal", "top5", "eval_error", "best")
ENV_PARTS = ("format", "fen_exact", "fen_similarity", "reward", "flags", "exact")
FEN_FIELDS = 5  # side to move, castling, en passant, halfmove clock, fullmove number


@lru_cache(maxsize=16384)
def legal_moves(fen: str) -> frozenset[str]:
    """Canonical UCI strings of the legal moves in `fen`. Raises ValueError for
    an invalid FEN: ground truth must be valid, so that is a data bug."""
    return frozenset(m.uci() for m in chess.Board(fen).legal_moves)


def policy_parts(truth: PolicyTruth, completion: str) -> dict[str, float]:
    """Parts of a P completion (never raises on any string):

    - format: 1 if `parse_policy` finds every field well-formed, else 0.
    - legal: share of the distinct listed UCI-shaped moves that are legal in the
      FEN (a repeated move counts once, in numerator and denominator; 0 when none
      listed).
    - best_legal: 1 if the `B:` move is legal.
    - top5: |listed ∩ engine moves| / max(|listed|, |engine moves|), over
      distinct moves: listing exactly the engine's moves scores 1; listing
      extra or fewer moves scores less.
    - eval_error: mean |eval - engine eval| in pawns over the distinct listed
      moves that are engine moves (the first eval written for each, paired by
      position), each error capped at EVAL_CAP; EVAL_CAP when none matches.
      Engine evals are rounded to 2 decimals first, the format's precision.
    - best: 1 if the `B:` move has the engine's highest eval (ties all count),
      i.e. it is `truth.best` or tied with it.

    >>> t = PolicyTruth("8/8/8/8/8/8/4k3/K7 w - - 0 1", ("a1b1", "a1a2"), (-0.1, -0.3), "a1b1")
    >>> policy_parts(t, " M: a1b1 a1b2  E: -0.2 0.0  B: a1b1")
    {'format': 1.0, 'legal': 1.0, 'best_legal': 1.0, 'top5': 0.5, 'eval_error': 0.1, 'best': 1.0}
    """
    return parsed_policy_parts(truth, parse_policy(completion))


def parsed_policy_parts(truth: PolicyTruth, parsed: ParsedPolicy) -> dict[str, float]:
    """`policy_parts` of an already parsed completion."""
    legal = legal_moves(truth.fen)
    listed = set(parsed.moves)
    engine = set(truth.moves)
    return {
        "format": float(parsed.ok),
        "legal": len(listed & legal) / len(listed) if listed else 0.0,
        "best_legal": float(parsed.best in legal),
        "top5": len(listed & engine) / max(len(listed), len(engine), 1),
        "eval_error": eval_error(truth, parsed.moves, parsed.evals),
        "best": float(parsed.best in best_moves(truth)),
    }


def best_moves(truth: PolicyTruth) -> frozenset[str]:
    """The engine moves whose eval equals the highest (usually one move)."""
    if not truth.evals:
        return frozenset()
    top = max(truth.evals)
    return frozenset(m for m, e in zip(truth.moves, truth.evals, strict=False) if e == top)


def eval_error(truth: PolicyTruth, moves, evals) -> float:
    """Mean capped |eval error| in pawns over listed moves that are engine moves
    (see `policy_parts`); EVAL_CAP when none is."""
    engine = {m: round(e, 2) for m, e in zip(truth.moves, truth.evals, strict=False)}
    errors: dict[str, float] = {}
    for move, ev in zip(moves, evals, strict=False):
        if move in engine and move not in errors:
            errors[move] = min(abs(ev - engine[move]), EVAL_CAP)
    return sum(errors.values()) / len(errors) if errors else EVAL_CAP


def env_parts(truth: EnvTruth, completion: str) -> dict[str, float]:
    """Parts of an A completion (never raises on any string):

    - format: 1 if `parse_env` finds four fields, a valid FEN, a known reward
      value and 0/1 flags, else 0.
    - fen_exact: 1 if the FEN field (surrounding whitespace stripped) equals
      the oracle's.
    - fen_similarity: `fen_similarity(fen field, oracle FEN)`, 0..1.
    - reward: 1 if the reward field's value equals the oracle's.
    - flags: 1 if terminated and truncated both equal the oracle's.
    - exact: 1 if the whole completion equals the oracle's text character for
      character.

    >>> t = EnvTruth("8/8/8/8/8/8/4k3/K7 w - - 0 1", "a1b1", ("a1b1",),
    ...              "8/8/8/8/8/8/4k3/1K6 b - - 1 1", "0.001", 0, 0)
    >>> env_parts(t, "8/8/8/8/8/8/4k3/1K6 b - - 1 1+0.001+0+1")["flags"]
    0.0
    """
    parsed = parse_env(completion)
    return {
        "format": float(parsed.ok),
        "fen_exact": float(parsed.new_fen == truth.new_fen),
        "fen_similarity": fen_similarity(parsed.new_fen, truth.new_fen),
        "reward": float(parsed.reward is not None and parsed.reward == float(truth.reward)),
        "flags": float(parsed.terminated == truth.terminated
                       and parsed.truncated == truth.truncated),
        "exact": float(completion == env_completion(truth)),
    }


def fen_similarity(fen: str, truth_fen: str) -> float:
    """(share of the 64 squares that agree + share of the 5 other FEN fields
    that agree) / 2. `fen` need not be a valid FEN: its placement is read rank
    by rank (digits 1-8 are empty squares, missing squares never agree).

    >>> fen_similarity("8/8/8/8/8/8/4k3/1K6 w - - 1 1", "8/8/8/8/8/8/4k3/1K6 b - - 1 1")
    0.9
    """
    toks, truth_toks = fen.split(), truth_fen.split()
    squares = _squares(toks[0] if toks else "")
    same_squares = sum(map(str.__eq__, squares, _truth_squares(truth_toks[0])))
    fields = toks[1:1 + FEN_FIELDS]
    same_fields = sum(map(str.__eq__, fields, truth_toks[1:1 + FEN_FIELDS]))
    # one division keeps exact ratios (e.g. 0.9) exact
    return (FEN_FIELDS * same_squares + 64 * same_fields) / (2 * 64 * FEN_FIELDS)


_EXPAND = str.maketrans({str(n): "." * n for n in range(1, 9)})


def _squares(placement: str) -> str:
    """64 square symbols, rank 8 first: a piece letter, '.' empty, '?' missing.
    A rank's first 8 characters cover its 8 squares, so the rest is ignored."""
    ranks = placement.split("/", 8)[:8]
    ranks += [""] * (8 - len(ranks))
    return "".join((rank[:8].translate(_EXPAND) + "????????")[:8] for rank in ranks)


_truth_squares = lru_cache(maxsize=16384)(_squares)
