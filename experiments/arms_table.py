"""Each arm's change (final - start) per seed on the held-out and fast strength measures,
from the runs' own before/after evaluations (outcome.json), with each run's paired ~95%
interval (1.96 x eval_dse; for a measure without a paired standard error, as the centipawn
loss over each model's own legal answers, 1.96 x the two evaluations' standard errors
added in quadrature, as the run's own table prints; for a change metric, as the centipawn
loss on the positions both models answered legally, its own value and interval), then the
arm's mean over its seeds with a 95% t interval over the seeds (run-to-run spread).

    python experiments/arms_table.py outputs/games_study positions games
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

from paired_table import seed_interval

from rookworld.held_out import is_change

MEASURES = ("P/best_legal", "P/legal", "P/best", "P/top5", "P/eval_error", "A/fen_exact",
            "strength/puzzles_first", "strength/puzzles_illegal", "strength/random_score",
            "strength/selfplay_plies", "strength/selfplay_plies_median", "strength/acpl",
            "strength/acpl_both_legal_change")


def change(run: Path, measure: str) -> tuple[float, float | None] | None:
    """(final - start, paired half-width) of one run's measure (a change metric: its own
    value and half-width); None when it lacks it."""
    out = json.loads((run / "outcome.json").read_text())
    first, last = out["initial_eval"], out["final_eval"]
    key = f"eval/{measure}"
    if is_change(key):  # a change already, with its own standard error
        if key not in last:
            return None
        se = last.get(f"eval_se/{measure}")
        return last[key], None if se is None else 1.96 * se
    if key not in first or key not in last:
        return None
    dse = last.get(f"eval_dse/{measure}")
    if dse is None and f"eval_se/{measure}" in first and f"eval_se/{measure}" in last:
        dse = (first[f"eval_se/{measure}"] ** 2 + last[f"eval_se/{measure}"] ** 2) ** 0.5
    return last[key] - first[key], None if dse is None else 1.96 * dse


def cell(c: tuple[float, float | None] | None) -> str:
    if c is None:
        return "-"
    return f"{c[0]:+.3f}" + ("" if c[1] is None else f" ± {c[1]:.3f}")


def main(study: Path, arms: list[str]) -> None:
    runs = {arm: sorted(p.parent for p in (study / arm).glob("seed*/outcome.json")
                        if re.fullmatch(r"seed\d+", p.parent.name))  # not a set-aside run
            for arm in arms}
    header = ["measure"] + [f"{arm} {r.name}" for arm in arms for r in runs[arm]] \
        + [f"{arm} mean" for arm in arms]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for m in MEASURES:
        per_run = {arm: [change(r, m) for r in runs[arm]] for arm in arms}
        cells = [cell(c) for arm in arms for c in per_run[arm]]
        for arm in arms:
            values = [c[0] for c in per_run[arm] if c is not None]
            half = seed_interval(values)
            cells.append("-" if not values else f"{statistics.mean(values):+.3f}"
                         + ("" if half is None else f" ± {half:.3f}"))
        print(f"| {m} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
