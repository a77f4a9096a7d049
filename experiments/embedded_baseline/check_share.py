"""A training file whose P positions are in check more often than the bundled ones (8.8%).

    python experiments/embedded_baseline/check_share.py OUT.jsonl.gz [--others 8200] [--seed 0]

Keeps every P sample whose side to move is in check (3,518 of the bundled 40,000), OTHERS
of the rest drawn at random, and every A sample, shuffled; `python -m rookworld.train
data.train=OUT.jsonl.gz` then draws its P prompts from it (8,200 others: 30% in check).
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
from pathlib import Path

import chess

from rookworld.config import pkg_data
from rookworld.data.loaders import read_lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--others", type=int, default=8200, help="P samples not in check to keep")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    check, others, env = [], [], []
    for line in read_lines(Path(pkg_data("train.jsonl.gz"))):
        row = json.loads(line)
        if row["task"] != "P":
            env.append(line)
        elif chess.Board(row["truth"]["fen"]).is_check():
            check.append(line)
        else:
            others.append(line)
    rng.shuffle(others)
    rows = check + others[:args.others] + env
    rng.shuffle(rows)
    with gzip.open(args.out, "wt") as f:
        f.writelines(r + "\n" for r in rows)
    p = len(check) + min(args.others, len(others))
    print(f"{args.out}: {p} P ({len(check) / p:.1%} in check), {len(env)} A")


if __name__ == "__main__":
    main()
