"""Supervised pre-training of the embedded model: `python -m rookworld.pretrain`.

Next-token loss on completions only (prompt tokens masked), on the project's
P and A samples in the exact RookWorld formats, with the character tokenizer.
Resumable (`resume=true` continues from out_dir/checkpoint), time-boxed
(`max_minutes`), and it writes the model in the hub layout plus a model card
whose figures are the greedy held-out metrics it measured.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import shutil
import sys
import time
from itertools import accumulate
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from . import precision, runtime
from .config import WHITELIST, check_ints, check_model_path, check_targets, instantiate
from .data.load import read_samples
from .data.loaders import ON_DEFECT
from .errors import ConfigError, check_not_shipped
from .evaluate import measure
from .files import atomic_write_text, replace_dir, sha256_file
from .optim import cosine_schedule
from .policy import EMBEDDED_DIR, save_policy
from .run_dir import (
    MANIFEST,
    MetricsFile,
    disk_full_error,
    is_write_failure,
    load_weights,
    verify,
    write_manifest,
)
from .sft import encode, lm_loss, make_batch


def check_export_target(export_to: str | None, replace_shipped: bool) -> None:
    """ConfigError when export_to names the shipped model's directory (`policy.EMBEDDED_DIR`)
    and replace_shipped is not true."""
    check_not_shipped(export_to, EMBEDDED_DIR, replace_shipped, "export_to")


_INT_RULES = {  # key: (minimum, what it takes) of pretrain's integer settings
    "steps": (1, "an integer >= 1"),
    "batch_size": (1, "an integer >= 1"),
    "checkpoint_every": (0, "an integer >= 0 (0 = at the end only)"),
    "warmup_steps": (0, "an integer >= 0"),
    "curve_every": (0, "an integer >= 0 (0 = none)"),
    "curve_per_task": (0, "an integer >= 0 (0 = all)"),
    "data.eval_per_task": (0, "an integer >= 0 (0 = all)"),
}


def check_settings(cfg: DictConfig) -> None:
    """ConfigError naming the key for a setting pretrain cannot run with, before the data
    (a read of ~30 s) and the model load: its own counts, rates, time budget and defect
    choice, the device (as train checks it), the model path, and the sampler, reward and
    strength groups that the curve and the final measurement build only after training."""
    check_targets(cfg)
    check_ints(cfg, _INT_RULES)
    for key, positive in (("lr", True), ("min_lr", False)):
        v = cfg.get(key)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) \
                or v < 0 or (positive and v == 0):
            raise ConfigError(f"{key} must be a finite number {'> 0' if positive else '>= 0'}, "
                              f"got {v!r}")
    v = cfg.get("max_minutes")
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
        raise ConfigError(f"max_minutes must be a finite number > 0, got {v!r}")
    v = cfg.get("stop_at")
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
        raise ConfigError(f"stop_at must be an integer >= 1 or null (run to steps), got {v!r}")
    if cfg.data.on_defect not in ON_DEFECT:
        raise ConfigError(f"data.on_defect must be drop or relabel, got {cfg.data.on_defect!r}")
    try:
        precision.check_choice(cfg.autocast)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if not str(cfg.device).startswith(("cpu", "cuda")):
        raise ConfigError(f"device must be cpu, cuda or cuda:N, got {cfg.device!r}")
    if str(cfg.device).startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device={cfg.device}: this torch build or machine has no CUDA "
                          "device (torch.cuda.is_available() is False); use cpu")
    check_model_path(cfg.model.get("path"))
    try:
        instantiate(cfg.sampler)
        instantiate(cfg.reward).close()  # reward=engine: its engine starts, or is named missing
    except (ValueError, FileNotFoundError) as e:  # ConfigError is a ValueError
        raise ConfigError(str(e)) from None
    from .strength import settings_from
    settings_from(cfg.strength)  # ConfigError for a bad value


def get_lr(step: int, cfg) -> float:
    """Linear warmup, cosine decay to min_lr at cfg.steps (nanoGPT's get_lr)."""
    return cosine_schedule(step, cfg.warmup_steps, cfg.steps, cfg.min_lr, peak=cfg.lr,
                           warmup_to_peak=True)


class Curve:
    """Greedy held-out metrics (and, with a strength suite, the playing-strength measures)
    against training compute, one JSON line per point (`curve.jsonl`: step, samples seen,
    training minutes, metrics); the model card plots it. A resumed run appends to it."""

    def __init__(self, path: Path, policy, cfg, held_out, suite=None):
        from .held_out import Evaluator
        self.path, self.policy, self.cfg, self.suite = path, policy, cfg, suite
        self.sampling = instantiate(cfg.sampler)
        self.evaluator = Evaluator(held_out, self.sampling, max_per_task=cfg.curve_per_task)
        self.reward = instantiate(cfg.reward)

    def strength(self, label: str) -> dict:
        """The suite's metrics of the policy now ({} without a suite); its report and
        games go to out_dir/strength/<label>/."""
        if self.suite is None:
            return {}
        self.policy.model.eval()
        return self.suite(self.policy, self.sampling["P"], label=label)[0]

    def add(self, step: int, train_s: float) -> None:
        self.policy.model.eval()
        metrics = self.evaluator(self.policy, self.reward)[0] | \
            self.strength(f"step-{step:06d}")
        row = {"step": step, "samples": step * self.cfg.batch_size,
               "train_minutes": train_s / 60, **metrics}
        with self.path.open("a") as fh:
            fh.write(json.dumps(row) + "\n")


LINEAGE = "training.json"  # in an exported model: every pretraining stage and the whole curve


def read_lineage(path: Path | None) -> dict:
    """{"stages": [...], "curve": [...]} from a lineage file (a model's training.json, or
    a run's parent.json); empty when there is none (a model built from random weights)."""
    if path is None or not path.exists():
        return {"stages": [], "curve": []}
    data = json.loads(path.read_text())
    return {"stages": list(data.get("stages", [])), "curve": list(data.get("curve", []))}


def command_line() -> str:
    """The command that started this run, as typed (Hydra's task overrides)."""
    from hydra.core.hydra_config import HydraConfig
    try:
        overrides = list(HydraConfig.get().overrides.task)
    except ValueError:  # not started by Hydra
        overrides = []
    return " ".join(["python -m rookworld.pretrain", *overrides])


def data_record(path: str, samples: int) -> dict:
    """The training file a stage read: its path, sample count and sha256, and the
    generator command from the DATA_CARD.md beside it, so a card can say how to make
    the file again (the generator writes gzip without a timestamp: the same bytes)."""
    file = Path(path)
    card = file.parent / "DATA_CARD.md"
    made_by = next((line.strip() for line in card.read_text().splitlines()
                    if line.strip().startswith("python -m rookworld.data.generate")),
                   None) if card.exists() else None
    try:  # relative to the package's parent when the file is shipped with it
        shown = file.resolve().relative_to(Path(__file__).resolve().parents[1]).as_posix()
    except ValueError:
        shown = path
    return {"path": shown, "samples": samples, "sha256": sha256_file(file),
            "made_by": made_by}


def add_stage(parent: dict, report: dict, curve: list[dict], command: str,
              start: str) -> dict:
    """The parent's lineage plus this run as its next stage (start: what its weights
    started from): the curve's samples and minutes continue where the parent's ended."""
    stage = len(parent["stages"]) + 1
    samples0 = sum(s["samples"] for s in parent["stages"])
    minutes0 = sum(s["minutes"] for s in parent["stages"])
    this = {"stage": stage, "start": start, "command": command, "steps": report["steps"],
            "samples": report["samples_seen"], "minutes": round(report["minutes"], 1),
            "host": report.get("host"), "torch": report.get("torch"),
            "threads": report.get("threads"), "device": report.get("device"),
            "commit": report.get("commit"), "data": report.get("data")}
    rows = [{**r, "stage": stage, "samples": r["samples"] + samples0,
             "train_minutes": r["train_minutes"] + minutes0} for r in curve]
    return {"stages": parent["stages"] + [this], "curve": parent["curve"] + rows}


def read_curve(path: Path) -> list[dict]:
    """curve.jsonl's rows, last row per step (a resumed run may repeat a step)."""
    rows = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            r = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a kill
            continue
        rows[r["step"]] = r
    return [rows[k] for k in sorted(rows)]


def device_name(device: torch.device, dtype: torch.dtype | None) -> str:
    """Where a stage trained: 'cpu' (float32), 'cpu, <dtype> autocast', or the GPU's name
    with its autocast dtype or float32."""
    cast = f"{str(dtype).removeprefix('torch.')} autocast" if dtype else "float32"
    if device.type != "cuda":
        return f"cpu, {cast}" if dtype else "cpu"
    return f"{torch.cuda.get_device_name(device)}, {cast}"


CHECKPOINT = "checkpoint"  # out_dir/checkpoint: the newest resumable state
# the settings that shape a run (its schedule, batches, model and data), recorded in each
# checkpoint: a resume under other values is refused (`changed_settings`); the others
# (max_minutes, stop_at, checkpoint_every, curve and evaluation sizes, device, autocast, the
# export, the sampler, reward and strength groups) may change between a run and its resume
RUN_KEYS = ("seed", "steps", "batch_size", "lr", "min_lr", "warmup_steps", "weight_decay",
            "grad_clip", "data.on_defect")
MODEL_FREE_KEYS = {"local_files_only"}  # how a model's files are had, not what they hold
SETTINGS = "run_settings.json"  # in out_dir: this run's settings, copied into each checkpoint


def run_settings(cfg) -> dict:
    """{key: value} of the settings that shape the run: RUN_KEYS, the model node (its local
    path resolved) and data.train (its path and sha256: the content counts, not the name)."""
    settings = {key: OmegaConf.select(cfg, key) for key in RUN_KEYS}
    for key, value in OmegaConf.to_container(cfg.model, resolve=True).items():
        if key in MODEL_FREE_KEYS:
            continue
        if key == "path" and value is not None and Path(str(value)).expanduser().exists():
            value = str(Path(str(value)).expanduser().resolve())
        settings[f"model.{key}"] = value
    settings["data.train"] = {"path": str(cfg.data.train),
                              "sha256": sha256_file(Path(cfg.data.train))}
    return settings


def changed_settings(saved: dict, now: dict) -> list[str]:
    """'key=the checkpoint's value (this command: its value)' for each setting that
    differs; a key the checkpoint does not record (one it predates) is not
    compared, and data.train is compared by its content."""
    changed = []
    for key, was in saved.items():
        new = now.get(key)
        if key == "data.train":
            if (was or {}).get("sha256") != (new or {}).get("sha256"):
                changed.append(f"data.train={_shown_file(was)} (this command: "
                               f"{_shown_file(new)})")
        elif key not in now or was != new:
            changed.append(f"{key}={was} (this command: "
                           f"{new if key in now else 'not set'})")
    return changed


def _shown_file(record: dict | None) -> str:
    return f"{record['path']}, sha256 {record['sha256'][:12]}" if record else "none"


def save_state(out: Path, policy, opt, step: int, elapsed: float) -> None:
    """Write out/checkpoint whole or not at all: built beside it, sealed with a manifest,
    then swapped in (`files.replace_dir`), so a kill at any moment leaves one whole
    checkpoint that `resume_state` finds. The run's settings (out/run_settings.json, which
    `run` writes once they passed `resume_state`) go with it, for a resume to compare. A
    write the disk refuses (full, a quota, a size limit) removes the copy being built and
    ends the run with one line naming the error and the way on."""
    tmp = out / f".{CHECKPOINT}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        save_policy(policy, tmp / "model")
        torch.save({"opt": opt.state_dict(), "step": step, "elapsed": elapsed,
                    "rng": torch.get_rng_state()}, tmp / "state.pt")
        if (out / SETTINGS).is_file():
            shutil.copyfile(out / SETTINGS, tmp / SETTINGS)
        write_manifest(tmp)
    except Exception as e:  # noqa: BLE001 - torch, safetensors and tokenizers raise their own
        if not is_write_failure(e):  # a programming error stays itself
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        raise SystemExit(checkpoint_failure(out, step, e)) from None
    replace_dir(tmp, out / CHECKPOINT)


def checkpoint_failure(out: Path, step: int, error: Exception) -> str:
    """The one line for a checkpoint write the disk refused: the library's error, the space
    left, what is kept, and how to continue."""
    reason = " ".join(str(getattr(error, "strerror", None) or error).split())
    if isinstance(error, OSError) and error.filename:
        reason += f": {error.filename}"
    with contextlib.suppress(OSError):
        reason += f"; {shutil.disk_usage(out).free / 1e6:.0f} MB free there"
    kept = (f"the previous checkpoint ({out / CHECKPOINT}) is intact"
            if (out / CHECKPOINT / "state.pt").is_file()
            else "there is no earlier checkpoint, so a rerun starts at step 0")
    return (f"rookworld: pretrain: writing the checkpoint of step {step} into {out} failed "
            f"({reason}); the partial copy was removed and {kept}. Free space, then run the "
            "same command again with resume=true to continue")


def resume_state(out: Path, policy, opt, settings: dict) -> tuple[int, float]:
    """(step, elapsed seconds) of the newest whole checkpoint of out, its weights and
    optimiser state loaded; (0, 0.0) when there is none. A checkpoint is whole when its
    files match its manifest (out/checkpoint written before manifests existed is taken as
    it is);
    the copies a kill can leave beside out/checkpoint (`.checkpoint.tmp` sealed,
    `.checkpoint.old`, `.checkpoint.resumed`) count too, and the newest becomes
    out/checkpoint again. Damage, weights of another shape, or settings (`run_settings`)
    other than those the checkpoint records end the run with one line naming the file or
    the keys and what to do; a checkpoint that records no settings is resumed as it is."""
    found, problems = [], []
    for path in (out / CHECKPOINT, out / f".{CHECKPOINT}.tmp", out / f".{CHECKPOINT}.old",
                 out / f".{CHECKPOINT}.resumed"):
        if not (path / "state.pt").is_file():
            continue
        sealed = (path / MANIFEST).exists()
        if path != out / CHECKPOINT and not sealed:
            continue  # a copy beside it is whole only when sealed (a save or a delete cut short)
        if sealed and (problem := verify(path)):
            problems.append(problem)
            continue
        try:  # on the CPU first: a GPU's checkpoint resumes on a CPU-only machine too
            state = torch.load(path / "state.pt", weights_only=True, map_location="cpu")
        except Exception as e:  # noqa: BLE001 - a damaged file of an unsealed checkpoint
            problems.append(f"{path / 'state.pt'} cannot be read ({type(e).__name__})")
            continue
        found.append((state["step"], path, state))
    if not found:
        if problems:
            raise SystemExit(f"rookworld: pretrain: no checkpoint in {out} can be trusted: "
                             f"{'; '.join(problems)}. Start over with resume=false or another "
                             "out_dir")
        return 0, 0.0
    step, path, state = max(found, key=lambda f: f[0])
    if path != out / CHECKPOINT:  # a copy a kill left aside becomes the checkpoint again
        staged = out / f".{CHECKPOINT}.resumed"  # off the names replace_dir moves and clears
        if path != staged:
            shutil.rmtree(staged, ignore_errors=True)
            os.replace(path, staged)
        replace_dir(staged, out / CHECKPOINT)
        path = out / CHECKPOINT
    try:
        load_weights(policy.model, path / "model")
        opt.load_state_dict(state["opt"])
    except ValueError as e:  # another model shape than the run's
        raise SystemExit(f"rookworld: pretrain: the checkpoint in {path} does not fit this "
                         f"model ({e}); resume it with its own model settings, or start over "
                         "with resume=false or another out_dir") from None
    try:
        saved = json.loads((path / SETTINGS).read_text()) if (path / SETTINGS).is_file() \
            else {}
        if not isinstance(saved, dict):
            raise ValueError(SETTINGS)
    except ValueError:  # an unsealed checkpoint's damaged file
        raise SystemExit(f"rookworld: pretrain: {path / SETTINGS} cannot be read; start over "
                         "with resume=false or another out_dir") from None
    if changed := changed_settings(saved, settings):
        raise SystemExit(
            f"rookworld: pretrain: {out} holds a run (step {step}) made with other settings: "
            f"{'; '.join(changed)}. Continue it with the checkpoint's values, or start over "
            "with resume=false or another out_dir")
    torch.set_rng_state(state["rng"])
    print(f"[rookworld] pretrain: resuming from step {step} ({path})", flush=True)
    return step, state["elapsed"]


@hydra.main(config_path="../conf", config_name="pretrain",
            execution_whitelist=WHITELIST)
def main(cfg: DictConfig) -> None:
    try:
        run(cfg)
    except ConfigError as e:  # a bad setting or input: one line naming it, exit 1, as train
        sys.exit(f"rookworld: {e}")
    except Exception as e:  # a full disk outside a checkpoint (the log, the report): one line
        full = disk_full_error(e)
        if full is None:
            raise
        sys.exit(f"rookworld: pretrain: writing {full.filename or cfg.out_dir} failed "
                 f"({full.strerror}); free space, then run the same command again with "
                 "resume=true (it continues from out_dir's last checkpoint)")


def run(cfg: DictConfig) -> None:
    """Pretrain, measure and export as cfg says; ConfigError for a bad setting (before the
    data and the model load) or input."""
    check_export_target(cfg.export_to, cfg.replace_shipped)
    check_settings(cfg)
    runtime.setup()  # the process-wide choices, before the model
    torch.manual_seed(cfg.seed)
    out = Path(cfg.out_dir).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    train = read_samples(cfg.data.train, cfg.data.on_defect)
    if cfg.batch_size > len(train):  # a batch draws distinct samples
        raise ConfigError(f"batch_size={cfg.batch_size} is more than the {len(train)} samples "
                          f"of data.train={cfg.data.train}; lower it")
    held_out = read_samples(cfg.data.eval, cfg.data.on_defect)
    policy = instantiate(cfg.model)
    device = torch.device(cfg.device)
    dtype = precision.autocast_dtype(cfg.autocast, device)
    policy.model.to(device)
    step, elapsed = 0, 0.0
    opt = torch.optim.AdamW(policy.model.parameters(), lr=cfg.lr, betas=(0.9, 0.95),
                            weight_decay=cfg.weight_decay)
    settings = run_settings(cfg)
    if cfg.resume:
        step, elapsed = resume_state(out, policy, opt, settings)
    atomic_write_text(out / SETTINGS, json.dumps(settings, indent=1))  # for the checkpoints
    # the stages that made the starting weights, kept in the run directory so that a
    # resumed run does not read its own export as its parent; a run from step 0 writes its own
    parent_file = out / "parent.json"
    if step == 0 or not parent_file.exists():
        atomic_write_text(parent_file, json.dumps(read_lineage(
            policy.source / LINEAGE if policy.source else None), indent=1))
    for log in ("pretrain_log.jsonl", "curve.jsonl"):  # rows past the checkpoint come again
        try:
            MetricsFile(out / log).truncate_to(step + 1)  # a row's step: those it has done
        except ValueError as e:  # a damaged line, not the torn last one: named
            raise SystemExit(f"rookworld: pretrain: {e}") from None
    rows = encode(policy, train)
    suite = strength_suite(cfg, held_out, out)  # reads its puzzle file
    try:
        report = _train(cfg, policy, opt, rows, Curve(out / "curve.jsonl", policy, cfg,
                                                      held_out, suite),
                        step, elapsed, out, device, dtype, held_out, len(train))
    finally:  # ends the suite's Stockfish processes
        if suite is not None:
            suite.close()
    if cfg.export_to:
        parent = read_lineage(parent_file)
        start = (f"stage {len(parent['stages'])}'s weights" if parent["stages"]
                 else str(policy.source) if policy.source else "random weights")
        lineage = add_stage(parent, report, read_curve(out / "curve.jsonl"), command_line(),
                            start)
        export(policy, cfg, report, lineage)


def strength_suite(cfg, held_out, out: Path):
    """The `strength` group's suite over the held-out P positions (its reports under
    out/strength/), or None when every measure is off."""
    from .strength import settings_from
    from .strength.suite import open_suite
    return open_suite(settings_from(cfg.strength), held_out, out / "strength")


def _train(cfg, policy, opt, rows, curve: Curve, step: int, elapsed: float, out: Path,
           device, dtype, held_out, train_samples: int) -> dict:
    """The training loop from `step`; -> the stage's report (what it measured at the end)."""
    model = policy.model.train()
    t0 = time.perf_counter() - elapsed
    bar = tqdm(total=cfg.steps, initial=step, desc="pretrain", mininterval=5)
    log = open(out / "pretrain_log.jsonl", "a")
    last = cfg.steps if cfg.stop_at is None else min(cfg.stop_at, cfg.steps)
    try:
        while step < last and (time.perf_counter() - t0) < cfg.max_minutes * 60:
            for g in opt.param_groups:
                g["lr"] = get_lr(step, cfg)
            # the batch is a function of (seed, step): a resumed run trains on what an
            # uninterrupted one would have
            batch = random.Random(cfg.seed * 1_000_003 + step).sample(rows, cfg.batch_size)
            ids, labels = (t.to(device, non_blocking=True)
                           for t in make_batch(batch, policy.eos_id))
            loss = lm_loss(model, ids, labels, dtype)
            if not torch.isfinite(loss):  # the weights would turn NaN: keep the last checkpoint
                raise SystemExit(f"rookworld: pretrain: the loss is {loss.item()} at step "
                                 f"{step + 1}; out_dir keeps the last checkpoint. Lower lr or "
                                 "grad_clip and start over with resume=false or another out_dir")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            step += 1
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}")
            log.write(json.dumps({"step": step, "loss": loss.item(), "lr": get_lr(step - 1, cfg),
                                  "elapsed_s": time.perf_counter() - t0}) + "\n")
            if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:  # 0: at the end only
                log.flush()
                save_state(out, policy, opt, step, time.perf_counter() - t0)
            if cfg.curve_every and step % cfg.curve_every == 0:
                t_eval = time.perf_counter()
                curve.add(step, t_eval - t0)
                t0 += time.perf_counter() - t_eval  # the budget counts training time only
                model.train()
    finally:  # a stop mid-loop (a full disk, a non-finite loss) ends the bar's line first
        bar.close()
        log.close()
    elapsed = time.perf_counter() - t0
    save_state(out, policy, opt, step, elapsed)
    model.eval()
    from .model_card import code_commit, host
    report = {"steps": step, "minutes": elapsed / 60, "samples_seen": step * cfg.batch_size,
              "parameters": sum(p.numel() for p in model.parameters()),
              "host": host(), "commit": code_commit(), "torch": torch.__version__,
              "threads": torch.get_num_threads(),
              "device": device_name(device, dtype),
              "data": data_record(cfg.data.train, train_samples),
              "eval": measure(policy, cfg, held_out)}
    if strength := curve.strength("final"):
        report["strength"] = strength
    save_policy(policy, out / "model")
    atomic_write_text(out / "pretrain_report.json", json.dumps(report, indent=2))
    print(json.dumps(report["eval"], indent=2))
    return report


def export(policy, cfg, report: dict, lineage: dict) -> None:
    """Write the shipped model (safetensors, config, tokenizer), its lineage
    (training.json: every stage and the whole curve) and its model card."""
    dest = Path(cfg.export_to).expanduser().resolve()
    save_policy(policy, dest)
    from .model_card import model_card, plot_curve
    atomic_write_text(dest / LINEAGE, json.dumps(lineage, indent=1))
    ends = list(accumulate(s["samples"] for s in lineage["stages"]))[:-1]
    png = plot_curve(lineage["curve"], dest / "curve.png", ends)
    atomic_write_text(dest / "MODEL_CARD.md", model_card(
        cfg, policy.model.config, report, lineage, png.name if png else None))
    print(f"[rookworld] exported model to {dest}")


if __name__ == "__main__":
    from .config import check_argv
    check_argv(sys.argv[1:])
    main()
