"""Markdown table of repeated `bench_grpo.py --ablate` runs: per variant, the median step
and peak RSS over the runs with their range (run-to-run spread), and each against the
defaults (paired: the median of per-round ratios within a run, then its range over runs).

    python benchmarks/ablation_table.py run1.jsonl run2.jsonl run3.jsonl
"""

from __future__ import annotations

import json
import statistics
import sys


def spread(values: list[float], fmt: str) -> str:
    mid = statistics.median(values)
    return f"{mid:{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def main(paths: list[str]) -> None:
    runs = [[json.loads(x) for x in open(p) if '"impl"' in x] for p in paths]
    cals = [json.loads(next(x for x in open(p) if "calibration_gflops" in x))
            ["calibration_gflops"] for p in paths]
    print(f"{len(runs)} runs; matmul GFLOP/s before/after: "
          + ", ".join(f"{c['before']}/{c['after']}" for c in cals))
    print("\n| variant | step s | vs defaults (paired) | peak RSS MB | RSS vs defaults |")
    print("|---|---|---|---|---|")
    for i, line in enumerate(runs[0]):
        same = [r[i] for r in runs]
        print(f"| {line['impl']} | {spread([x['median_step_s'] for x in same], '.3f')} "
              f"| {spread([x['step_vs_defaults_paired'] for x in same], '.3f')} "
              f"| {spread([x['peak_rss_mb'] for x in same], '.0f')} "
              f"| {spread([x['rss_vs_defaults'] for x in same], '.3f')} |")


if __name__ == "__main__":
    main(sys.argv[1:])
