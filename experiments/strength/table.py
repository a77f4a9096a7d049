"""The strength study's table: every measure of the shipped model and of each seed's final
model, with each seed's change, read from the suite's strength.json files
(experiments/strength/run.sh writes them under <study>/suite/<model>/).

    python experiments/strength/table.py outputs/strength_study

Levels: shares (scores: draws count half) with Wilson ~95% intervals, means (centipawns,
half-moves) with normal ones. Changes: the paired interval of the per-item differences
where both evaluations scored the same items, else that of two independent means.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

from rookworld.strength import stats
from rookworld.strength.suite import MEANS, UNPAIRED, per_item_values


def read(study: Path, name: str) -> dict[str, dict[str, list[float]]] | None:
    """{mode: {measure: per-item values}} of one model's strength.json, or None."""
    found = sorted((study / "suite" / name).glob("*/strength.json"))
    if not found:
        return None
    report = json.loads(found[0].read_text())
    return {mode: per_item_values(part) for mode, part in report.items()}


def level(name: str, values: list[float]) -> str:
    if not values:
        return "-"
    n, m = len(values), sum(values) / len(values)
    if name in MEANS:
        half = stats.mean_interval(values)[1]
        return f"{m:.1f} ± {half:.1f}" if not math.isnan(half) else f"{m:.1f}"
    lo, hi = stats.wilson(sum(values), n)
    return f"{m:.3f} [{lo:.3f}, {hi:.3f}]"


def change(name: str, before: list[float], after: list[float]) -> str:
    if not before or not after:
        return "-"
    d = sum(after) / len(after) - sum(before) / len(before)
    spec = ".1f" if name in MEANS else ".3f"
    if name not in UNPAIRED and len(before) == len(after) and len(after) > 1:
        half = stats.Z * statistics.stdev([b - a for a, b in zip(before, after)]) \
            / math.sqrt(len(after))
        return f"{d:+{spec}} ± {half:{spec}} (paired)"
    ha, hb = stats.mean_interval(before)[1], stats.mean_interval(after)[1]
    half = math.hypot(0 if math.isnan(ha) else ha, 0 if math.isnan(hb) else hb)
    return f"{d:+{spec}} ± {half:{spec}}"


def table(study: Path, seeds: tuple[int, ...] = (0, 1, 2)) -> str:
    base = read(study, "shipped")
    runs = {s: r for s in seeds if (r := read(study, f"seed{s}")) is not None}
    head = ["mode", "measure", "shipped"] + [f"seed {s} | change" for s in runs]
    rows = ["| " + " | ".join(head) + " |", "|---" * (3 + 2 * len(runs)) + "|"]
    for mode, measures in base.items():
        for name, before in measures.items():
            cells = [mode, name, level(name, before)]
            for run in runs.values():
                after = run.get(mode, {}).get(name, [])
                cells += [level(name, after), change(name, before, after)]
            rows.append("| " + " | ".join(cells) + " |")
        median = [mode, "selfplay_plies, median (bootstrap ~95%)",
                  _median(measures.get("selfplay_plies", []))]
        for run in runs.values():
            median += [_median(run.get(mode, {}).get("selfplay_plies", [])), "-"]
        rows.append("| " + " | ".join(median) + " |")
    return "\n".join(rows)


def _median(values: list[float]) -> str:
    if not values:
        return "-"
    med, lo, hi = stats.median_interval(values)
    return f"{med:g} [{lo:g}, {hi:g}]"


if __name__ == "__main__":
    print(table(Path(sys.argv[1] if len(sys.argv) > 1 else "outputs/strength_study")))
