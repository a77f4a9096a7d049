"""A training file whose P positions are puzzle-like: the engine's best move is at least GAP
pawns better than its second (an "only move", as a Lichess puzzle's first move is).

    python experiments/strength_levers/only_moves.py OUT.jsonl.gz [--gap 1.0] [--others N]

Keeps every bundled P sample with two or more labelled moves whose best eval exceeds the
second's by GAP or more (7,110 of 40,000 at GAP 1.0, depth-8 labels), OTHERS of the rest
drawn at random (default: as many as the only-move positions) and every A sample,
shuffled; `python -m rookworld.train data.train=OUT.jsonl.gz` then draws from it.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
from pathlib import Path

from rookworld.config import pkg_data
from rookworld.data.loaders import read_lines
from rookworld.data.select import only_move


def bundled_rows(pick) -> tuple[list[str], list[str], list[str]]:
    """The bundled train split's lines: P rows for which pick(row) holds, the other P rows,
    the A rows."""
    chosen, others, env = [], [], []
    for line in read_lines(Path(pkg_data("train.jsonl.gz"))):
        row = json.loads(line)
        (env if row["task"] != "P" else chosen if pick(row) else others).append(line)
    return chosen, others, env


def write_mix(out: str, chosen: list[str], others: list[str], env: list[str], keep: int | None,
              rng: random.Random) -> int:
    """Writes chosen + `keep` of others drawn at random (None: as many as chosen) + env,
    shuffled, to out (.jsonl.gz, the same bytes from every run); returns the P rows kept."""
    others = others[:]
    rng.shuffle(others)
    keep = len(chosen) if keep is None else keep
    rows = chosen + others[:keep] + env
    rng.shuffle(rows)
    Path(out).write_bytes(gzip.compress("".join(r + "\n" for r in rows).encode(), mtime=0))
    return len(chosen) + min(keep, len(others))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--gap", type=float, default=1.0, help="pawns between best and second")
    ap.add_argument("--others", type=int, default=None,
                    help="other P samples to keep (default: as many as the only-move ones)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    only, others, env = bundled_rows(lambda row: only_move(row["truth"]["evals"], args.gap))
    p = write_mix(args.out, only, others, env, args.others, random.Random(args.seed))
    print(f"{args.out}: {p} P ({len(only) / max(p, 1):.1%} only-move at gap {args.gap:g}), "
          f"{len(env)} A")


if __name__ == "__main__":
    main()
