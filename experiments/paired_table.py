"""Before/after table over arms of seeded runs, from `python -m rookworld.evaluate` files.

    python experiments/paired_table.py START.json LABEL=RUN.json,RUN.json,... [LABEL=...]
        [--metrics held_out:eval/P/best_legal,...] [--failed LABEL=N ...]

START.json: the starting model evaluated with `out=`; each RUN.json: a run's final model
evaluated with `out=` on the same samples (a file named final_eval.json is named by its run
directory) (`against=START.json` is not needed here). Per
run: the change of each metric with its paired ~95% interval (1.96 standard errors of the
mean per-sample difference). Per arm: the mean change over its seeds with a t interval
over the seeds (run-to-run spread, 95%), and the runs that failed (`--failed`).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

from rookworld.held_out import mean_se

T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571}  # t quantile 0.975 by dof
DEFAULT_METRICS = ("held_out:eval/P/best_legal", "held_out:eval/P/legal",
                   "held_out:eval/A/format", "held_out:eval/A/fen_exact",
                   "external:eval/P/best_legal")


def paired_change(start: dict, end: dict, split: str, key: str) -> tuple[float, float]:
    """(mean change, half-width of its paired ~95% interval) over the same samples: the
    standard error of the per-sample differences, as `held_out.paired_se` computes it."""
    a, b = start["per_sample"][split][key], end["per_sample"][split][key]
    mean, se = mean_se([y - x for x, y in zip(a, b)])
    return mean, 1.96 * se


def seed_interval(values: list[float]) -> float | None:
    """Half-width of the 95% t interval of the mean over seeds (None for one seed)."""
    if len(values) < 2:
        return None
    return T95.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("start")
    ap.add_argument("arms", nargs="+", help="LABEL=RUN.json,RUN.json,...")
    ap.add_argument("--metrics", default=",".join(DEFAULT_METRICS))
    ap.add_argument("--failed", nargs="*", default=[], help="LABEL=N runs that failed")
    args = ap.parse_args(argv)
    start = json.loads(open(args.start).read())
    metrics = [m.split(":", 1) for m in args.metrics.split(",")]
    failed = dict(f.split("=") for f in args.failed)
    names = [k.removeprefix("eval/") + ("" if s == "held_out" else f" ({s})") for s, k in metrics]
    print("| arm | run | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(metrics))
    print("| start | - | " + " | ".join(f"{start[s][k]:.3f}" for s, k in metrics) + " |")
    for arm in args.arms:
        label, files = arm.split("=", 1)
        runs = [json.loads(open(f).read()) for f in files.split(",")]
        changes = [[paired_change(start, r, s, k) for s, k in metrics] for r in runs]
        for f, row in zip(files.split(","), changes):
            name = Path(f).stem if Path(f).stem != "final_eval" else Path(f).parent.name
            print(f"| {label} | {name} | "
                  + " | ".join(f"{m:+.3f} ± {h:.3f}" for m, h in row) + " |")
        means = []
        for j in range(len(metrics)):
            v = [row[j][0] for row in changes]
            half = seed_interval(v)
            means.append(f"**{statistics.mean(v):+.3f}**"
                         + ("" if half is None else f" ± {half:.3f}"))
        n_failed = int(failed.get(label, 0))
        print(f"| {label} | mean of {len(runs)}"
              + (f", {n_failed} of {len(runs) + n_failed} failed" if n_failed else "")
              + " | " + " | ".join(means) + " |")


if __name__ == "__main__":
    main()
