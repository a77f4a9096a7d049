"""Training and evaluation samples for a run, validated and reported."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

from .checkpoint import atomic_write_text
from .chess_tasks import Sample
from .config import ConfigError


def read_samples(path: str) -> list[Sample]:
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"data file {path} does not exist")
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rt") as f:
        return [Sample.from_json(json.loads(line)) for line in f if line.strip()]


def load_data(cfg, parts, run_dir: Path) -> tuple[dict[str, list[Sample]], list[Sample]]:
    train, held_out = read_samples(cfg.data.train), read_samples(cfg.data.eval)
    pools = {t: [s for s in train if s.task == t] for t in ("P", "A")}
    needed = set()
    for step in range(cfg.steps):
        needed |= set(parts.task_mix.tasks(step))
    empty = [t for t in needed if not pools[t]]
    if empty:
        raise ConfigError(f"task_mix needs task(s) {empty} but data.train has no such samples")
    report = {"train": dict(Counter(s.task for s in train)),
              "eval": dict(Counter(s.task for s in held_out))}
    if hasattr(parts.task_mix, "schedule"):
        report["schedule"] = parts.task_mix.schedule(cfg.steps)
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / "data_report.json", json.dumps(report, indent=2))
    return pools, held_out
