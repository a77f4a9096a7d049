"""Curves of the embedded-baseline runs: python experiments/embedded_baseline/plot.py RUN_DIR...

Writes curve.png next to this file: training reward (per step) and held-out greedy
eval reward (per evaluation) of each run, one colour per seed.
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


def main(runs: list[str]) -> None:
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for i, run in enumerate(map(Path, runs)):
        data = rows(run)
        train = [r for r in data if "reward/mean" in r]
        ev = [r for r in data if "eval/reward" in r]
        a.plot([r["step"] for r in train], [r["reward/mean"] for r in train],
               label=f"run {i} ({run.name})", alpha=0.8)
        b.plot([r["step"] + 1 for r in ev], [r["eval/reward"] for r in ev], marker="o",
               label=f"run {i}")
    a.set(title="training reward (mean over the step's rollouts)", xlabel="step",
          ylabel="graduated reward")
    b.set(title="held-out greedy eval reward", xlabel="steps trained", ylabel="graduated reward")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(__file__).with_name("curve.png")
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main(sys.argv[1:])
