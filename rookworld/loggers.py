"""Where metrics go besides the always-on metrics file: the `logger` group.

Each logger has `start(run_dir, config)`, `log(metrics, step)`,
`log_examples(rows, step)` and `finish(outcome, summary)`. `step` is the index
of the last training step done (-1 = the evaluation before training); an
evaluation row shares its step with the training row just before it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from .held_out import interval
from .redact import redact, redact_config

CONSOLE_KEYS = ("reward/mean", "reward/P/mean", "reward/A/mean", "train_batch/reward",
                "kl/value", "kl/coef", "policy/entropy", "policy/clip_frac_high",
                "groups/zero_variance_share", "time/step_s")


def fmt_value(v) -> str:
    """4 significant digits for floats, everything else as str."""
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def fmt_duration(seconds: float) -> str:
    """75 -> '1m15s', 3725 -> '1h02m', 8.4 -> '8s'."""
    s = int(round(max(seconds, 0.0)))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def is_eval_row(metrics: dict) -> bool:
    return any(k.startswith("eval/") for k in metrics)


def format_eval(metrics: dict) -> str:
    """eval/* metrics on one line, grouped by task: 'eval/reward=0.2 | P: reward=0.1±0.03 ...'
    (± the ~95% interval, `held_out.interval`, where eval_se/* gives one)."""
    tasks: dict[str, list[str]] = {}
    for k, v in metrics.items():
        parts = k.split("/")
        if len(parts) == 3 and parts[0] == "eval":
            half = interval(metrics, k)
            ci = "" if half is None else f"±{half:.2g}"
            tasks.setdefault(parts[1], []).append(f"{parts[2]}={fmt_value(v)}{ci}")
    head = f"eval/reward={fmt_value(metrics['eval/reward'])}" if "eval/reward" in metrics else ""
    body = [f"{t}: " + " ".join(items) for t, items in sorted(tasks.items())]
    tail = [f"{fmt_duration(metrics['time/eval_s'])}"] if "time/eval_s" in metrics else []
    return " | ".join(x for x in [head, *body, *tail] if x)


class ConsoleLogger:
    """One readable line every `every` training steps with `keys` (missing keys are
    skipped), prefixed with the step, the seconds per step and the time left; one line
    per evaluation (always), grouped by task."""

    def __init__(self, every: int = 1, keys: list[str] | tuple = CONSOLE_KEYS):
        self.every, self.keys = max(int(every), 1), tuple(keys)
        self.total, self._first = None, None  # (step, time) of the first training row seen

    def start(self, run_dir, config: dict) -> None:
        self.total, self._first = config.get("steps"), None
        print(f"[rookworld] run directory: {run_dir}", flush=True)

    def _prefix(self, step: int) -> str:
        now, total = time.perf_counter(), self.total or 0
        width = len(str(total))
        head = f"step {step:>{width}}/{total}"
        if self._first is None or step <= self._first[0]:
            return head
        per_step = (now - self._first[1]) / (step - self._first[0])
        return f"{head} {per_step:.3g}s/step eta {fmt_duration(per_step * (total - step - 1))}"

    def log(self, metrics: dict, step: int) -> None:
        if is_eval_row(metrics):
            where = "before training" if step < 0 else f"after step {step}"
            print(f"[eval {where}] {format_eval(metrics)}", flush=True)
            return
        if self._first is None:
            self._first = (step, time.perf_counter())
        if step % self.every and step + 1 != self.total:
            return
        body = "  ".join(f"{k}={fmt_value(metrics[k])}" for k in self.keys if k in metrics)
        print(f"[{self._prefix(step)}] {body}", flush=True)

    def log_examples(self, rows: list[dict], step: int) -> None:
        pass

    def finish(self, outcome, summary: dict) -> None:
        print(f"[rookworld] outcome: {outcome.status} at step {outcome.step}"
              + (f" ({outcome.reason})" if outcome.reason else ""), flush=True)


class ExamplesFile:
    """Every evaluation's sample completions with their rewards, one JSON row each
    ({step, task, prompt, completion, reference, reward}), in RUN_DIR/`filename`;
    `python -m rookworld.report` shows the last evaluation's."""

    def __init__(self, filename: str = "examples.jsonl"):
        self.filename, self.path = filename, None

    def start(self, run_dir, config: dict) -> None:
        self.path = Path(run_dir) / self.filename

    def log(self, metrics: dict, step: int) -> None:
        pass

    def resume_at(self, next_step: int) -> None:
        """Drop rows of steps from next_step on (written after the checkpoint a resume
        continues from), so that the resumed run does not repeat them."""
        if self.path is not None and self.path.exists():
            from .run_dir import MetricsFile
            MetricsFile(self.path).truncate_to(next_step)

    def log_examples(self, rows: list[dict], step: int) -> None:
        if rows:
            with open(self.path, "a") as f:
                f.write("".join(json.dumps({"step": step, **r}, default=float) + "\n"
                                for r in rows))

    def finish(self, outcome, summary: dict) -> None:
        pass


class WandbLogger:
    """Weights & Biases. mode: online | offline | disabled (WANDB_MODE overrides);
    project/entity/group/job_type/tags/name as in `wandb.init`; the resolved config
    is the run config; every row is logged with its training step as the x-axis
    (`step`, -1 = before training); the outcome, the first and the final evaluation
    go to the summary (`outcome/*`, `initial/eval/*`, `final/eval/*`, `objective`);
    a table of sample completions with their rewards (`eval/examples`) every
    `examples_every` evaluations. The run is written under RUN_DIR/wandb; an
    offline run is uploaded later with `wandb sync RUN_DIR/wandb/offline-run-*`."""

    def __init__(self, project: str = "rookworld", entity: str | None = None,
                 group: str | None = None, job_type: str = "train", tags: list | None = None,
                 name: str | None = None, mode: str = "offline", examples_every: int = 1):
        if mode not in ("online", "offline", "disabled"):
            raise ValueError(f"logger.wandb.mode must be online, offline or disabled, got {mode!r}")
        self.kwargs = dict(project=project, entity=entity, group=group, job_type=job_type,
                           tags=list(tags or []), name=name)
        self.mode, self.examples_every = mode, max(int(examples_every), 1)
        self.run, self._n_evals = None, 0

    def start(self, run_dir, config: dict) -> None:
        import wandb

        mode = os.environ.get("WANDB_MODE", self.mode)
        argv = sys.argv[:]  # W&B stores the command line: mask secrets in it (rookworld/redact.py)
        sys.argv[1:] = [redact(a) for a in argv[1:]]
        try:
            self.run = wandb.init(dir=str(Path(run_dir)), config=redact_config(config),
                                  mode=mode, reinit="finish_previous", **self.kwargs)
        finally:
            sys.argv[:] = argv
        # our step is the x-axis: W&B's own _step must grow, ours starts at -1 and an
        # evaluation row repeats the step of the training row before it
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")

    def update_config(self, values: dict) -> None:
        """Settings resolved once the run starts (the backend, autocast and micro-batch
        size that `auto` chose) replace their `auto` in the run's W&B config."""
        self.run.config.update(values, allow_val_change=True)

    def log(self, metrics: dict, step: int) -> None:
        self.run.log({**metrics, "step": step})

    def log_examples(self, rows: list[dict], step: int) -> None:
        self._n_evals += 1
        if not rows or (self._n_evals - 1) % self.examples_every:
            return
        import wandb

        cols = ["step", *rows[0]]
        table = wandb.Table(columns=cols, data=[[step, *(r[c] for c in cols[1:])] for r in rows])
        self.run.log({"eval/examples": table, "step": step})

    def finish(self, outcome, summary: dict) -> None:
        """summary: the run's objective, final/* and initial/* evaluations (a resumed run's
        initial/* too: they come from its metrics, not from what this process logged)."""
        self.run.summary.update({"outcome/status": outcome.status, "outcome/step": outcome.step,
                                 "outcome/reason": outcome.reason, **summary})
        self.run.finish(exit_code=0 if outcome.status == "success" else 1)
