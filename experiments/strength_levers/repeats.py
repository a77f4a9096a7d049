"""How often the model's greedy P answers list a move twice, before and after a run: the
share of answers whose candidate list (`M:`) repeats a move, with its ~95% interval, and
the mean number of distinct listed moves, on the first N held-out P positions. Move credit
pays each listed slot for its legality, so a list of one safe move written five times
earns five legal slots; the reward's `legal` and `top5` parts count distinct moves.

    python experiments/strength_levers/repeats.py shipped \
        outputs/strength_levers_f32/default/seed0/checkpoints/step-000045/model
"""

from __future__ import annotations

import argparse
import math

from rookworld.chess_tasks import parse_policy
from rookworld.config import pkg_data
from rookworld.data.load import read_samples
from rookworld.policy import load_embedded
from rookworld.sampling import per_task_settings
from rookworld.strength.player import ModelPlayer


def repeats(model: str, fens: list[str]) -> tuple[int, int, float]:
    """(answers with a list, those repeating a move, mean distinct listed moves) of one
    model ("shipped" or a model directory) over fens, greedy."""
    policy = load_embedded() if model == "shipped" else load_embedded(model)
    answers = ModelPlayer(policy, per_task_settings()["P"]).answers(fens)
    lists = [parse_policy(a.text).moves for a in answers]
    lists = [m for m in lists if m]
    repeated = sum(len(set(m)) < len(m) for m in lists)
    return len(lists), repeated, sum(len(set(m)) for m in lists) / max(len(lists), 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", help='"shipped" or model directories')
    ap.add_argument("--positions", type=int, default=500, help="first N held-out P positions")
    args = ap.parse_args()
    fens = [s.truth.fen for s in read_samples(pkg_data("eval.jsonl.gz"))
            if s.task == "P"][:args.positions]
    print("| model | answers with a list | of them repeating a move | distinct listed moves |")
    print("|---|---|---|---|")
    for model in args.models:
        n, rep, distinct = repeats(model, fens)
        p = rep / max(n, 1)
        half = 1.96 * math.sqrt(p * (1 - p) / max(n, 1))
        print(f"| {model} | {n} | {p:.3f} ± {half:.3f} | {distinct:.2f} |")


if __name__ == "__main__":
    main()
