"""Check one raw P or A record against python-chess and its own fields.

A record is what a source row says (FEN, moves, evals, `B:`; or FEN, move,
history, completion). `check_*` returns the defect classes it shows; the
loader decides what to do with them (see `FIXABLE`).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import chess

from rookworld.chess_tasks.environment import HISTORY_LEN, env_completion, env_step, legal_move
from rookworld.chess_tasks.policy import MAX_MOVES, best_of

# defect class -> what it means. Classes in FIXABLE can be relabelled from the
# record itself (argmax(E), the oracle, the canonical FEN); the rest cannot.
DEFECTS = {
    "unparseable": "row is not a P/A record (bad JSON, wrong fields, binary junk)",
    "bad_fen": "FEN does not parse",
    "fen_not_canonical": "FEN parses but differs from python-chess board.fen()",
    "game_over": "position has no legal move",
    "no_moves": "P: no moves",
    "eval_count": "P: number of evals differs from number of moves",
    "bad_eval": "P: an eval is not a finite number",
    "too_many_moves": f"P: more than {MAX_MOVES} moves in M: (the engine's MultiPV lines)",
    "illegal_move": "P: a move in M: is not a legal move of the position in canonical UCI",
    "duplicate_move": "P: a move appears twice in M:",
    "best_not_argmax": "P: B: is not the move with the highest eval (of tied ones the first)",
    "bad_history": "A: history empty, longer than 10, or not ending with the move",
    "a_completion_wrong": "A: completion differs from the python-chess oracle",
    "text_mismatch": "JSON row: prompt/completion differ from the text its truth builds",
}
FIXABLE = {"fen_not_canonical", "best_not_argmax", "a_completion_wrong", "text_mismatch"}


def _board(fen: str) -> tuple[chess.Board | None, list[str]]:
    try:
        board = chess.Board(fen)
    except (ValueError, TypeError):
        return None, ["bad_fen"]
    return board, ([] if board.fen() == fen else ["fen_not_canonical"])


def check_policy(fen: str, moves, evals, best: str) -> list[str]:
    """Defects of a P record whose `B:` field reads `best`."""
    board, defects = _board(fen)
    if board is None:
        return defects
    if not moves:
        return defects + ["no_moves"]
    if len(evals) != len(moves):
        defects.append("eval_count")
    finite = all(isinstance(e, (int, float)) and math.isfinite(e) for e in evals)
    if not finite:  # JSON reads NaN and Infinity; no comparison with them means anything
        defects.append("bad_eval")
    if len(moves) > MAX_MOVES:
        defects.append("too_many_moves")
    if len(set(moves)) != len(moves):
        defects.append("duplicate_move")
    if not all(_legal(board, m) for m in moves):
        defects.append("illegal_move")
    elif finite and len(evals) == len(moves) and best != best_of(moves, evals):
        defects.append("best_not_argmax")  # the sample's B: is best_of's: a change is counted
    return defects


def check_env(fen: str, move: str, history, completion: str) -> list[str]:
    """Defects of an A record (the oracle's completion is compared exactly)."""
    board, defects = _board(fen)
    if board is None:
        return defects
    if board.is_game_over():
        defects.append("game_over")
    history = tuple(history)
    if not history or len(history) > HISTORY_LEN or history[-1] != move:
        defects.append("bad_history")
    if completion != env_completion(env_step(board.fen(), move, history)):
        defects.append("a_completion_wrong")
    return defects


def _legal(board: chess.Board, uci: str) -> bool:
    """Legal and written as the rewards read moves (`legal_move`: canonical UCI, so not
    castling as the king taking its rook)."""
    return isinstance(uci, str) and legal_move(board, uci) is not None


@dataclass
class DefectReport:
    """What a load found. counts: defect class -> rows showing it (a row may show
    several); examples: the first offending row (cut to 160 chars) per class."""

    source: str
    on_defect: str
    rows: int = 0
    kept: int = 0
    dropped: int = 0
    relabelled: int = 0
    counts: Counter = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)

    def add(self, defects: list[str], row: str) -> None:
        for d in defects:
            self.counts[d] += 1
            self.examples.setdefault(d, row[:160])

    def as_dict(self) -> dict:
        return {"source": self.source, "on_defect": self.on_defect, "rows": self.rows,
                "kept": self.kept, "dropped": self.dropped, "relabelled": self.relabelled,
                "defects": dict(self.counts)}

    def summary(self) -> str:
        lines = [f"{self.source}: {self.rows} rows, {self.kept} kept "
                 f"({self.relabelled} relabelled), {self.dropped} dropped "
                 f"[on_defect={self.on_defect}]"]
        for d, n in sorted(self.counts.items(), key=lambda kv: -kv[1]):
            fix = "fixable" if d in FIXABLE else "not fixable"
            lines.append(f"  {d:<20} {n:>6}  ({fix}) {DEFECTS[d]}")
        return "\n".join(lines)
