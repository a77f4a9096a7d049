"""Where metrics go besides the always-on metrics file: the `logger` group.

Each logger has `start(run_dir, config)`, `log(metrics, step)`,
`log_examples(rows, step)` and `finish(outcome, summary)`.
"""

from __future__ import annotations

import os
from pathlib import Path

CONSOLE_KEYS = ("reward/mean", "reward/P/mean", "reward/A/mean", "kl/value", "kl/coef",
                "policy/entropy", "groups/zero_variance_share", "time/step_s")


class ConsoleLogger:
    """One readable line every `every` steps with `keys` (missing keys are skipped)."""

    def __init__(self, every: int = 1, keys: list[str] | tuple = CONSOLE_KEYS):
        self.every, self.keys = max(int(every), 1), tuple(keys)

    def start(self, run_dir, config: dict) -> None:
        print(f"[rookworld] run directory: {run_dir}", flush=True)

    def log(self, metrics: dict, step: int) -> None:
        if any(k.startswith("eval/") for k in metrics):
            shown = {k: v for k, v in metrics.items() if k.startswith("eval/")}
        elif step % self.every:
            return
        else:
            shown = {k: metrics[k] for k in self.keys if k in metrics}
        body = "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                         for k, v in shown.items())
        print(f"[step {step:>4}] {body}", flush=True)

    def log_examples(self, rows: list[dict], step: int) -> None:
        pass

    def finish(self, outcome, summary: dict) -> None:
        print(f"[rookworld] outcome: {outcome.status} at step {outcome.step}"
              + (f" ({outcome.reason})" if outcome.reason else ""), flush=True)


class WandbLogger:
    """Weights & Biases. mode: online | offline | disabled (WANDB_MODE overrides);
    project/entity/group/job_type/tags/name as in `wandb.init`; the resolved config
    is the run config; the outcome and final eval go to the summary; a table of
    sample completions with their rewards every `examples_every` evaluations."""

    def __init__(self, project: str = "rookworld", entity: str | None = None,
                 group: str | None = None, job_type: str = "train", tags: list | None = None,
                 name: str | None = None, mode: str = "offline", examples_every: int = 1):
        if mode not in ("online", "offline", "disabled"):
            raise ValueError(f"logger.wandb.mode must be online, offline or disabled, got {mode!r}")
        self.kwargs = dict(project=project, entity=entity, group=group, job_type=job_type,
                           tags=list(tags or []), name=name)
        self.mode, self.examples_every, self.run, self._n_examples = (
            mode, max(int(examples_every), 1), None, 0)

    def start(self, run_dir, config: dict) -> None:
        import wandb

        mode = os.environ.get("WANDB_MODE", self.mode)
        self.run = wandb.init(dir=str(Path(run_dir)), config=config, mode=mode,
                              reinit="finish_previous", **self.kwargs)

    def log(self, metrics: dict, step: int) -> None:
        self.run.log(dict(metrics), step=step)

    def log_examples(self, rows: list[dict], step: int) -> None:
        self._n_examples += 1
        if not rows or (self._n_examples - 1) % self.examples_every:
            return
        import wandb

        cols = list(rows[0])
        self.run.log({"examples": wandb.Table(columns=cols, data=[[r[c] for c in cols]
                                                                  for r in rows])}, step=step)

    def finish(self, outcome, summary: dict) -> None:
        self.run.summary.update({"outcome": outcome.status, "outcome_step": outcome.step,
                                 "outcome_reason": outcome.reason, **summary})
        self.run.finish()
