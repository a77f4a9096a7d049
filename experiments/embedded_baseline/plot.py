"""Curves and table of the embedded-baseline runs:

    python experiments/embedded_baseline/plot.py RUN_DIR...

Writes curve.png next to this file (training reward per step; held-out greedy P
best-legal and A format per evaluation, with ~95% intervals; one colour per run) and
prints a Markdown table: each run's before/after of the headline metrics with intervals.
"""

import json
import math
import sys
from pathlib import Path

import matplotlib

from rookworld.held_out import interval

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

KEYS = ("eval/P/best_legal", "eval/P/legal", "eval/P/format", "eval/P/reward",
        "eval/A/format", "eval/A/fen_exact", "eval/A/fen_similarity", "eval/A/reward")


def rows(run: Path) -> list[dict]:
    out = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a torn last line
            pass
    return out


def ci(row: dict, key: str) -> float:
    """Half-width of the ~95% interval of row[key] (0 when no error was logged)."""
    return interval(row, key) or 0.0


def table(runs: list[Path]) -> str:
    lines = ["| metric | before | " + " | ".join(f"after, {r.name}" for r in runs)
             + " | mean change |", "|---|---|" + "---|" * len(runs) + "---|"]
    evals = {r: [x for x in rows(r) if "eval/reward" in x] for r in runs}
    for k in KEYS:
        first = evals[runs[0]][0]
        if k not in first:
            continue
        cells, changes = [], []
        for r in runs:
            a, b = evals[r][0], evals[r][-1]
            d, half = b[k] - a[k], math.hypot(ci(a, k), ci(b, k))
            changes.append(d)
            cells.append(f"{b[k]:.3f} ± {ci(b, k):.3f} ({d:+.3f} ± {half:.3f})")
        lines.append(f"| {k} | {first[k]:.3f} ± {ci(first, k):.3f} | " + " | ".join(cells)
                     + f" | {sum(changes) / len(changes):+.3f} |")
    return "\n".join(lines)


def main(runs: list[str]) -> None:
    runs = [Path(r) for r in runs]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for i, run in enumerate(runs):
        data = rows(run)
        train = [r for r in data if "reward/mean" in r]
        ev = [r for r in data if "eval/reward" in r]
        axes[0].plot([r["step"] for r in train], [r["reward/mean"] for r in train],
                     label=run.name, alpha=0.8, color=f"C{i}")
        for ax, key in ((axes[1], "eval/P/best_legal"), (axes[2], "eval/A/format")):
            ax.errorbar([r["step"] + 1 for r in ev], [r[key] for r in ev],
                        yerr=[ci(r, key) for r in ev], marker="o", capsize=3,
                        label=run.name, color=f"C{i}")
    axes[0].set(title="training reward (mean over the step's rollouts)", xlabel="step",
                ylabel="the run's reward")
    axes[1].set(title="held-out greedy P best move legal (±95%)", xlabel="steps trained",
                ylabel="share")
    axes[2].set(title="held-out greedy A format (±95%)", xlabel="steps trained", ylabel="share")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(__file__).with_name("curve.png")
    fig.savefig(out, dpi=100)
    print(table(runs))
    print(out)


if __name__ == "__main__":
    main(sys.argv[1:])
