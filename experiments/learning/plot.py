"""Held-out curves against training minutes for the learning study's arms:

    python experiments/learning/plot.py --grpo RUN_DIR... --sft OUT_DIR... --trl OUT_DIR...

GRPO runs (--grpo) are `python -m rookworld.train` run directories (metrics.jsonl: training
minutes are the summed step times, evaluations excluded); SFT and TRL directories hold a
curve.jsonl (rookworld.pretrain's curve, trl_arm.py's) whose rows carry `train_minutes`.
Writes curve.png next to this file and prints a Markdown table: per arm and seed, the
headline metric at the start and at the end with ~95% intervals, and the gain per
training minute.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import matplotlib

from rookworld.held_out import interval

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

KEY = "eval/P/best_legal"


def _lines(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a torn last line
            pass
    return out


def grpo_points(run: Path) -> list[dict]:
    """Evaluation rows of a rookworld.train run with `train_minutes` added."""
    minutes, points = 0.0, []
    for r in _lines(run / "metrics.jsonl"):
        if "time/step_s" in r:
            minutes += r["time/step_s"] / 60
        if "eval/reward" in r:
            points.append({**r, "train_minutes": minutes})
    return points


def curve_points(out: Path, start: dict | None) -> list[dict]:
    """curve.jsonl rows, preceded by the shared starting evaluation when the curve has none."""
    rows = _lines(out / "curve.jsonl")
    if start is not None and (not rows or rows[0]["train_minutes"] > 0):
        rows = [{**start, "train_minutes": 0.0}, *rows]
    return rows


def ci(row: dict, key: str = KEY) -> float:
    """Half-width of the ~95% interval of row[key] (0 when no error was logged)."""
    return interval(row, key) or 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grpo", nargs="*", default=[])
    ap.add_argument("--sft", nargs="*", default=[])
    ap.add_argument("--trl", nargs="*", default=[])
    ap.add_argument("--key", default=KEY)
    a = ap.parse_args()
    arms = {"rookworld GRPO": [grpo_points(Path(r)) for r in a.grpo]}
    start = arms["rookworld GRPO"][0][0] if a.grpo else None
    arms["continued SFT"] = [curve_points(Path(r), start) for r in a.sft]
    arms["TRL GRPOTrainer"] = [curve_points(Path(r), start) for r in a.trl]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    lines = [f"| arm | seed | {a.key} at start | at end | change | training min | "
             "change per min |", "|---|---|---|---|---|---|---|"]
    for i, (arm, runs) in enumerate(arms.items()):
        for seed, pts in enumerate(runs):
            if not pts:
                continue
            ax.errorbar([p["train_minutes"] for p in pts], [p[a.key] for p in pts],
                        yerr=[ci(p, a.key) for p in pts], color=f"C{i}", marker="o", ms=3,
                        capsize=2, alpha=0.8, label=arm if seed == 0 else None)
            first, last = pts[0], pts[-1]
            d = last[a.key] - first[a.key]
            half = math.hypot(ci(first, a.key), ci(last, a.key))
            minutes = last["train_minutes"]
            lines.append(f"| {arm} | {seed} | {first[a.key]:.3f} ± {ci(first, a.key):.3f} | "
                         f"{last[a.key]:.3f} ± {ci(last, a.key):.3f} | {d:+.3f} ± {half:.3f} | "
                         f"{minutes:.1f} | {d / minutes if minutes else 0:+.4f} |")
    ax.set(xlabel="training minutes (evaluations excluded)", ylabel=f"held-out greedy {a.key}",
           title="learning per CPU-minute: rookworld GRPO, continued SFT, TRL")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out = Path(__file__).with_name("curve.png")
    fig.savefig(out, dpi=100)
    print("\n".join(lines))
    print(out)


if __name__ == "__main__":
    main()
