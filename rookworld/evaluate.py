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
import os
import sys
import tempfile
from pathlib import Path

import hydra
from omegaconf import DictConfig

from . import runtime
from .config import WHITELIST, check_ints, check_model_path, check_targets, instantiate
from .data.load import read_samples
from .errors import ConfigError
from .files import atomic_write_text
from .held_out import Evaluator, before_after_table, is_by_position, paired_se
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


SECTIONS = ("held_out", "external", "strength")  # the metric sections out= holds


def suite_sections(suite: str) -> tuple[str, ...]:
    """The sections an evaluation of `suite` can measure (external: when its file exists)."""
    return (("held_out", "external") if suite != "strength" else ()) \
        + (("strength",) if suite != "held_out" else ())


def is_number(value) -> bool:
    """A JSON number (int or float, NaN and infinities included), not a boolean."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def shown(value) -> str:
    """A JSON value as a message quotes it: its JSON text, cut at 40 characters."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_against(path: str, earlier: dict, sections: tuple[str, ...] = SECTIONS) -> None:
    """ConfigError naming the file and the key unless `earlier` is what out= writes: at
    least one of `sections`, each section an object of numbers (its counts, `eval_n/...`,
    integers >= 0), and `per_sample` (when
    there) an object of sections, each an object of lists of numbers (null only in a
    `..._by_position` list)."""
    where = f"against={path}"
    found = [s for s in SECTIONS if s in earlier]
    if not found:
        raise ConfigError(f"{where}: holds none of the evaluation's sections "
                          f"({', '.join(SECTIONS)}): not an out= file of python -m "
                          "rookworld.evaluate")
    if not set(found) & set(sections):
        raise ConfigError(f"{where}: holds {', '.join(found)} only, none of the sections this "
                          f"evaluation measures ({', '.join(sections)}): run the suite the "
                          "file was written with")
    for section in found:
        metrics = earlier[section]
        if not isinstance(metrics, dict):
            raise ConfigError(f"{where}: {section} is {type(metrics).__name__}, not an object "
                              "of metrics")
        for key, value in metrics.items():
            if not is_number(value):
                raise ConfigError(f"{where}: {section}.{key} is {shown(value)}, not a number")
            if key.partition("/")[0].endswith("_n") and not (isinstance(value, int)
                                                             and value >= 0):
                raise ConfigError(f"{where}: {section}.{key} is {shown(value)}, not a count "
                                  "(an integer >= 0)")
    per_sample = earlier.get("per_sample", {})
    if not isinstance(per_sample, dict):
        raise ConfigError(f"{where}: per_sample is {type(per_sample).__name__}, not an object "
                          "of sections")
    for section, values in per_sample.items():
        if not isinstance(values, dict):
            raise ConfigError(f"{where}: per_sample.{section} is {type(values).__name__}, "
                              "not an object of per-sample lists")
        for key, items in values.items():
            if not isinstance(items, list):
                raise ConfigError(f"{where}: per_sample.{section}.{key} is "
                                  f"{type(items).__name__}, not a list of numbers")
            for value in items:
                if not (is_number(value) or (value is None and is_by_position(key))):
                    raise ConfigError(f"{where}: per_sample.{section}.{key} holds "
                                      f"{shown(value)}, not a number")


def read_against(path: str, sections: tuple[str, ...] = SECTIONS) -> dict:
    """An earlier `out` file, for `against=`, checked (`check_against`) for the sections an
    evaluation of `sections` measures; ConfigError when it cannot be read or is not an out=
    file."""
    try:
        earlier = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:  # missing, unreadable, or not JSON
        raise ConfigError(f"against={path}: cannot read it as an earlier out= file ({e})"
                          ) from None
    if not isinstance(earlier, dict):
        raise ConfigError(f"against={path}: not an out= file of python -m rookworld.evaluate "
                          "(a JSON object of metrics)")
    check_against(path, earlier, sections)
    return earlier


def check_out(path: str) -> None:
    """ConfigError unless out= can be written: not a directory, its folder made (when
    missing) and a file created and removed there, before the data and the model load."""
    out = Path(path)
    if out.is_dir():
        raise ConfigError(f"out={path}: a directory; give a file path, such as "
                          f"out={out / 'metrics.json'}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ConfigError(f"out={path}: cannot write a file in its folder ({e})") from None


def write_out(path: str, results: dict, per_sample: dict) -> None:
    """The metrics and each sample's values as JSON, replacing path whole (`atomic_write_text`:
    an earlier file stays as it was when the write fails); ConfigError naming the path and
    the error for a write that fails (a full disk)."""
    try:
        atomic_write_text(Path(path), json.dumps(results | {"per_sample": per_sample}) + "\n")
    except OSError as e:
        raise ConfigError(f"out={path}: not saved ({e}); the evaluation's figures are printed "
                          "above") from None


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
    earlier = read_against(cfg.against, suite_sections(cfg.suite)) if cfg.against else None
    if cfg.out:  # checked before the measurements, so a path that cannot be written fails first
        check_out(cfg.out)
    runtime.setup()  # the process-wide choices, before the model
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
        write_out(cfg.out, results, per_sample)


if __name__ == "__main__":
    from .config import check_argv
    check_argv(sys.argv[1:])
    main()
