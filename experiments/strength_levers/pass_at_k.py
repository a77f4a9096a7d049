"""What GRPO has to learn from: how often a group of the model's sampled P answers holds a
better move than its greedy one. For the first N bundled puzzles and the first N held-out P
positions it prints, greedy and for k samples at each temperature, the share of answers
that solve the puzzle (its first move, or any mating move, as the strength suite scores
it) or name the engine's labelled best move (`PolicyTruth.best`, without the ties
`eval/P/best` counts), the share of prompts where any of the k does (pass@k), and the share
of prompts whose k answers are mixed, some right and some not: the only prompts where a
reward for the right move reaching the move (sequence credit, or move quality under move
credit) gives it a nonzero advantage within its group. Each share has a ~95% normal
interval over prompts (for the share of answers, p(1-p)/prompts: conservative). For
held-out positions it also gives the share of all N groups whose legal B: moves differ in
labelled engine quality (`credit.labelled_quality`), where quality credit has something to
push (a B: move without the M:/E: fields before it counts too, as the player reads it,
though move credit reaches only well-formed answers).

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


def solves(puzzle, text: str) -> bool:
    """The completion's B: move solves the puzzle's first move."""
    return is_right(chess.Board(puzzle.fen), parse_policy(text).best or None, puzzle.solution[0])


def names_best(truth, text: str) -> bool:
    """The completion's B: move is the engine's labelled best move."""
    return parse_policy(text).best == truth.best


def quality_differs(truth, texts: list[str]) -> bool:
    """The completions' legal B: moves (read as the player reads them) differ in labelled
    engine quality."""
    board = chess.Board(truth.fen)
    legal = [m for m in (parse_policy(t).best for t in texts) if is_legal(board, m)]
    return len({labelled_quality(truth, m) for m in legal}) > 1


def group_shares(right: list[list[bool]]) -> tuple[float, float, float]:
    """(share of answers right, share of groups with any right, share of mixed groups) over
    groups of answers judged right or not."""
    n = len(right)
    return (sum(map(sum, right)) / sum(map(len, right)), sum(map(any, right)) / n,
            sum(any(r) and not all(r) for r in right) / n)


def groups(player: ModelPlayer, fens: list[str], k: int) -> list[list[str]]:
    """k sampled completions per position, as [position][sample]."""
    draws = [[a.text for a in player.answers(fens)] for _ in range(k)]
    return [[d[i] for d in draws] for i in range(len(fens))]


def rows(name: str, right: list[list[bool]]) -> list[str]:
    """Table cells for one set of answers: per answer, pass@k, mixed groups."""
    n = len(right)
    return [name] + [share(x * n, n) for x in group_shares(right)]


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
        return [solves(puzzles[i], t) for t in texts]

    def best(texts: list[str], i: int) -> list[bool]:
        return [names_best(truths[i], t) for t in texts]

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
                spreads[t] = sum(quality_differs(truths[i], g) for i, g in enumerate(drawn))
    for t, k in spreads.items():
        print(f"\nheld-out P groups at T={t} whose legal B: moves differ in labelled quality: "
              f"{share(k, len(truths))}")


if __name__ == "__main__":
    main()
