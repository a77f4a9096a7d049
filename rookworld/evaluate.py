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
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from . import runtime
from .config import WHITELIST, check_ints, check_model_path, check_targets, instantiate
from .data.load import read_samples
from .errors import ConfigError
from .files import atomic_write_text
from .held_out import Evaluator, before_after_table, paired_se
from .strength import common_changes, settings_from


def measure(policy, cfg, held_out, per_sample: dict | None = None, reward=None) -> dict:
    """{"held_out": metrics, "external": metrics (when cfg.data.external_eval exists)};
    per_sample, when given, is filled likewise with each metric's per-sample values.
    reward: one the caller built (and closes); None: cfg.reward's, built and closed here."""
    settings = instantiate(cfg.sampler)
    owned = reward is None
    reward = instantiate(cfg.reward) if owned else reward
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
        if owned:
            reward.close()


def strength_suite(cfg, held_out):
    """The playing-strength suite (`rookworld.strength`) at cfg.strength's sizes over the
    held-out P positions, its puzzles and openings read (its engines start at first use);
    ConfigError ('strength: ...') for a bad value or a file it cannot read."""
    from .strength import StrengthSuite
    from .strength.puzzles import PuzzleFileError

    settings = settings_from(cfg.strength)  # ConfigError for a bad value
    try:
        return StrengthSuite(settings, [s.truth.fen for s in held_out if s.task == "P"],
                             cfg.strength_dir)
    except (PuzzleFileError, ValueError, OSError) as e:
        raise ConfigError(f"strength: {e}") from None


def measure_strength(policy, cfg, suite, per_sample: dict) -> dict:
    """The suite's measures of the policy; its report and PGN files go to
    cfg.strength_dir, its markdown is printed."""
    with suite:
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


def check_settings(cfg: DictConfig) -> None:
    """ConfigError naming the key for a setting evaluate cannot run with, before the data
    and the model load: the suite, data.eval_per_task, the model path, the sampler's and
    the strength group's values (the reward's are checked as it is built, also before the
    model)."""
    if cfg.suite not in SUITES:
        raise ConfigError(f"suite must be one of {' | '.join(SUITES)}, got {cfg.suite!r}")
    check_targets(cfg)
    check_ints(cfg, {"data.eval_per_task": (0, "an integer >= 0 (0 = all)")})
    check_model_path(cfg.model.get("path"))
    try:
        instantiate(cfg.sampler)
    except ValueError as e:  # ConfigError is a ValueError
        raise ConfigError(str(e)) from None
    if cfg.suite != "held_out":
        settings_from(cfg.strength)


def read_against(path: str) -> dict:
    """An earlier `out` file, for `against=`; ConfigError when it cannot be read."""
    try:
        earlier = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:  # missing, unreadable, or not JSON
        raise ConfigError(f"against={path}: cannot read it as an earlier out= file ({e})"
                          ) from None
    if not isinstance(earlier, dict):
        raise ConfigError(f"against={path}: not an out= file of python -m rookworld.evaluate "
                          "(a JSON object of metrics)")
    return earlier


@hydra.main(config_path="../conf", config_name="evaluate", execution_whitelist=WHITELIST)
def main(cfg: DictConfig) -> None:
    try:
        run(cfg)
    except ConfigError as e:  # a bad setting or input: one line naming it, exit 1, as train
        sys.exit(f"rookworld: {e}")


def run(cfg: DictConfig) -> None:
    """Measure cfg.model as cfg says and print (and with `out=`, write) the metrics;
    ConfigError for a bad setting or input, before the model loads where it can be told."""
    check_settings(cfg)
    earlier = read_against(cfg.against) if cfg.against else None
    runtime.setup()  # the process-wide choices, before the model
    if cfg.out:  # made before the measurements, so a path that cannot be written fails first
        try:
            Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"out={cfg.out}: cannot make its folder ({e})") from None
    held_out = read_samples(cfg.data.eval)
    suite = strength_suite(cfg, held_out) if cfg.suite != "held_out" else None
    reward = None
    try:  # closing ends the reward's and the suite's Stockfish processes
        if cfg.suite != "strength":  # built before the model: a bad reward setting fails first
            try:
                reward = instantiate(cfg.reward)
            except (ValueError, FileNotFoundError) as e:
                raise ConfigError(str(e)) from None
        per_sample = {}
        policy = instantiate(cfg.model)
        results = {} if reward is None else measure(policy, cfg, held_out, per_sample,
                                                    reward)
        if suite is not None:
            results["strength"] = measure_strength(policy, cfg, suite, per_sample)
    finally:
        for held in (reward, suite):
            if held is not None:
                held.close()
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
    from .config import check_argv
    check_argv(sys.argv[1:])
    main()
