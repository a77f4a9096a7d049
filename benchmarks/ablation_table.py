"""One Markdown table of repeated `bench_grpo.py --ablate` runs, grouped by shape: per
variant, the median step and peak RSS over the runs with their range (run-to-run spread),
and each against the defaults (paired: the median of per-round ratios within a run, then
its range over runs).

    python benchmarks/ablation_table.py small-1.jsonl small-2.jsonl gpt2-1.jsonl ...
"""

from __future__ import annotations

import json
import statistics
import sys


def spread(values: list[float], fmt: str) -> str:
    mid = statistics.median(values)
    if len(values) == 1:
        return f"{mid:{fmt}}"
    return f"{mid:{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def shape_of(line: dict) -> str:
    """'12x768 2x8x64': layers x width, prompts x generations x tokens."""
    s = line["shape"]
    return (f"{s['n_layer']}x{s['n_embd']} "
            f"{line['prompts']}x{line['generations']}x{line['tokens']}")


def main(paths: list[str]) -> None:
    groups: dict[str, list[list[dict]]] = {}
    for p in paths:
        lines = [json.loads(x) for x in open(p) if '"impl"' in x]
        cal = json.loads(next(x for x in open(p) if "calibration_gflops" in x))
        c = cal["calibration_gflops"]
        print(f"{p}: {shape_of(lines[0])}, matmul GFLOP/s before/after {c['before']}/{c['after']}")
        groups.setdefault(shape_of(lines[0]), []).append(lines)
    print("\n| switched off | shape (layers x width, P x G x L), runs | step s "
          "| vs defaults (paired) | peak RSS MiB | RSS vs defaults |")
    print("|---|---|---|---|---|---|")
    for shape, runs in groups.items():
        for i, line in enumerate(runs[0]):
            same = [r[i] for r in runs]
            assert all(x["impl"] == line["impl"] for x in same), "runs of different variants"
            print(f"| {line['impl']} | {shape}, {len(runs)} "
                  f"| {spread([x['median_step_s'] for x in same], '.3f')} "
                  f"| {spread([x['step_vs_defaults_paired'] for x in same], '.3f')} "
                  f"| {spread([x['peak_rss_mb'] for x in same], ',.0f')} "
                  f"| {spread([x['rss_vs_defaults'] for x in same], '.3f')} |")


if __name__ == "__main__":
    main(sys.argv[1:])
