"""Run reports: `python -m rookworld.report RUN_DIR [--out DIR]`.

Reads what a training run leaves in its directory (metrics.jsonl, outcome.json,
run_config.yaml or else .hydra/config.yaml, the overrides in .hydra/ and in each
resume's .hydra-resumes/<name>/, examples.jsonl, data_report.json) and writes into
RUN_DIR/report/:
- reward.png (training reward per task and the share of groups without signal),
  kl.png (KL estimators against the guard's threshold, and beta), entropy.png,
  clip.png (clipped token fractions), eval.png (held-out greedy metrics over
  steps), overview.png (all of them on one page);
- report.md: command (and resumes), config overrides and differences from the defaults,
  outcome, the before/after evaluation table, training metrics first vs last,
  the plots and the last evaluation's sample completions.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator, ScalarFormatter  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from .held_out import INTERVAL_NOTE, change_with_interval, is_change, with_interval  # noqa: E402
from .loggers import is_eval_row  # noqa: E402


@dataclass(frozen=True)
class Panel:
    """One axes: `series` are (metric, legend label); eval panels plot evaluation rows;
    `share` panels show the whole range 0..1."""

    title: str
    ylabel: str
    series: tuple[tuple[str, str], ...]
    eval: bool = False
    share: bool = False


REWARD = Panel("Training reward per task (sampled; greedy where named)", "mean reward", (
    ("reward/mean", "all"), ("reward/P/mean", "P: policy"), ("reward/A/mean", "A: environment"),
    ("train_batch/reward", "fixed batch, greedy"),
    ("filter/greedy_reward_drawn", "drawn prompts, greedy"),
    ("filter/greedy_reward_kept", "trained prompts, greedy")))
SIGNAL = Panel("Groups without signal", "share of groups", (
    ("groups/zero_variance_share", "all rewards equal"),
    ("groups/dropped_share", "dropped (zero_variance=drop)"),
    ("groups/identical_share", "identical completions")), share=True)
KL = Panel("KL to the reference", "nats per token", (
    ("kl/k1", "k1"), ("kl/k2", "k2"), ("kl/k3", "k3"), ("kl/full_forward", "full forward"),
    ("kl/full_reverse", "full reverse"), ("kl/full_symmetric", "full symmetric")))
BETA = Panel("KL coefficient", "beta (kl/coef)", (("kl/coef", "beta"),))
ENTROPY = Panel("Policy entropy (from the logits)", "nats per token", (
    ("policy/entropy", "entropy"),))
CLIP = Panel("Clipped tokens", "fraction of tokens", (
    ("policy/clip_frac_low", "ratio < 1 - clip_low"),
    ("policy/clip_frac_high", "ratio > 1 + clip_high")))
EVAL_REWARD = Panel("Held-out greedy reward", "mean reward", (
    ("eval/reward", "all"), ("eval/P/reward", "P"), ("eval/A/reward", "A")), eval=True)
EVAL_P = Panel("Held-out P (policy) task", "share of samples", (
    ("eval/P/format", "format"), ("eval/P/legal", "legal moves"),
    ("eval/P/best_legal", "best move legal"), ("eval/P/top5", "top-5 overlap"),
    ("eval/P/best", "best move")), eval=True, share=True)
EVAL_A = Panel("Held-out A (environment) task", "share of samples", (
    ("eval/A/format", "format"), ("eval/A/fen_exact", "FEN exact"),
    ("eval/A/fen_similarity", "FEN similarity"), ("eval/A/flags", "flags"),
    ("eval/A/exact", "exact")), eval=True, share=True)
STRENGTH = Panel("Playing strength (strength=fast|full)", "share", (
    ("eval/strength/puzzles_first", "puzzles: first move"),
    ("eval/strength/puzzles_first_masked", "puzzles: first move, masked"),
    ("eval/strength/puzzles_illegal", "puzzles: illegal answer"),
    ("eval/strength/random_score", "score vs random mover"),
    ("eval/strength/random_score_masked", "score vs random mover, masked"),
    ("eval/strength/engine_score", "score vs Stockfish"),
    ("eval/strength/blunder", "blunder share")), eval=True, share=True)
SELFPLAY = Panel("Self-play: legal half-moves", "half-moves (mean)", (
    ("eval/strength/selfplay_plies", "free"),
    ("eval/strength/selfplay_plies_masked", "masked")), eval=True)
ACPL = Panel("Average centipawn loss (legal answers)", "centipawns", (
    ("eval/strength/acpl", "free"), ("eval/strength/acpl_masked", "masked")), eval=True)

FIGURES = {  # file name -> panels, side by side
    "reward.png": (REWARD, SIGNAL),
    "kl.png": (KL, BETA),
    "entropy.png": (ENTROPY,),
    "clip.png": (CLIP,),
    "eval.png": (EVAL_REWARD, EVAL_P, EVAL_A),
    "strength.png": (STRENGTH, SELFPLAY, ACPL),
}
OVERVIEW = (REWARD, SIGNAL, ENTROPY, KL, BETA, CLIP, EVAL_REWARD, EVAL_P, EVAL_A)
LOWER_IS_BETTER = ("eval_error", "illegal", "acpl", "blunder")  # metric name parts


@dataclass
class Run:
    """What a run directory holds; absent files give empty values."""

    path: Path
    train: list[dict]
    evals: list[dict]
    outcome: dict
    config: dict  # resolved where it can be (rookworld.diff.resolve)
    overrides: list[str]
    examples: list[dict]
    data: dict
    resumes: list[list[str]] = field(default_factory=list)  # each resume's overrides


def read_jsonl(path: Path) -> list[dict]:
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a torn last line after a kill
                continue
    return rows


def read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def load_run(path: Path) -> Run:
    path = Path(path)
    if not (path / "metrics.jsonl").exists():
        raise SystemExit(f"{path}: no metrics.jsonl, not a training run directory")
    from .diff import read_overrides, resolve, resume_overrides, run_config_file

    rows = read_jsonl(path / "metrics.jsonl")
    cfg_file = run_config_file(path)  # run_config.yaml: steps as a resume raised them
    config = resolve(OmegaConf.load(cfg_file)) if cfg_file else {}
    return Run(path, [r for r in rows if not is_eval_row(r)], [r for r in rows if is_eval_row(r)],
               read_json(path / "outcome.json"), config,
               read_overrides(path / ".hydra" / "overrides.yaml"),
               read_jsonl(path / "examples.jsonl"), read_json(path / "data_report.json"),
               resume_overrides(path))


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    """Steps and values of `key` in the rows that have it (a resumed run may repeat a
    step: the last row wins)."""
    by_step = {r["step"]: r[key] for r in rows if r.get(key) is not None}
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def style(ax, flat: float = 1e-3, band: float = 0.05) -> None:
    """Integer steps on x; plain numbers on y (no offset such as '+4.556'); lines that are
    flat (their span below `flat` times their level, at least 1) are drawn in the middle
    of a band of +-`band` times that level, not blown up to fill the axes."""
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fmt_y = ScalarFormatter(useOffset=False)
    fmt_y.set_powerlimits((-3, 4))
    ax.yaxis.set_major_formatter(fmt_y)
    ys = [float(y) for line in ax.get_lines() for y in line.get_ydata()]
    if ys:
        lo, hi = min(ys), max(ys)
        level = max(1.0, abs(lo), abs(hi))
        if hi - lo < flat * level:
            mid = (lo + hi) / 2
            ax.set_ylim(mid - band * level, mid + band * level)


def guard_line(ax, run: Run, near: float = 0.25) -> None:
    """The KL guard's threshold as a dashed line when the KL came within `near` of it;
    otherwise only named in the legend, so small KL values stay visible."""
    guard = (run.config.get("guard") or {}).get("kl") or {}
    threshold = guard.get("threshold")
    if threshold is None:
        return
    label = f"guard: {guard.get('estimator')} > {threshold}"
    top = max((float(y) for line in ax.get_lines() for y in line.get_ydata()), default=0.0)
    if top >= near * threshold:
        ax.axhline(threshold, color="red", linestyle="--", linewidth=1, label=label)
    else:
        ax.plot([], [], color="red", linestyle="--", linewidth=1, label=label + " (off scale)")


def draw(ax, panel: Panel, run: Run) -> None:
    rows = run.evals if panel.eval else run.train
    drawn = 0
    for key, label in panel.series:
        x, y = series(rows, key)
        if x:
            ax.plot(x, y, label=label, marker="o" if panel.eval or len(x) < 20 else None,
                    markersize=3, linewidth=1.5)
            drawn += 1
    if panel is KL and drawn:
        guard_line(ax, run)
    style(ax)
    if panel.share:
        ax.set_ylim(-0.03, 1.03)
    ax.set_title(panel.title, fontsize=10)
    ax.set_xlabel("step (-1 = before training)" if panel.eval else "training step", fontsize=9)
    ax.set_ylabel(panel.ylabel, fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(True, alpha=0.3)
    if drawn:
        n = len(ax.get_legend_handles_labels()[1])  # below the axes: never over the data
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2),
                  ncol=min(n, 3), frameon=False)
    else:
        ax.text(0.5, 0.5, "not logged in this run", ha="center", va="center",
                transform=ax.transAxes, color="gray")
    if panel is CLIP and drawn and (run.config.get("algorithm") or {}).get("num_iterations") == 1:
        ax.text(0.5, 0.9, "num_iterations=1: the ratio is 1 at the update,\nso nothing is clipped",
                ha="center", va="top", transform=ax.transAxes, color="gray", fontsize=8)


def figure(panels: tuple[Panel, ...], run: Run, out: Path, ncols: int | None = None,
           title: str | None = None, dpi: int = 100) -> Path:
    ncols = ncols or len(panels)
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 4.0 * nrows), squeeze=False)
    for ax, panel in zip(axes.flat, panels):
        draw(ax, panel, run)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    return out


def fmt(v, spec: str = ".3f") -> str:
    return format(v, spec) if isinstance(v, float) else str(v)


def eval_table(run: Run) -> list[str]:
    """Before (first evaluation), after (last), change and best over the run, per metric,
    each with its ~95% interval where the run logged standard errors."""
    if not run.evals:
        return ["No evaluation was logged."]
    first, last = run.evals[0], run.evals[-1]
    keys = sorted(k for k in {**first, **last} if k.startswith("eval/") and k != "eval/reward")
    lines = [INTERVAL_NOTE + ".", "",
             f"| metric | before (step {first['step']}) | after (step {last['step']}) "
             "| change | best (step) |", "|---|---|---|---|---|"]
    for k in [*keys, "eval/reward"]:
        if is_change(k):
            if k in last:
                lines.append(f"| {k} | | | {change_with_interval(first, last, k)} | |")
            continue
        if k not in last or k not in first:  # only one evaluation has it: "-" for the other
            before, after = (with_interval(m, k) if k in m else "-" for m in (first, last))
            lines.append(f"| {k} | {before} | {after} | - | |")
            continue
        steps, values = series(run.evals, k)
        # errors, losses and illegal shares are lower-better; the other metrics higher-better
        best = min if any(w in k.rsplit("/", 1)[-1] for w in LOWER_IS_BETTER) else max
        i = values.index(best(values))
        lines.append(f"| {k} | {with_interval(first, k)} | {with_interval(last, k)} "
                     f"| {change_with_interval(first, last, k)} | {fmt(values[i])} ({steps[i]}) |")
    return lines


TRAIN_KEYS = ("reward/mean", "reward/P/mean", "reward/A/mean", "filter/greedy_reward_drawn",
              "filter/greedy_reward_kept", "groups/zero_variance_share",
              "kl/value", "kl/coef", "policy/entropy", "policy/clip_frac_low",
              "policy/clip_frac_high", "optim/grad_norm", "optim/lr", "sample/len_mean",
              "time/step_s", "time/tokens_per_s")


def train_table(run: Run, window: int = 5) -> list[str]:
    """First step, last step, and the mean of the first and last `window` steps."""
    if not run.train:
        return ["No training step was logged."]
    head, tail = run.train[:window], run.train[-window:]
    lines = [f"| metric | step {run.train[0]['step']} | step {run.train[-1]['step']} "
             f"| mean of first {len(head)} | mean of last {len(tail)} |", "|---|---|---|---|---|"]
    for k in TRAIN_KEYS:
        a, b = [r[k] for r in head if k in r], [r[k] for r in tail if k in r]
        if a and b:
            lines.append(f"| {k} | {fmt(run.train[0].get(k, '-'), '.4g')} | "
                         f"{fmt(run.train[-1].get(k, '-'), '.4g')} | {statistics.fmean(a):.4g} | "
                         f"{statistics.fmean(b):.4g} |")
    return lines


def overrides_section(run: Run) -> list[str]:
    """The command's overrides, then each resume's, labelled `resume: key`."""
    from .diff import with_resumes

    overrides = with_resumes(run.overrides, run.resumes)
    if not overrides:
        return ["None: the defaults of conf/train.yaml."]
    return ["| override | value |", "|---|---|"] + [
        f"| `{k}` | `{v}` |" for k, _, v in (o.partition("=") for o in overrides)]


def defaults_diff_section(run: Run) -> list[str]:
    """The run's resolved config against today's defaults (rookworld.diff)."""
    if not run.config:
        return ["No run_config.yaml or .hydra/config.yaml in the run directory."]
    from .diff import compose, counts, diff_dicts, md_table, resolve

    diff = diff_dicts(resolve(compose([])), run.config)
    return [f"Resolved config against the current defaults (A = defaults, B = this run): "
            f"{counts(diff)}.", "", *md_table(diff)]


def examples_section(run: Run, per_task: int = 2) -> list[str]:
    if not run.examples:
        return ["No sample completions were logged (logger=console or wandb writes them)."]
    step = max(r["step"] for r in run.examples)
    last = {(r["task"], r["prompt"]): r for r in run.examples if r["step"] == step}
    lines = [f"Greedy completions at the last evaluation (step {step}), {per_task} per task:", ""]
    shown: dict[str, int] = {}
    for (task, _), r in last.items():
        if shown.get(task, 0) >= per_task:
            continue
        shown[task] = shown.get(task, 0) + 1
        lines += [f"- {task}, reward {r['reward']:.3f}", "", "```text",
                  f"prompt:     {r['prompt']}", f"completion: {r['completion']}",
                  f"reference:  {r['reference']}", "```", ""]
    return lines


def outcome_lines(run: Run) -> list[str]:
    o = run.outcome
    if not o:
        return ["- Outcome: none recorded (the run is still going, or was killed)."]
    reason = f" ({o['reason']})" if o.get("reason") else ""
    objective = (run.config.get("sweep") or {}).get("objective", "objective")
    return [f"- Outcome: **{o.get('status')}** at step {o.get('step')}{reason}",
            f"- Objective ({objective}): {fmt(o.get('objective'))}"]


def data_lines(run: Run) -> list[str]:
    d = run.data
    if not d:
        return []
    def counts(split: dict) -> str:
        return ", ".join(f"{task} {n}" for task, n in (split or {}).items())

    cap = (run.config.get("data") or {}).get("eval_per_task")
    used = f", evaluated on at most {cap} per task (data.eval_per_task)" if cap else ""
    return [f"- Data: train {counts(d.get('train'))}; held-out {counts(d.get('eval'))}{used}"]


def markdown(run: Run, pictures: list[Path]) -> str:
    cmd = " ".join(["python -m rookworld.train", *run.overrides])
    times = [r["time/step_s"] for r in run.train if "time/step_s" in r]
    speed = f", median {statistics.median(times):.3g} s per step" if times else ""
    out = [f"# Run report: {run.path.name}", "",
           f"- Run directory: `{run.path.resolve()}`", f"- Command: `{cmd}`",
           *[f"- Resumed: `{' '.join(['python -m rookworld.train', *r])}`" for r in run.resumes],
           *outcome_lines(run),
           f"- Logged: {len(run.train)} training steps, {len(run.evals)} evaluations{speed}",
           *data_lines(run), "",
           "## Config overrides", "", *overrides_section(run), "",
           *defaults_diff_section(run), "",
           "## Held-out greedy evaluation, before and after", "", *eval_table(run), "",
           "## Training metrics", "", *train_table(run), "",
           "## Plots", ""]
    out += [f"![{p.stem}]({p.name})" for p in pictures]
    out += ["", "## Sample completions", "", *examples_section(run)]
    return "\n".join(out).rstrip() + "\n"


def write_report(run_dir: Path, out: Path | None = None, dpi: int = 100) -> Path:
    """Write the plots and report.md; returns the report's path."""
    run = load_run(Path(run_dir))
    out = Path(out) if out else run.path / "report"
    out.mkdir(parents=True, exist_ok=True)
    status = run.outcome.get("status", "no outcome yet")
    pictures = [figure(OVERVIEW, run, out / "overview.png", ncols=3,
                       title=f"rookworld run {run.path.name}: {status}", dpi=dpi)]
    pictures += [figure(panels, run, out / name, dpi=dpi) for name, panels in FIGURES.items()]
    report = out / "report.md"
    report.write_text(markdown(run, pictures))
    return report


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(prog="python -m rookworld.report", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path, help="a training run (or multirun job) directory")
    ap.add_argument("--out", type=Path, default=None, help="output folder (RUN_DIR/report)")
    ap.add_argument("--dpi", type=int, default=100, help="resolution of the PNGs")
    args = ap.parse_args(argv)
    report = write_report(args.run_dir, args.out, args.dpi)
    print(f"[rookworld] report: {report} (plots beside it)")
    return report


if __name__ == "__main__":
    main()
