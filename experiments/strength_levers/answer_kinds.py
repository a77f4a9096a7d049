"""What kind of move the model answers a puzzle with, before and after a run: the share of
its legal first answers that capture and that give check, beside the share of the puzzles'
solutions that capture, and the share of its illegal answers (a move in UCI that is not
legal) that land on an opponent's piece, each with its ~95% interval. Read from the strength suite's
per-puzzle answers (<run>/strength/start/strength.json and the final step's).

    python experiments/strength_levers/answer_kinds.py outputs/strength_levers/quality/seed0 ...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import chess

from rookworld.config import pkg_strength
from rookworld.strength.puzzles import read_puzzles


def puzzle_positions() -> dict[str, tuple[chess.Board, chess.Move]]:
    """id -> (the position the solver faces, its first solution move), bundled puzzles."""
    return {p.puzzle_id: (chess.Board(p.fen), chess.Move.from_uci(p.solution[0]))
            for p in read_puzzles(pkg_strength("lichess_puzzles.csv")).puzzles}


def kinds(report: Path, puzzles: dict) -> dict[str, float]:
    """Shares over one strength.json's free-mode puzzle answers."""
    rows = json.loads(report.read_text())["free"]["puzzles"]["rows"]
    legal = capture = check = solution_capture = answered = onto_piece = 0
    for row in rows:
        board, solution = puzzles[row["id"]]
        solution_capture += board.is_capture(solution)
        try:
            move = chess.Move.from_uci(row["answers"][0]) if row["answers"] else None
        except ValueError:
            move = None
        if move is not None and move in board.legal_moves:
            legal += 1
            capture += board.is_capture(move)
            check += board.gives_check(move)
        elif move is not None:  # an illegal move: does it land on an opponent's piece?
            answered += 1
            target = board.piece_at(move.to_square)
            onto_piece += target is not None and target.color != board.turn
    return {"legal": (legal, len(rows)), "capture": (capture, legal), "check": (check, legal),
            "illegal_onto_piece": (onto_piece, answered),
            "solution_capture": (solution_capture, len(rows))}


def share(count: tuple[int, int]) -> str:
    """k of n as a share with its ~95% normal interval."""
    k, n = count
    p = k / max(n, 1)
    return f"{p:.3f} ± {1.96 * (p * (1 - p) / max(n, 1)) ** 0.5:.3f}"


def main(runs: list[str]) -> None:
    puzzles = puzzle_positions()
    print("| run | legal answers | of them captures | of them checks "
          "| illegal answers onto an opponent's piece | solutions that capture |")
    print("|---|---|---|---|---|---|")
    for run in map(Path, runs):
        final = max((run / "strength").glob("step-*"), key=lambda p: int(p.name[5:]))
        before, after = (kinds(p / "strength.json", puzzles) for p in
                         (run / "strength" / "start", final))
        cells = [f"{share(before[k])} -> {share(after[k])}"
                 for k in ("legal", "capture", "check", "illegal_onto_piece")]
        print(f"| {run} | " + " | ".join(cells) + f" | {share(before['solution_capture'])} |")


if __name__ == "__main__":
    main(sys.argv[1:])
