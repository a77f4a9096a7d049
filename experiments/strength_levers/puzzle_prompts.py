"""A training file whose P positions include real Lichess puzzles, disjoint from the ones the
strength suite scores, each labelled so that its solution is the sample's best move.

    python experiments/strength_levers/puzzle_prompts.py OUT.jsonl.gz [--skip 1000] [--others N]

Reads the bundled puzzle file (rookworld/assets/strength/lichess_puzzles.csv), skips the
first SKIP readable puzzles (the suite scores the first 1,000), and labels each remaining
puzzle's position with Stockfish at depth 8, five moves (the bundled data's labels). A
puzzle is kept when the engine's best move there is the puzzle's solution, or any mate when
the solution mates (Lichess accepts every mating move), so the label's best move is the
solution and a reward on the best move (`reward.policy_weights.best`, or
`algorithm.move_quality` under move credit) pays for solving it. Puzzles the engine
disagrees with at that depth are dropped and counted. OTHERS of the bundled P samples
(default: as many as the puzzles) and every A sample join them, shuffled;
`python -m rookworld.train data.train=OUT.jsonl.gz` then draws from it.
"""

from __future__ import annotations

import argparse
import json
import random

import chess
from only_moves import bundled_rows, write_mix

from rookworld.chess_tasks.policy import policy_sample
from rookworld.chess_tasks.stockfish_pool import EnginePool
from rookworld.config import pkg_strength
from rookworld.strength.puzzles import is_right, read_puzzles


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--skip", type=int, default=1000,
                    help="readable puzzles left out at the file's start (the suite's)")
    ap.add_argument("--others", type=int, default=None,
                    help="bundled P samples to keep (default: as many as the puzzles kept)")
    ap.add_argument("--depth", type=int, default=8, help="Stockfish depth of the labels")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    puzzles = read_puzzles(pkg_strength("lichess_puzzles.csv")).puzzles[args.skip:]
    with EnginePool(processes=2, depth=args.depth, multipv=5) as pool:
        labels = pool.analyse_many([p.fen for p in puzzles])
    kept, disagree = [], 0
    for p, a in zip(puzzles, labels, strict=True):
        sample = policy_sample(p.fen, a.moves, a.evals, a.label,
                               {"puzzle": p.puzzle_id, "rating": p.rating})
        if is_right(chess.Board(p.fen), sample.truth.best, p.solution[0]):
            kept.append(json.dumps(sample.to_json()))
        else:
            disagree += 1
    _, others, env = bundled_rows(lambda row: False)
    p = write_mix(args.out, kept, others, env, args.others, rng)
    print(f"{args.out}: {p} P ({len(kept)} puzzles of {len(puzzles)}: {disagree} dropped, the "
          f"depth-{args.depth} best move not their solution), {len(env)} A")


if __name__ == "__main__":
    main()
