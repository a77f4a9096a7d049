"""GRPO training: `python -m rookworld.train [group=option ...] [key=value ...]`.

The only place that instantiates config. The loop: draw prompts from the task
mix, sample G completions each, score them, take the PPO-clipped step with a
KL term against the frozen reference, log, evaluate, checkpoint; record the
outcome (success, kl_failure, nan_failure, error) in the run directory.
"""

from __future__ import annotations

import heapq
import json
import os
import signal
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from . import precision, runtime
from .anchor import Anchor
from .backends.fast_gpt2 import matmul as forward_matmul
from .backends.hf import max_positions
from .config import (
    WHITELIST,
    ConfigError,
    check_argv,
    instantiate,
    prompts_per_step,
    unreached_reward,
    unread_additions,
    validate,
)
from .data.load import load_data
from .distributed import DistContext, launched_by_torchrun
from .distributed import init as init_distributed
from .engine import GRPOEngine
from .engine_settings import EngineSettings
from .episodes import Games, play
from .files import atomic_write_bytes, atomic_write_text
from .grpo import Algorithm
from .guards import KLGuard, NaNGuard, Outcome
from .held_out import Evaluator, before_after_table, paired_se
from .kl_schedule import KLSchedule
from .memory import peak_memory_mb
from .optim import AdamWSpec
from .prompt_filter import HardestGreedy
from .redact import redact, redact_config
from .resume import (
    check_resume,
    finished_outcome,
    record_steps,
    refuse_to_overwrite,
    resolve_resume,
)
from .run_dir import (
    RUN_CONFIG,
    CheckpointError,
    MetricsFile,
    RunLock,
    disk_full_error,
    ensure_writable,
    fold_into,
    load_checkpoint,
    make_output_dirs,
    named_dirs,
    save_checkpoint,
    set_aside_error,
)
from .sampling import NonFiniteLogits, SamplingSettings
from .strength import StrengthSuite, SuiteSettings, common_changes, settings_from
from .strength.suite import open_suite
from .task_mix import Mixed

EVAL_SAMPLES = "eval_samples.jsonl"  # each evaluation's per-sample values (paired intervals)
RUNTIME_FILE = "runtime.json"  # the process-wide choices of the run (`runtime.describe`)


@dataclass
class Parts:
    """Everything built from config before the model: cheap, validated first."""

    settings: EngineSettings
    algorithm: Algorithm
    kl: KLSchedule
    optim: AdamWSpec
    sampling: dict[str, SamplingSettings]
    task_mix: Mixed | Games
    anchor: Anchor
    prompt_filter: HardestGreedy
    kl_guard: KLGuard | None
    nan_guard: NaNGuard
    strength: SuiteSettings | None
    loggers: list = field(default_factory=list)


@dataclass
class RunResult:
    outcome: Outcome
    run_dir: Path
    initial_eval: dict
    final_eval: dict
    objective: float


def build_parts(cfg: DictConfig) -> Parts:
    validate(cfg)
    if cfg.model.get("_target_") == "rookworld.backends.hub.load_hf":
        from .backends.hub import check  # config and weight format, before the data loads

        try:
            check(**{k: v for k, v in cfg.model.items() if k != "_target_"})
        except (ValueError, FileNotFoundError) as e:  # UnsupportedModel is a ValueError
            raise ConfigError(str(e)) from None
    kl = instantiate(cfg.kl)
    if kl.needs_reference and not cfg.reference.enabled:
        raise ConfigError(f"kl={type(kl).__name__} needs a reference model but "
                          "reference.enabled=false; set reference.enabled=true, or kl=none "
                          "guard.kl=null (the KL guard reads the reference too)")
    g = cfg.guard
    strength = settings_from(cfg.strength) if cfg.get("strength") else None
    try:  # built here, not by instantiate: their bad values are config errors all the same
        kl_guard = KLGuard(**g.kl) if g.get("kl") else None
        nan_guard = NaNGuard(**g.nan)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"guard: {e}") from None
    if kl_guard and not cfg.reference.enabled:
        raise ConfigError("guard.kl measures KL against the reference but reference.enabled="
                          "false; set reference.enabled=true or guard.kl=null")
    try:
        algorithm = instantiate(cfg.algorithm)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    settings = EngineSettings.from_config(cfg)
    if not (kl.needs_reference or kl_guard):  # nothing reads a reference: none is loaded
        settings = replace(settings, reference=replace(settings.reference, enabled=False))
    return Parts(settings=settings, algorithm=algorithm,
                 kl=kl, optim=instantiate(cfg.optim),
                 sampling=instantiate(cfg.sampler), task_mix=instantiate(cfg.task_mix),
                 anchor=instantiate(cfg.anchor), prompt_filter=instantiate(cfg.prompt_filter),
                 kl_guard=kl_guard, nan_guard=nan_guard, strength=strength,
                 loggers=[instantiate(v) for v in (cfg.logger or {}).values()])


def build_engine(cfg: DictConfig, p: Parts, reward, dist: DistContext | None = None
                 ) -> GRPOEngine:
    """The engine a composed config names (dist: the torchrun context; None: one process)."""
    return GRPOEngine(instantiate(cfg.model), reward, p.algorithm, p.settings, kl=p.kl,
                      optim=p.optim, sampling=p.sampling, dist=dist, anchor=p.anchor,
                      nan_lr_backoff=p.nan_guard.lr_backoff)


def _log(loggers, metrics_file: MetricsFile | None, row: dict, step: int) -> None:
    if metrics_file is not None:  # None on DDP ranks other than 0
        metrics_file.append({"step": step, **row})
    for lg in loggers:
        lg.log(row, step)


def evaluate(engine, evaluator, cfg, loggers, metrics_file, step: int,
             samples_file: MetricsFile, baseline: dict | None,
             suite: StrengthSuite | None = None) -> tuple[dict, dict]:
    """-> (metrics, per-sample values), the strength suite's among them when there is
    one (its report and games under strength/<start|step-N>/). The values go to
    samples_file; against the baseline's (the start's) they give each metric's paired
    change interval and the centipawn loss's change on the positions both answered legally
    (`strength.common_changes`)."""
    t0 = time.perf_counter()
    label = "start" if step < 0 else f"step {step}"
    values = {}
    with tqdm(total=len(evaluator), desc=f"eval ({label})", unit="prompt",
              leave=False, mininterval=2) as bar:
        m, examples = evaluator(engine.policy, engine.reward.at(step), cfg.examples_to_log,
                                progress=bar.update, per_sample=values)
    if suite is not None:
        t1 = time.perf_counter()
        sm, sv, _ = suite(engine.policy, engine.sampling["P"],
                          label="start" if step < 0 else f"step-{step + 1}")
        m |= sm | {"time/strength_s": time.perf_counter() - t1}
        values |= sv
    if baseline:
        m |= paired_se(baseline, values) | common_changes(baseline, values)
    m["time/eval_s"] = time.perf_counter() - t0
    samples_file.append({"step": step, "values": values})
    _log(loggers, metrics_file, m, step)
    for lg in loggers:
        lg.log_examples(examples, step)
    return m, values


def _evaluation(row: dict | None) -> dict | None:
    """An evaluation's metrics from its metrics.jsonl row (without the row's step)."""
    return None if row is None else {k: v for k, v in row.items() if k != "step"}


def train_loop(cfg, p: Parts, engine, pools, evaluator, run_dir: Path, loggers,
               suite: StrengthSuite | None = None, ckpt: Path | None = None) -> tuple:
    """The steps from the start, or from `ckpt` (a resume's checkpoint, `check_resume`);
    -> (outcome, first evaluation, last evaluation)."""
    main = engine.dist is None or engine.dist.is_main  # DDP: rank 0 logs, evaluates, saves
    metrics_file = MetricsFile(run_dir / "metrics.jsonl")
    samples_file = MetricsFile(run_dir / EVAL_SAMPLES)
    start, first_eval, baseline, last_eval = 0, None, None, None
    if ckpt:
        state = load_checkpoint(ckpt, engine)
        start = state["next_step"]
        if main:
            print(f"[rookworld] resume: from {ckpt} (steps {start} to {cfg.steps} left to "
                  "train)", flush=True)
        p.nan_guard.load_state_dict(state["nan_guard"])
        if p.kl_guard and state.get("kl_guard"):
            p.kl_guard.load_state_dict(state["kl_guard"])
        if state.get("cpu_matmul") and state["cpu_matmul"] != forward_matmul.CPU_MATMUL:
            print(f"[rookworld] resume: the run's checkpoints were made with cpu_matmul="
                  f"{state['cpu_matmul']}; it continues with that (not "
                  f"{forward_matmul.CPU_MATMUL}), so that it stays bit-identical", flush=True)
            runtime.use_cpu_matmul(state["cpu_matmul"])
        if main:  # (their lines were checked before the run started: check_resume)
            metrics_file.truncate_to(start)
            samples_file.truncate_to(start)
            for lg in loggers:
                if hasattr(lg, "resume_at"):  # side files cut back to the checkpoint too
                    lg.resume_at(start)
        evals = [r for r in metrics_file.read() if "eval/reward" in r]
        first_eval = _evaluation(next(iter(evals), None))
        # the newest evaluation so far: the final one when the checkpoint is the last step
        last_eval = _evaluation(next((r for r in reversed(evals) if r["step"] >= 0), None))
        baseline = next((r["values"] for r in samples_file.read() if r["step"] < 0), None)
    elif main:  # a fresh start (or a run killed before its first checkpoint): no old rows
        metrics_file.truncate_to(-1)
        samples_file.truncate_to(-1)
        for lg in loggers:
            if hasattr(lg, "resume_at"):
                lg.resume_at(-1)
        first_eval, baseline = evaluate(engine, evaluator, cfg, loggers, metrics_file, -1,
                                        samples_file, None, suite)
    if main:  # the process-wide choices this run trains under (a resume: its own again)
        atomic_write_text(run_dir / RUNTIME_FILE, json.dumps(runtime.describe(), indent=1))
    metrics_file = metrics_file if main else None
    last_eval, n_prompts = last_eval or first_eval, prompts_per_step(cfg)
    for step in range(start, cfg.steps):
        t0 = time.perf_counter()
        games = isinstance(p.task_mix, Games)  # episodes: whole games from start positions
        samples = [] if games else p.task_mix.draw(pools, p.prompt_filter.drawn(n_prompts),
                                                   step, cfg.seed)
        with forward_matmul.low_precision(engine.products):  # fast_gpt2's bf16, if any
            try:
                if games:
                    filtered = {}
                    batch = play(engine, p.task_mix.starts(pools, step, cfg.seed), step,
                                 p.task_mix)
                else:
                    samples, filtered = p.prompt_filter.select(engine, samples, n_prompts, step)
                    batch = engine.rollout(samples, step)
            except NonFiniteLogits as e:  # the last update blew the weights up
                return (Outcome("nan_failure", step, f"{e} when sampling step {step}; lower "
                                "optim.lr or tighten optim.grad_clip"), first_eval, last_eval)
            if p.anchor.active:
                batch.anchor = p.anchor.draw(pools, step, cfg.seed)
            m = batch.metrics | filtered | engine.update(batch, step)
        if cfg.eval_train_batch and main and samples:
            m |= Evaluator(samples, p.sampling, prefix="train_batch")(
                engine.policy, engine.reward.at(step))[0]
        m["time/step_s"] = time.perf_counter() - t0
        m["time/tokens_per_s"] = m["sample/tokens"] / m["time/step_s"]
        m["mem/peak_mb"] = peak_memory_mb(engine.device)
        _log(loggers, metrics_file, m, step)
        # a skipped (non-finite) update is the NaN guard's to judge; its KL says nothing
        kl_reason = p.kl_guard.check(m) if p.kl_guard and "kl/k3" in m \
            and not m.get("guard/nan_skipped") else None
        if reason := kl_reason or p.nan_guard.check(m):  # the NaN guard only while KL holds
            kind = "kl_failure" if kl_reason else "nan_failure"
            return Outcome(kind, step, reason), first_eval, last_eval
        done = step + 1
        if main and (done == cfg.steps or (cfg.eval_every and done % cfg.eval_every == 0)):
            last_eval = evaluate(engine, evaluator, cfg, loggers, metrics_file, step,
                                 samples_file, baseline, suite)[0]
        if main and (done == cfg.steps
                     or (cfg.checkpoint_every and done % cfg.checkpoint_every == 0)):
            save_checkpoint(run_dir, done, engine, {
                "cpu_matmul": forward_matmul.CPU_MATMUL,
                "nan_guard": p.nan_guard.state_dict(),
                "kl_guard": p.kl_guard.state_dict() if p.kl_guard else {}})
    return Outcome("success", cfg.steps), first_eval, last_eval


class Stopped(BaseException):
    """The run was asked to stop (SIGTERM: a scheduler's preemption, `docker stop`,
    `timeout`; SIGINT: Ctrl-C): raised where the run is, so that it records its outcome as
    an error does. Not an Exception, so that no handler on the way (a checkpoint write's)
    takes it for its own failure."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


_MAIN_PID = os.getpid()
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _stop_on_signal(signum, frame) -> None:
    """SIGTERM or SIGINT in the run's own process: stop where it is (once: either signal
    while the outcome is written is ignored). In a process forked from it (the data
    check's workers) the default action: end."""
    if os.getpid() != _MAIN_PID:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    raise Stopped(signum)


def run(cfg: DictConfig, run_dir: Path, multirun: bool = False) -> RunResult:
    """Train one run in run_dir; returns its outcome and objective. Raises only for
    errors before training starts (bad config or data) or, outside sweeps, on error.
    The run holds an exclusive lock on run_dir (DDP: rank 0 holds it for all ranks)."""
    parts = build_parts(cfg)
    ckpt = None  # the checkpoint a resume continues from, found (and verified) once
    if cfg.resume:  # the logs a resume cuts back: the metrics, and the loggers' side files
        side = [lg.filename for lg in parts.loggers if hasattr(lg, "resume_at")]
        ckpt = check_resume(run_dir, cfg.steps, ("metrics.jsonl", EVAL_SAMPLES, *side))
    else:
        refuse_to_overwrite(run_dir)
    reward = instantiate(cfg.reward)  # before anything is written: a missing engine is bad input
    try:  # the run owns the reward: closing ends its engine processes, however the run ends
        ensure_writable(run_dir)
        if int(os.environ.get("RANK", "0")) != 0:
            return _run(cfg, run_dir, multirun, parts, reward, ckpt)
        with RunLock(run_dir):
            return _run(cfg, run_dir, multirun, parts, reward, ckpt)
    finally:
        reward.close()


def _run(cfg: DictConfig, run_dir: Path, multirun: bool, parts: Parts, reward,
         ckpt: Path | None) -> RunResult:
    try:
        runtime.setup(cfg.get("cpu_matmul", "auto"))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    pools, eval_samples = load_data(cfg, parts, run_dir)
    suite = open_suite(parts.strength, eval_samples, run_dir / "strength")  # reads its puzzles
    if not cfg.resume:  # the config a later `resume=` continues with (Hydra may overwrite .hydra/)
        atomic_write_text(run_dir / RUN_CONFIG, redact(OmegaConf.to_yaml(cfg)))
    if cfg.dry_run:
        print(f"[rookworld] dry run: config valid; data in {run_dir / 'data_report.json'}")
        return RunResult(Outcome("success", 0, "dry run"), run_dir, {}, {}, 0.0)
    if cfg.resume:
        record_steps(run_dir, cfg.steps)
        if int(os.environ.get("RANK", "0")) == 0:
            set_aside_error(run_dir)
    dist = init_distributed(cfg.device)  # under torchrun: join the process group
    main = dist is None or dist.is_main
    config_dict = redact_config(OmegaConf.to_container(cfg, resolve=True))
    loggers = []  # those started: a tracker that fails to start (wandb.init) is the run's error
    first = last = {}
    try:
        for lg in parts.loggers if main else []:
            lg.start(run_dir, config_dict)
            loggers.append(lg)
        torch.manual_seed(cfg.seed)
        engine = build_engine(cfg, parts, reward, dist)
        chosen = {"backend": engine.backend.name,
                  "autocast": precision.name(engine.amp or engine.products),
                  "micro_batch_tokens": engine.micro_batch_tokens}
        record_choices(cfg, chosen, run_dir, main)
        for lg in loggers:  # a tracker's copy of the config says what ran, not `auto`
            if hasattr(lg, "update_config"):
                lg.update_config(chosen)
        check_context(engine.policy, parts.sampling, [*pools["P"], *pools["A"], *eval_samples],
                      cfg.sampler)
        evaluator = Evaluator(eval_samples, parts.sampling,
                              max_per_task=cfg.data.eval_per_task)
        try:
            outcome, first, last = train_loop(cfg, parts, engine, pools, evaluator, run_dir,
                                              loggers, suite, ckpt)
        finally:  # ends the suite's and the games' Stockfish processes
            if suite is not None:
                suite.close()
            if isinstance(parts.task_mix, Games):
                parts.task_mix.close()
    except (Exception, Stopped) as e:  # recorded as the run's outcome, re-raised outside sweeps
        if isinstance(e, ConfigError) and not (cfg.resume or multirun) and \
                not (run_dir / "metrics.jsonl").exists():
            raise  # refused before the run began (check_context): no record, so the same
            # command with the setting fixed runs in this directory
        # the outcome carries the steps done and the evaluations that exist
        try:
            rows = MetricsFile(run_dir / "metrics.jsonl").read() if main else []
        except ValueError:  # a damaged file: the outcome goes without its rows
            rows = []
        done = 1 + max((r["step"] for r in rows if "reward/mean" in r
                        and isinstance(r.get("step"), int)), default=-1)
        evals = [r for r in rows if "eval/reward" in r]
        first = first or (_evaluation(evals[0]) if evals else {})
        last = last or (_evaluation(evals[-1]) if evals else {})
        outcome = Outcome("error", done, f"{type(e).__name__}: {e}")
        _best_effort("error.txt", atomic_write_text, run_dir / "error.txt",
                     redact(traceback.format_exc()))
        if cfg.resume and finished_outcome(run_dir, 0):  # a finished run's record stays
            print(f"[rookworld] resuming {run_dir} failed ({outcome.reason}); its "
                  "outcome.json (success) is kept, the error is in error.txt", flush=True)
            raise
        if not multirun:
            if main:
                _best_effort("outcome.json", _finish, cfg, run_dir, outcome, first, last,
                             loggers)
            raise
    if not main:  # rank 0 writes the outcome
        return RunResult(outcome, run_dir, first or {}, last or {}, cfg.sweep.failed_objective)
    return _finish(cfg, run_dir, outcome, first or {}, last or {}, loggers)


def check_context(policy, sampling: dict, samples: list, sampler_cfg) -> None:
    """ConfigError before any sampling when a task's longest prompts (the 8 longest in
    characters, tokenized) and its max_new_tokens exceed the model's positions: the
    samplers would stop the run at its first evaluation. The message names the key that
    sets the task's budget (its own under sampler.per_task, else sampler.max_new_tokens)."""
    limit = max_positions(policy.model.config)
    for task, s in sampling.items():
        prompts = heapq.nlargest(8, (x.prompt for x in samples if x.task == task), key=len)
        if limit is None or not prompts:
            continue
        longest = max(len(policy.encode_prompt(p)) for p in prompts)
        if longest + s.max_new_tokens > limit:
            own = OmegaConf.select(sampler_cfg, f"per_task.{task}.max_new_tokens") is not None
            key = f"sampler.per_task.{task}.max_new_tokens" if own else "sampler.max_new_tokens"
            raise ConfigError(
                f"{key}={s.max_new_tokens} (task {task}): with its longest prompt ({longest} "
                f"tokens) it exceeds the model's {limit} positions; lower {key}")


def record_choices(cfg: DictConfig, chosen: dict, run_dir: Path, main: bool) -> None:
    """Print what runs the model (backend, autocast) and write it into the run's saved
    config with auto resolved, which a resume then keeps."""
    print("[rookworld] " + ", ".join(f"{k}: {v}" for k, v in chosen.items()), flush=True)
    if any(cfg[k] != v for k, v in chosen.items()):
        for k, v in chosen.items():
            cfg[k] = v
        if main and not cfg.resume:
            atomic_write_text(run_dir / RUN_CONFIG, redact(OmegaConf.to_yaml(cfg)))


def _best_effort(name: str, write, *args) -> None:
    """Record a failure where the disk still allows it (a full disk must not hide the
    error that filled it)."""
    try:
        write(*args)
    except OSError as e:
        print(f"[rookworld] could not write {name} ({e.strerror or e})", file=sys.stderr,
              flush=True)


def _finish(cfg, run_dir: Path, outcome: Outcome, first: dict, last: dict, loggers) -> RunResult:
    ok = outcome.status == "success" and cfg.sweep.objective in last
    objective = float(last[cfg.sweep.objective]) if ok else float(cfg.sweep.failed_objective)
    summary = {"objective": objective, **{f"final/{k}": v for k, v in last.items()},
               **{f"initial/{k}": v for k, v in first.items() if k.startswith("eval/")}}
    atomic_write_text(run_dir / "outcome.json", redact(json.dumps(
        {**asdict(outcome), "objective": objective, "initial_eval": first,
         "final_eval": last}, indent=2)))
    for lg in loggers:
        lg.finish(outcome, summary)
    if first and last:
        table = before_after_table(first, last)
        heading = "Held-out greedy evaluation, before and after training:"
        if outcome.status != "success":
            heading = (f"Held-out greedy evaluation: the run stopped ({outcome.status} at step "
                       f"{outcome.step}); 'after' is the last evaluation before it stopped:")
            if last is first:
                heading = (f"Held-out greedy evaluation: the run stopped ({outcome.status} at "
                           f"step {outcome.step}) before any evaluation after the start; "
                           "'after' repeats the start:")
        atomic_write_text(run_dir / "eval_before_after.md", f"{heading}\n\n{table}\n")
        print(f"\n{heading}\n{table}")
    print(f"[rookworld] outcome={outcome.status} objective={objective:.4f} outputs in {run_dir}")
    return RunResult(outcome, run_dir, first, last, objective)


# Exit status of `python -m rookworld.train` (a single run) per outcome; an exception
# (outcome `error`) exits 1 as Python does.
EXIT_CODES = {"success": 0, "error": 1, "kl_failure": 3, "nan_failure": 4}


def _config_exit(e: ConfigError) -> None:
    """Exit 1 with one line naming the setting (under torchrun, from rank 0 only)."""
    sys.exit(f"rookworld: {e}" if int(os.environ.get("RANK", "0") or 0) == 0 else 1)


HYDRA_FILES = ("config.yaml", "hydra.yaml", "overrides.yaml")
_hydra_record: dict[Path, bytes | None] = {}  # a named run directory's .hydra files


def keep_hydra_record(argv: list[str]) -> None:
    """Read the .hydra files of the run directory named by hydra.run.dir= (None: absent)
    before Hydra saves this command's record over them, so that a refused run can put
    them back (`restore_hydra_record`)."""
    for _, value in named_dirs(argv, ("hydra.run.dir",)):
        record = (Path(value).expanduser() / ".hydra").resolve()
        for name in HYDRA_FILES:
            try:
                _hydra_record[record / name] = (record / name).read_bytes()
            except FileNotFoundError:
                _hydra_record[record / name] = None
            except OSError:
                pass


def restore_hydra_record(hc) -> None:
    """Put back the run directory's .hydra files as `keep_hydra_record` found them (those
    that were absent removed), so that a refused run leaves the directory as it was."""
    if hc.output_subdir is None:
        return
    record = (Path(hc.runtime.output_dir) / hc.output_subdir).resolve()
    kept = {path: data for path, data in _hydra_record.items() if path.parent == record}
    for path, data in kept.items():
        try:
            if data is None:
                path.unlink(missing_ok=True)
            else:
                atomic_write_bytes(path, data)
        except OSError as e:
            print(f"[rookworld] could not restore {path} ({e})", file=sys.stderr, flush=True)
    if kept and all(data is None for data in kept.values()):
        try:
            record.rmdir()  # made by this command: gone when it holds nothing else
        except OSError:
            pass


def drop_own_output_dir(hc) -> None:
    """Remove the dated directory Hydra made for this command (hydra.run.dir not given,
    only this command's .hydra record in it), so that a refused resume leaves nothing."""
    if hc.mode is not None and hc.mode.name == "MULTIRUN" or hc.output_subdir is None \
            or any(o.split("=", 1)[0].lstrip("+~") == "hydra.run.dir"
                   for o in hc.overrides.hydra):
        return
    out = Path(hc.runtime.output_dir)
    record = out / hc.output_subdir
    try:
        ours = list(OmegaConf.load(record / "overrides.yaml")) == list(hc.overrides.task)
    except Exception:  # noqa: BLE001 - unreadable: not known to be this command's, kept
        return
    if not ours:
        return
    try:  # the named files, then the folders only if empty: another command's files stay
        for name in HYDRA_FILES:
            (record / name).unlink(missing_ok=True)
        record.rmdir()
        out.rmdir()
    except OSError:
        pass


@hydra.main(config_path="../conf", config_name="train",
            execution_whitelist=WHITELIST)
def main(cfg: DictConfig) -> float:
    hc = HydraConfig.get()
    try:
        cfg, resumed_dir = resolve_resume(cfg, list(hc.overrides.task))
    except ConfigError as e:
        drop_own_output_dir(hc)
        _config_exit(e)
    for warning in unread_additions(cfg, list(hc.overrides.task)) + unreached_reward(cfg):
        print(f"[rookworld] warning: {warning}", flush=True)
    run_dir = resumed_dir or Path(hc.runtime.output_dir)
    if resumed_dir:
        fold_into(Path(hc.runtime.output_dir), resumed_dir)
    multirun = hc.mode is not None and hc.mode.name == "MULTIRUN"
    if multirun and not resumed_dir:  # a sweep job: sweep.replicas seeds, outcomes into the study
        # imported here: Optuna and SQLAlchemy take memory that a single run does not need
        from .sweeps.trial import run_trial, study_ref

        return run_trial(cfg, run_dir, run, study_ref(hc))
    if resumed_dir and (done := finished_outcome(resumed_dir, cfg.steps)):
        print(f"[rookworld] resume={resumed_dir}: the run already finished its {done['step']} "
              f"steps (outcome.json: success); nothing to do. Pass steps=N with N > "
              f"{done['step']} to train further.")
        return float(done.get("objective", 0.0))
    handlers = {}
    if not multirun and not launched_by_torchrun():
        global _MAIN_PID
        _MAIN_PID = os.getpid()  # the run's process; a process forked from it ends instead
        for sig in STOP_SIGNALS:  # SIGINT only where Python's own handler has it (not ignored)
            if sig == signal.SIGTERM or signal.getsignal(sig) is signal.default_int_handler:
                handlers[sig] = signal.signal(sig, _stop_on_signal) or signal.SIG_DFL
    try:
        result = run(cfg, run_dir, multirun=multirun)
    except Stopped as e:  # recorded in outcome.json by the run; what to do, in one line
        print(f"rookworld: {e}; continue with resume={run_dir.resolve()}", file=sys.stderr,
              flush=True)
        sys.exit(128 + e.signum)
    except ConfigError as e:  # a bad setting or input: one line naming it, no traceback
        if multirun:
            raise
        restore_hydra_record(hc)  # refused before the run wrote anything: Hydra's record too
        _config_exit(e)
    except CheckpointError as e:  # a full disk: what to do, without a traceback
        if multirun:
            raise
        sys.exit(f"rookworld: {e}")
    except Exception as e:  # a full disk outside a checkpoint: one line too
        full = disk_full_error(e)
        if multirun or full is None:
            raise
        sys.exit(f"rookworld: writing {full.filename or f'into {run_dir}'} failed "
                 f"({full.strerror}); free space, then continue with "
                 f"resume={run_dir.resolve()}")
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    if not multirun and result.outcome.status != "success":
        sys.exit(EXIT_CODES[result.outcome.status])
    return result.objective


if __name__ == "__main__":
    check_argv(sys.argv[1:])
    make_output_dirs(sys.argv[1:])
    keep_hydra_record(sys.argv[1:])
    main()
