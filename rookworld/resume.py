"""Continuing a run: `resolve_resume` reads the run's own saved config for `resume=<run
dir>`, `finished_outcome` tells whether the run already finished."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .config import ConfigError, before_they_existed, fill_missing
from .files import atomic_write_text
from .redact import restore_redacted
from .run_dir import RUN_CONFIG, RunDirTaken

CORE = ("model", "data", "steps")  # settings every run's saved config holds


def resolve_resume(cfg: DictConfig, overrides: list[str] | tuple = ()
                   ) -> tuple[DictConfig, Path | None]:
    """resume=<run dir>: continue that run with its own saved config. `overrides` are the
    command line's: `steps=` there raises (or sets) the run's total and `dry_run=true`
    checks the resume without training; every other override is reported and ignored
    (hydra.* aside); secrets masked in the saved config are taken from this command's
    config."""
    if not cfg.resume:
        return cfg, None
    run_dir = Path(cfg.resume).expanduser().resolve()
    saved = next((p for p in (run_dir / RUN_CONFIG, run_dir / ".hydra" / "config.yaml")
                  if p.exists()), None)
    if saved is None:
        raise ConfigError(f"resume={cfg.resume}: no run there "
                          f"({run_dir / RUN_CONFIG} is missing)")
    old = load_saved(saved, cfg.resume)
    if "algorithm" in old and "_target_" not in old.algorithm:
        raise ConfigError(f"resume={cfg.resume}: the run was saved by an older rookworld, "
                          "whose algorithm settings and module names this version does not "
                          "read; start a new run, or resume with the version that made it")
    restore_redacted(old, cfg)
    keys = {o.split("=", 1)[0].lstrip("+~"): o for o in overrides}
    for key in ("steps", "dry_run"):  # what a resume may change
        if key in keys:
            old[key] = cfg[key]
    ignored = [o for k, o in keys.items() if k not in ("steps", "dry_run", "resume")
               and not k.startswith("hydra")]
    if ignored:
        print(f"[rookworld] resume={run_dir}: the run continues with its own config; "
              f"ignored: {' '.join(ignored)}")
    added = fill_missing(old, cfg)
    if added:
        kept = [f"{p}={v}" for p, v in before_they_existed(added).items()]
        print(f"[rookworld] resume={run_dir}: its config predates setting(s) "
              f"{', '.join(added)}; they take this version's values"
              + (f", but {', '.join(kept)}: what the run did before they existed" if kept else ""))
    old.resume = str(run_dir)
    return old, run_dir


def load_saved(path: Path, resume: str) -> DictConfig:
    """A run's saved config; ConfigError naming the file when it is damaged (not YAML,
    empty, or without the settings every run has)."""
    try:
        saved = OmegaConf.load(path)
    except (yaml.YAMLError, OSError, ValueError, OmegaConfBaseException) as e:
        problem = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        saved, why = None, f"not readable as YAML: {problem}"
    else:
        lacking = [k for k in CORE if not isinstance(saved, DictConfig) or k not in saved]
        why = None if not lacking else "empty" if not saved else \
            f"not a run's config: no {', '.join(lacking)}"
    if why:
        raise ConfigError(f"resume={resume}: {path} is damaged ({why}); restore it from a "
                          "copy, or start a new run")
    return saved


def record_steps(run_dir: Path, steps: int) -> None:
    """A resume that changed `steps`: the run's saved config (RUN_CONFIG) says so, which the
    diff, the report and a later resume read."""
    path = run_dir / RUN_CONFIG
    if path.exists() and (saved := OmegaConf.load(path)).get("steps") != steps:
        saved.steps = steps
        atomic_write_text(path, OmegaConf.to_yaml(saved))


def refuse_to_overwrite(run_dir: Path) -> None:
    """Raise ConfigError when run_dir already holds a run's results (a checkpoint,
    outcome.json, logged metrics): a new run there would cut them back. The message names
    what is there and `resume=`, which continues it (or restarts a run that has no
    checkpoint yet)."""
    run_dir = Path(run_dir)
    held = [name for name, there in (
        ("checkpoints", any((run_dir / "checkpoints").glob("step-*"))),
        ("outcome.json", (run_dir / "outcome.json").exists()),
        ("metrics.jsonl", (run_dir / "metrics.jsonl").is_file()
         and (run_dir / "metrics.jsonl").stat().st_size > 0)) if there]
    if held:
        raise RunDirTaken(f"{run_dir} already holds a run ({', '.join(held)}); a new run there "
                          f"would overwrite it. Continue it with resume={run_dir}, or choose "
                          "another hydra.run.dir (nothing was changed)")


def check_resume(run_dir: Path, steps: int, logs: tuple[str, ...]) -> Path | None:
    """The checkpoint a resume continues from (`latest_checkpoint`, None: the run starts
    over), after the refusals a resume makes before it touches the run (so that a refused
    resume records nothing): a checkpoint past `steps`, or a damaged line in one of the
    run's `logs` (metrics and side files) that the resume would have to cut back. Raises
    ConfigError (CheckpointError when no checkpoint can be trusted)."""
    from .run_dir import MetricsFile, latest_checkpoint, step_of
    ckpt = latest_checkpoint(run_dir)  # the one the resume continues from (files verified)
    if ckpt is not None and step_of(ckpt) > steps:
        raise ConfigError(f"resume: the run's newest checkpoint ({ckpt.name}) is past "
                          f"steps={steps}; pass steps={step_of(ckpt)} or more")
    for name in logs:
        try:
            MetricsFile(Path(run_dir) / name).read()
        except ValueError as e:  # a damaged line: named, and the file left as it is
            raise ConfigError(f"resume: {e}") from None
    return ckpt


def finished_outcome(run_dir: Path, steps: int) -> dict | None:
    """outcome.json of a run that already succeeded through `steps` steps, else None."""
    try:
        outcome = json.loads((run_dir / "outcome.json").read_text())
    except (OSError, ValueError):
        return None
    done = isinstance(outcome, dict) and outcome.get("status") == "success" \
        and isinstance(outcome.get("step"), int) and outcome["step"] >= steps
    return outcome if done else None
