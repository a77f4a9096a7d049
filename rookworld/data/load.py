"""Training and evaluation samples for a run, validated and reported."""

from __future__ import annotations

import json
from pathlib import Path

from ..chess_tasks import Sample
from ..config import ConfigError
from ..files import atomic_write_text, is_hub_id
from .loaders import load_samples
from .splits import position_key


def read_samples(source: str, on_defect: str = "drop", report: dict | None = None) -> list[Sample]:
    """Load and validate a split (JSON lines, RookWorld text, HF dataset); defects are
    counted, printed when present, and stored in `report[source]`."""
    s = str(source)
    if not is_hub_id(s) and not Path(s).expanduser().exists():
        raise ConfigError(f"data source {source} does not exist")
    try:
        res = load_samples(str(source), on_defect=on_defect)
    except ValueError as e:
        raise ConfigError(f"data source {source}: {e}") from e
    if res.report.counts:
        print(res.report.summary(), flush=True)
    if report is not None:
        report[str(source)] = res.report.as_dict()
    return res.samples


def load_data(cfg, parts, run_dir: Path) -> tuple[dict[str, list[Sample]], list[Sample]]:
    report: dict = {}
    splits = []
    for key in ("train", "eval"):
        try:
            splits.append(read_samples(cfg.data[key], cfg.data.on_defect, report))
        except ConfigError as e:  # name the setting, not only the path
            raise ConfigError(f"data.{key}={cfg.data[key]}: {e}") from e
    train, held_out = splits
    pools = {t: [s for s in train if s.task == t] for t in ("P", "A")}
    needed = {"task_mix": set()}
    for step in range(cfg.steps):
        needed["task_mix"] |= set(parts.task_mix.tasks(step))
    if parts.anchor.active:
        needed["anchor.tasks"] = set(parts.anchor.tasks)
    for who, tasks in needed.items():
        empty = sorted(t for t in tasks if not pools[t])
        if empty:
            raise ConfigError(f"{who} needs task(s) {empty} but data.train has no such samples")
    # positions (the FEN without move counters, as the splits are cut), not whole FENs
    overlap = {position_key(s.truth.fen) for s in train} & \
        {position_key(s.truth.fen) for s in held_out}
    summary = {"train": {t: len(v) for t, v in pools.items()},
               "eval": {t: sum(s.task == t for s in held_out) for t in ("P", "A")},
               "positions_in_both_splits": len(overlap), "sources": report}
    if hasattr(parts.task_mix, "schedule"):
        summary["schedule"] = parts.task_mix.schedule(cfg.steps)
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / "data_report.json", json.dumps(summary, indent=2))
    return pools, held_out
