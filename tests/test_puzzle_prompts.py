"""The strength-levers experiment's puzzle training file: bundled puzzles the strength suite
does not score, each kept only where its engine label's best move solves it (slow: it reads
all 100,000 bundled rows)."""

import gzip
import json
import subprocess
import sys
from pathlib import Path

import chess
import pytest

from rookworld.config import pkg_strength
from rookworld.strength.puzzles import is_right, read_puzzles

SCRIPT = (Path(__file__).resolve().parents[1] / "experiments" / "strength_levers"
          / "puzzle_prompts.py")


@pytest.mark.slow
def test_puzzles_after_the_skipped_ones_with_their_solution_as_the_best_move(tmp_path,
                                                                              stockfish):
    out = tmp_path / "train.jsonl.gz"
    done = subprocess.run([sys.executable, str(SCRIPT), str(out), "--skip", "1490",
                           "--others", "7"], capture_output=True, text=True, check=True)
    rows = [json.loads(line) for line in gzip.open(out, "rt")]
    bundled = read_puzzles(pkg_strength("lichess_puzzles.csv")).puzzles
    tail = {p.puzzle_id: p for p in bundled[1490:]}
    puzzles = [r for r in rows if "puzzle" in r["meta"]]
    assert puzzles and {r["meta"]["puzzle"] for r in puzzles} <= tail.keys()  # none scored
    for r in puzzles:
        p = tail[r["meta"]["puzzle"]]
        assert r["truth"]["fen"] == p.fen and r["completion"].endswith("B: " + r["truth"]["best"])
        assert is_right(chess.Board(p.fen), r["truth"]["best"], p.solution[0])
    assert sum(r["task"] == "P" for r in rows) == len(puzzles) + 7
    assert sum(r["task"] == "A" for r in rows) == 60_000
    assert f"{len(puzzles)} puzzles of {len(tail)}" in done.stdout
