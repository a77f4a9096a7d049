"""Curves of overfit-one-batch runs: python experiments/overfit_one_batch/plot.py RUN_DIR...

Writes curve.png next to this file: the greedy reward on the fixed batch
(train_batch/reward) and the mean reward of the sampled completions, per step.
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(runs: list[str]) -> None:
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for run in map(Path, runs):
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]
        rows = [r for r in rows if "train_batch/reward" in r]
        steps = [r["step"] for r in rows]
        a.plot(steps, [r["train_batch/reward"] for r in rows], label=run.name)
        b.plot(steps, [r["reward/mean"] for r in rows], label=run.name, alpha=0.8)
    a.set(title="greedy reward on the fixed batch", xlabel="step", ylabel="train_batch/reward")
    b.set(title="mean reward of sampled completions", xlabel="step", ylabel="reward/mean")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(__file__).with_name("curve.png")
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main(sys.argv[1:])
