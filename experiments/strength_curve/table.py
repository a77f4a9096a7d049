"""Join a from-scratch pretraining curve (`pretrain strength=fast` writes curve.jsonl) and the
shipped model's evaluation at the same sizes into one curve file; plot the strength measures
against samples seen, print the table the model card shows.

    python experiments/strength_curve/table.py RUN/curve.jsonl SHIPPED.json \
        --out experiments/strength_curve
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rookworld.model_card import curve_table
from rookworld.strength.stats import wilson
from rookworld.strength.suite import MEANS as MEAN_MEASURES

SHIPPED = Path(__file__).resolve().parents[2] / "rookworld" / "assets" / "model"
# (key, label) of the shares plotted with Wilson intervals, and of the means
SHARES = (("eval/P/best_legal", "P best move legal (greedy, held-out)"),
          ("eval/strength/puzzles_first", "puzzles: first move solved"),
          ("eval/strength/puzzles_illegal", "puzzles: first answer illegal"),
          ("eval/strength/acpl_illegal", "held-out positions: B: move illegal"))
MEANS = (("eval/strength/selfplay_plies", "self-play: legal half-moves (mean)"),)


def shipped_row(evaluation: Path, lineage: Path) -> dict:
    """The shipped model as a curve row: its held-out and strength metrics
    (`evaluate suite=all out=F`), at the samples and minutes of its whole lineage."""
    data = json.loads(evaluation.read_text())
    stages = json.loads(lineage.read_text())["stages"]
    return {"stage": "shipped", "step": "-", "samples": sum(s["samples"] for s in stages),
            "train_minutes": sum(s["minutes"] for s in stages),
            **data["held_out"], **data["strength"]}


def _interval(row: dict, key: str) -> tuple[float, float, float]:
    """(value, lower, upper): Wilson for a strength share, 1.96 standard errors otherwise."""
    value = row[key]
    n = row.get(key.replace("eval/", "eval_n/", 1))
    if key.startswith("eval/strength/") and key.rsplit("/", 1)[1] not in MEAN_MEASURES and n:
        lo, hi = wilson(value * n, n)
        return value, lo, hi
    half = 1.96 * row.get(key.replace("eval/", "eval_se/", 1), 0.0)
    return value, value - half, value + half


def plot(rows: list[dict], lineage: list[dict], out: Path) -> None:
    """Left: shares (and, dashed, the shipped lineage's greedy P best move legal over all
    its stages); right: self-play length."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5), dpi=100)
    left.plot([r["samples"] for r in lineage], [r["eval/P/best_legal"] for r in lineage],
              color="grey", linestyle="--", marker=".", linewidth=1,
              label="shipped lineage: P best move legal (greedy)")
    for ax, series in ((left, SHARES), (right, MEANS)):
        for key, label in series:
            pts = [(r["samples"], *_interval(r, key)) for r in rows if key in r]
            if not pts:
                continue
            x, y, lo, hi = zip(*pts)
            ax.errorbar(x, y, yerr=[[a - b for a, b in zip(y, lo)],
                                    [b - a for a, b in zip(y, hi)]],
                        marker="o", ms=3, capsize=2, label=label)
        ax.set_xscale("log")
        ax.set_xlabel("training samples seen (log)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    left.set_ylabel("share")
    left.set_ylim(-0.02, 1.02)
    right.set_ylabel("half-moves")
    fig.suptitle("embedded model: strength against pretraining compute "
                 "(from scratch, then the shipped model)")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("curve", type=Path, help="the from-scratch run's curve.jsonl")
    ap.add_argument("shipped", type=Path, help="`evaluate suite=all strength=fast out=F`")
    ap.add_argument("--lineage", type=Path, default=SHIPPED / "training.json",
                    help="the shipped model's training.json (its stages' samples)")
    ap.add_argument("--out", type=Path, required=True,
                    help="writes curve.jsonl (the joined rows) and curve.png here")
    args = ap.parse_args()
    rows = [json.loads(line) | {"stage": "scratch"}
            for line in args.curve.read_text().splitlines() if line.strip()]
    rows.append(shipped_row(args.shipped, args.lineage))
    args.out.mkdir(parents=True, exist_ok=True)
    keep = ("stage", "step", "samples", "train_minutes")
    slim = [{k: v for k, v in r.items() if k in keep or k.startswith(("eval/", "eval_se/",
                                                                       "eval_n/"))}
            for r in rows]
    (args.out / "curve.jsonl").write_text("".join(json.dumps(r) + "\n" for r in slim))
    plot(slim, json.loads(args.lineage.read_text())["curve"], args.out / "curve.png")
    print(curve_table(slim))


if __name__ == "__main__":
    main()
