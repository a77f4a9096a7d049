"""The report's PNGs: objective and outcome against each searched parameter, and the
KL the guard watched over steps for successful vs failed runs."""

from __future__ import annotations

import json
import random
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import yaml  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from ..guards import OUTCOMES  # noqa: E402

COLORS = {"success": "tab:green", "mixed": "tab:blue", "kl_failure": "tab:red",
          "nan_failure": "tab:orange", "error": "tab:gray", "no record": "black"}
KL_LINTHRESH = 1e-4  # KL below this is drawn on a linear scale (step 0's KL is exactly 0)


def _x(values: list, scale: str) -> tuple[list[float], list | None]:
    """Plot positions for parameter values; categorical strings become 0..k-1."""
    if scale == "categorical" and not all(isinstance(v, int | float) for v in values):
        cats = sorted(set(map(str, values)))
        return [cats.index(str(v)) for v in values], cats
    return [float(v) for v in values], None


def _axis(ax, name: str, scale: str, cats: list | None, values: list[float]) -> None:
    ax.set_xlabel(name)
    if scale == "log":
        ax.set_xscale("log")
    if cats is not None:
        ax.set_xticks(range(len(cats)), cats)
    elif scale == "categorical":
        ax.set_xticks(sorted(set(values)))
    ax.grid(alpha=0.3)


def plot_params(rows, names: list[str], scales: dict, path: Path) -> Path | None:
    """Top row: each trial's objective against each parameter, coloured by its outcome
    (mixed = some replicas succeeded). Bottom row: every replica's outcome."""
    if not names:
        return None
    jitter = random.Random(0)
    fig, axes = plt.subplots(2, len(names), figsize=(max(4.2 * len(names), 7), 7),
                             squeeze=False)
    for j, name in enumerate(names):
        done = [r for r in rows if name in r.params and r.value is not None]
        xs, cats = _x([r.params[name] for r in done], scales.get(name, "linear"))
        ax = axes[0][j]
        for x, r in zip(xs, done, strict=True):
            ax.scatter(x, r.value, color=COLORS[r.label], s=45, edgecolor="black", lw=0.4,
                       label=r.label)
        _axis(ax, name, scales.get(name, "linear"), cats, xs)
        ax.set_ylabel("objective (one dot per trial)" if j == 0 else "")
        ax = axes[1][j]
        for x, r in zip(xs, done, strict=True):
            for o in r.outcomes:
                ax.scatter(x, OUTCOMES.index(o) + jitter.uniform(-0.15, 0.15), s=30,
                           color=COLORS[o], edgecolor="black", lw=0.3)
        ax.set_yticks(range(len(OUTCOMES)), OUTCOMES if j == 0 else [""] * len(OUTCOMES))
        ax.set_ylim(-0.5, len(OUTCOMES) - 0.5)
        ax.set_ylabel("outcome (one dot per replica)" if j == 0 else "")
        _axis(ax, name, scales.get(name, "linear"), cats, xs)
    handles = {h.get_label(): h for ax in axes[0] for h in ax.collections}
    fig.legend(handles.values(), handles.keys(), loc="upper center", ncol=len(handles),
               title="trial outcome (mixed: some replicas succeeded)", frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.88))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def read_kl(run_dir, metric: str) -> tuple[list[int], list[float]]:
    """(steps, values) of `metric` from a run's metrics.jsonl (empty if absent)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return [], []
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    pts = [(r["step"], r[metric]) for r in rows if metric in r]
    return [s for s, _ in pts], [v for _, v in pts]


def guard_settings(run_dir) -> tuple[str, float | None]:
    """(KL metric the guard watched, its threshold) from the trial's saved Hydra config."""
    cfg_path = Path(run_dir or "") / ".hydra" / "config.yaml"
    if run_dir and cfg_path.exists():
        g = (yaml.safe_load(cfg_path.read_text()).get("guard") or {}).get("kl") or {}
        return f"kl/{g.get('estimator', 'k3')}", g.get("threshold")
    return "kl/k3", None


def plot_kl(rows, path: Path) -> Path | None:
    """Left: successful runs, right: failed ones; one line per replica, the guard's
    threshold dashed, a cross where a failed run stopped."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6), sharey=True)
    drawn, thresholds, metrics, low = 0, set(), set(), 0.0
    for r in rows:
        metric, threshold = guard_settings(r.run_dir)
        for rep in r.replicas:
            steps, kl = read_kl(rep["run_dir"], metric)
            if not steps:
                continue
            ok = rep["status"] == "success"
            ax = axes[0 if ok else 1]
            ax.plot(steps, kl, color=COLORS[rep["status"]], alpha=0.7, lw=1.3)
            if not ok:
                ax.scatter(steps[-1], kl[-1], marker="x", color=COLORS[rep["status"]], s=40)
            drawn, metrics, low = drawn + 1, metrics | {metric}, min(low, *kl)
            if threshold is not None:
                thresholds.add(float(threshold))
    if not drawn:
        plt.close(fig)
        return None
    for ax, title in zip(axes, ("successful runs", "failed runs (x = stopped)"), strict=True):
        for t in thresholds:
            ax.axhline(t, color="black", ls="--", lw=1)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_yscale("symlog", linthresh=KL_LINTHRESH)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    axes[0].set_ylim(bottom=low)
    axes[0].set_ylabel(f"{' / '.join(sorted(metrics))} (nats/token; dashed = guard threshold)")
    handles = [plt.Line2D([], [], color=COLORS[o], label=o) for o in OUTCOMES]
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
