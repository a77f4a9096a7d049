"""What GRPO has to learn from: how often a group of the model's sampled P answers holds a
better move than its greedy one. For the first N bundled puzzles and the first N held-out P
positions it prints, greedy and for k samples at each temperature, the share of answers
that solve the puzzle (any mate counts in a mate-in-1) or name the engine's best move, the
share of prompts where any of the k does (pass@k), and the share of prompts whose k
answers are mixed, some right and some not: the only prompts where a reward for the right
move gives the move a nonzero advantage within its group. Each share has its ~95% normal
interval over prompts. For held-out positions it also gives the share of groups whose legal
B: moves differ in labelled engine quality (`credit.labelled_quality`), where a quality
credit has something to push.

    python experiments/strength_levers/pass_at_k.py shipped --positions 500 --k 8
"""

from __future__ import annotations

import argparse
import math

import chess

from rookworld.chess_tasks import parse_policy
from rookworld.config import pkg_data, pkg_strength
from rookworld.credit import labelled_quality
from rookworld.data.load import read_samples
from rookworld.policy import load_embedded
from rookworld.sampling import per_task_settings
from rookworld.strength.player import ModelPlayer
from rookworld.strength.puzzles import is_legal, is_right, read_puzzles


def share(k: float, n: int) -> str:
    """k of n as a share with its ~95% normal interval."""
    p = k / max(n, 1)
    return f"{p:.3f} ± {1.96 * math.sqrt(p * (1 - p) / max(n, 1)):.3f}"


def groups(player: ModelPlayer, fens: list[str], k: int) -> list[list[str]]:
    """k sampled completions per position, as [position][sample]."""
    draws = [[a.text for a in player.answers(fens)] for _ in range(k)]
    return [[d[i] for d in draws] for i in range(len(fens))]


def rows(name: str, right: list[list[bool]]) -> list[str]:
    """Table cells for one set of answers: per answer, pass@k, mixed groups."""
    n = len(right)
    per = sum(map(sum, right)) / max(len(right[0]), 1)
    return [name, share(per, n), share(sum(map(any, right)), n),
            share(sum(any(r) and not all(r) for r in right), n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help='"shipped" or a model directory')
    ap.add_argument("--positions", type=int, default=500,
                    help="first N bundled puzzles and first N held-out P positions")
    ap.add_argument("--k", type=int, default=8, help="samples per prompt (the group size)")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.7, 1.0])
    args = ap.parse_args()
    policy = load_embedded() if args.model == "shipped" else load_embedded(args.model)
    settings = per_task_settings()["P"]
    puzzles = read_puzzles(pkg_strength("lichess_puzzles.csv"), args.positions).puzzles
    truths = [s.truth for s in read_samples(pkg_data("eval.jsonl.gz"))
              if s.task == "P"][:args.positions]

    def solved(texts: list[str], i: int) -> list[bool]:
        p = puzzles[i]
        return [is_right(chess.Board(p.fen), parse_policy(t).best or None, p.solution[0])
                for t in texts]

    def best(texts: list[str], i: int) -> list[bool]:
        return [parse_policy(t).best == truths[i].best for t in texts]

    def quality_spread(texts: list[str], i: int) -> bool:
        board = chess.Board(truths[i].fen)
        legal = [m for m in (parse_policy(t).best for t in texts) if is_legal(board, m)]
        return len({labelled_quality(truths[i], m) for m in legal}) > 1

    sets = {"puzzles, first move solved": ([p.fen for p in puzzles], solved),
            "held-out P, the engine's best move": ([t.fen for t in truths], best)}
    print(f"| prompts | answers | right answers | pass@{args.k} | mixed groups |")
    print("|---|---|---|---|---|")
    spreads = {}
    for label, (fens, judge) in sets.items():
        greedy = [[a.text] for a in ModelPlayer(policy, settings).answers(fens)]
        print("| " + " | ".join([label] + rows("greedy", [judge(g, i) for i, g in
                                                           enumerate(greedy)])[:2]) + " | | |")
        for t in args.temperatures:
            drawn = groups(ModelPlayer(policy, settings, temperature=t, seed=1), fens, args.k)
            right = [judge(g, i) for i, g in enumerate(drawn)]
            print("| " + " | ".join([label] + rows(f"{args.k} at T={t}", right)) + " |")
            if judge is best:
                spreads[t] = sum(quality_spread(g, i) for i, g in enumerate(drawn))
    for t, k in spreads.items():
        print(f"\nheld-out P groups at T={t} whose legal B: moves differ in labelled quality: "
              f"{share(k, len(truths))}")


if __name__ == "__main__":
    main()
