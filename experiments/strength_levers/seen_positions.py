"""Can GRPO make the B: move better on the positions it trains on? `write` makes a training
file of N bundled P positions (drawn at random from the train split, no A samples): a run of
45 steps of 16 prompts trains on each of 64 positions about 11 times on average (the
default prompt filter draws twice as many and keeps the 16 whose greedy answers score
lowest, so positions the model answers illegally are trained on first). `measure` gives,
for each model, the greedy answers' share naming the engine's labelled best move, their
mean labelled engine quality (`credit.labelled_quality`, 0 for an illegal or unlabelled
move) and the share of legal B: moves on those positions, and each later model's change
against the first, paired by position, each with its ~95% interval.

    python experiments/strength_levers/seen_positions.py write OUT.jsonl.gz --n 64
    python -m rookworld.train data.train=OUT.jsonl.gz task_mix=policy_only \
        algorithm.move_quality=4.0
    python experiments/strength_levers/seen_positions.py measure OUT.jsonl.gz shipped \
        RUN/checkpoints/step-000045/model

(`run.sh`'s arm seen64 makes the file and runs the second command with its strength
measures and overrides.)
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
from pathlib import Path

import chess

from rookworld.config import pkg_data
from rookworld.credit import labelled_quality
from rookworld.data.load import read_samples
from rookworld.data.loaders import read_lines
from rookworld.held_out import mean_se
from rookworld.policy import load_embedded
from rookworld.sampling import per_task_settings
from rookworld.strength.player import ModelPlayer
from rookworld.strength.puzzles import is_legal

KEYS = ("best", "quality", "legal")


def write(out: str, n: int, seed: int) -> None:
    """N bundled train-split P rows drawn at random, as a .jsonl.gz training file."""
    rows = [line for line in read_lines(Path(pkg_data("train.jsonl.gz")))
            if json.loads(line)["task"] == "P"]
    rows = random.Random(seed).sample(rows, n)
    Path(out).write_bytes(gzip.compress("".join(r + "\n" for r in rows).encode(), mtime=0))
    print(f"{out}: {n} P positions")


def mean_ci(values: list[float]) -> str:
    """Mean with its ~95% normal interval."""
    m, se = mean_se(values)
    return f"{m:.3f} ± {1.96 * se:.3f}"


def scores(truths, moves: list[str | None]) -> dict[str, list[float]]:
    """Per position: the move is the engine's labelled best (1/0), its labelled engine
    quality (0 for an illegal or unlabelled move), it is legal (1/0)."""
    legal = [is_legal(chess.Board(t.fen), m) for t, m in zip(truths, moves)]
    return {"best": [float(m == t.best) for t, m in zip(truths, moves)],
            "quality": [labelled_quality(t, m) if ok else 0.0
                        for t, m, ok in zip(truths, moves, legal)],
            "legal": [float(ok) for ok in legal]}


def measure(path: str, models: list[str]) -> None:
    """Greedy best-move share, labelled quality and legality of each model on path's P
    positions, and each later model's change against the first, paired by position."""
    truths = [s.truth for s in read_samples(path) if s.task == "P"]
    print(f"{len(truths)} positions of {path}\n")
    print("| model | the engine's best move | labelled engine quality | legal B: move |")
    print("|---|---|---|---|")
    first = None
    for model in models:
        policy = load_embedded() if model == "shipped" else load_embedded(model)
        got = scores(truths, ModelPlayer(policy, per_task_settings()["P"])(
            [t.fen for t in truths]))
        print(f"| {model} | " + " | ".join(mean_ci(got[k]) for k in KEYS) + " |")
        if first is None:
            first = got
        else:
            print(f"| change against {models[0]} | " + " | ".join(
                mean_ci([b - a for a, b in zip(first[k], got[k])]) for k in KEYS) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="make the training file")
    w.add_argument("out")
    w.add_argument("--n", type=int, default=64, help="P positions")
    w.add_argument("--seed", type=int, default=0)
    m = sub.add_parser("measure", help="greedy answers on the file's positions")
    m.add_argument("file")
    m.add_argument("models", nargs="+", help='"shipped" or model directories')
    args = ap.parse_args()
    if args.cmd == "write":
        write(args.out, args.n, args.seed)
    else:
        measure(args.file, args.models)


if __name__ == "__main__":
    main()
