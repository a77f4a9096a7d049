"""Greedy held-out metrics of a model: `python -m rookworld.evaluate [model=...]`.

Reproduces the figures of the embedded model's card (greedy decoding is
deterministic), and measures any other model (`model=rookworld_lm_124m
model.path=...`, or a run's checkpoint: `model.path=<run>/checkpoints/step-N/model`)
on the same splits and on the external ROOK set. `out=` also keeps each sample's
values, so that a later `against=<that file>` prints the change between the two models
with paired intervals (both scored the same samples).
"""

from __future__ import annotations

import json
from pathlib import Path

import hydra
from omegaconf import DictConfig

from . import runtime
from .config import WHITELIST, instantiate
from .data.load import read_samples
from .files import atomic_write_text
from .held_out import Evaluator, before_after_table, paired_se
from .strength import common_changes


def measure(policy, cfg, held_out, per_sample: dict | None = None) -> dict:
    """{"held_out": metrics, "external": metrics (when cfg.data.external_eval exists)};
    per_sample, when given, is filled likewise with each metric's per-sample values."""
    settings = instantiate(cfg.sampler)
    reward = instantiate(cfg.reward)
    try:  # closing ends reward=engine's Stockfish processes
        values = {} if per_sample is None else per_sample
        values["held_out"] = {}
        results = {"held_out": Evaluator(held_out, settings,
                                         max_per_task=cfg.data.eval_per_task)(
            policy, reward, per_sample=values["held_out"])[0]}
        ext_path = cfg.data.get("external_eval")
        if ext_path and Path(ext_path).exists():
            ext = read_samples(ext_path, on_defect="relabel")
            values["external"] = {}
            results["external"] = Evaluator(ext, settings)(policy, reward,
                                                           per_sample=values["external"])[0]
        elif ext_path:
            print(f"[rookworld] data.external_eval={ext_path}: no such file; the external "
                  "ROOK set is skipped (point data.external_eval or ROOKWORLD_EXTERNAL_EVAL at "
                  "a copy, or set it to null)", flush=True)
        return results
    finally:
        reward.close()


def measure_strength(policy, cfg, held_out, per_sample: dict) -> dict:
    """The playing-strength suite (`rookworld.strength`) at cfg.strength's sizes; its
    report and PGN files go to cfg.strength_dir, its markdown is printed."""
    from .strength import StrengthSuite, settings_from

    settings = settings_from(cfg.strength)
    fens = [s.truth.fen for s in held_out if s.task == "P"]
    with StrengthSuite(settings, fens, cfg.strength_dir) as suite:
        metrics, values, text = suite(policy, instantiate(cfg.sampler)["P"],
                                      label=model_label(cfg))
    per_sample["strength"] = values
    print(text + f"\n\n[rookworld] strength report and games (PGN) in "
          f"{Path(cfg.strength_dir) / model_label(cfg)}", flush=True)
    return metrics


def model_label(cfg) -> str:
    """A file-name-safe name for the evaluated model: its path's last parts, or its option."""
    path = cfg.model.get("path")
    name = "-".join(Path(str(path)).parts[-2:]) if path else cfg.model.get("_target_", "model")
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in str(name))[-80:]


SUITES = ("held_out", "strength", "all")


@hydra.main(config_path="../conf", config_name="evaluate", execution_whitelist=WHITELIST)
def main(cfg: DictConfig) -> None:
    if cfg.suite not in SUITES:
        raise SystemExit(f"rookworld: suite must be one of {' | '.join(SUITES)}, "
                         f"got {cfg.suite!r}")
    runtime.setup()  # the process-wide choices, before the model
    earlier = json.loads(Path(cfg.against).read_text()) if cfg.against else None
    if cfg.out:  # made before the measurements, so a path that cannot be written fails first
        try:
            Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise SystemExit(f"rookworld: out={cfg.out}: cannot make its folder ({e})") from None
    per_sample = {}
    policy, held_out = instantiate(cfg.model), read_samples(cfg.data.eval)
    results = measure(policy, cfg, held_out, per_sample) if cfg.suite != "strength" else {}
    if cfg.suite != "held_out":
        results["strength"] = measure_strength(policy, cfg, held_out, per_sample)
    print(json.dumps(results, indent=2))
    for split in results if earlier else ():
        before = earlier.get(split)
        if before is None:
            continue
        values = earlier.get("per_sample", {}).get(split, {})
        after = results[split] | paired_se(values, per_sample[split]) \
            | common_changes(values, per_sample[split])
        print(f"\n{split}: {cfg.against} (before) against this model (after)\n\n"
              + before_after_table(before, after))
    if cfg.out:
        atomic_write_text(Path(cfg.out), json.dumps(results | {"per_sample": per_sample}) + "\n")


if __name__ == "__main__":
    import sys

    from .config import check_argv
    check_argv(sys.argv[1:])
    main()
