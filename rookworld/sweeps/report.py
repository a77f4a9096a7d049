"""Study summary from the Optuna storage and the trials' run directories.

    python -m rookworld.sweeps.report multirun/<study>                 (its optuna.db)
    python -m rookworld.sweeps.report --storage URL --study NAME [--out DIR]

Writes report.md, params.png (objective and outcome against each searched
parameter) and kl.png (the guard's KL estimator over steps, successful vs
failed runs, read from each replica's metrics.jsonl) into the study directory
(or --out) and prints the Markdown.
"""

from __future__ import annotations

import argparse
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import optuna

from ..guards import OUTCOMES
from .storage import open_storage
from .trial import TRIAL_KEY


@dataclass
class TrialRow:
    """One Optuna trial with what its job recorded (empty outcomes if it recorded nothing)."""

    number: int
    state: str
    params: dict
    value: float | None
    outcomes: list[str] = field(default_factory=list)
    replicas: list[dict] = field(default_factory=list)
    run_dir: str | None = None
    reason: str = ""  # why a FAIL trial failed (its job's `reason`, or Optuna's fail_reason)
    enqueued: bool = False  # its settings were queued (sweep.enqueue), not drawn by the sampler

    @property
    def label(self) -> str:
        """success | mixed | the common failure | no record: the trial's colour in plots."""
        if not self.outcomes:
            return "no record"
        kinds = set(self.outcomes)
        if kinds == {"success"}:
            return "success"
        if "success" in kinds:
            return "mixed"
        return Counter(self.outcomes).most_common(1)[0][0]

    def rate(self, status: str) -> float | None:
        return self.outcomes.count(status) / len(self.outcomes) if self.outcomes else None


def load_rows(study: optuna.Study) -> list[TrialRow]:
    rows = []
    for t in study.get_trials(deepcopy=False):
        a = t.user_attrs
        rows.append(TrialRow(
            number=t.number, state=t.state.name, value=t.value,
            params={k: v for k, v in t.params.items() if k != TRIAL_KEY},
            outcomes=list(a.get("outcomes", [])), replicas=list(a.get("replicas", [])),
            run_dir=a.get("run_dir"),
            reason=str(a.get("reason") or t.system_attrs.get("fail_reason") or ""),
            enqueued="fixed_params" in t.system_attrs))
    return rows


def study_rates(rows: list[TrialRow]) -> dict:
    """Outcome counts and shares pooled over every replica of the study's COMPLETE trials
    (a FAIL trial measured nothing; it is reported apart)."""
    counts = Counter(o for r in rows if r.state == "COMPLETE" for o in r.outcomes)
    n = sum(counts.values())
    return {"replicas": n, **{s: counts[s] for s in OUTCOMES},
            **{f"{s}_rate": counts[s] / n if n else float("nan") for s in OUTCOMES}}


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.3g}"
    return str(v)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _obj(v: float | None) -> str:
    return "" if v is None else f"{v:.4f}"


def _pct(x: float | None) -> str:
    return "" if x is None or math.isnan(x) else f"{100 * x:.0f}%"


def trial_table(rows: list[TrialRow], names: list[str]) -> str:
    head = ["trial", "state", *names, *OUTCOMES, "success rate", "KL-failure rate",
            "objective"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        number = f"{r.number} (queued)" if r.enqueued else str(r.number)
        cells = [number, r.state, *(_fmt(r.params.get(n)) for n in names),
                 *(str(r.outcomes.count(s)) if r.outcomes else "" for s in OUTCOMES),
                 _pct(r.rate("success")), _pct(r.rate("kl_failure")), _obj(r.value)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def failed_trials_table(rows: list[TrialRow], max_reason: int = 160) -> str:
    lines = ["| trial | state | reason |", "|---|---|---|"]
    for r in rows:
        if r.state != "COMPLETE":
            reason = (r.reason or "no reason recorded").replace("|", "/").replace("\n", " ")
            lines.append(f"| {r.number} | {r.state} | {reason[:max_reason]} |")
    return "\n".join(lines) if len(lines) > 2 else "None: every trial completed."


def failure_table(rows: list[TrialRow], max_reason: int = 110) -> str:
    lines = ["| trial | seed | outcome | step | reason |", "|---|---|---|---|---|"]
    for r in rows:
        if r.state != "COMPLETE":
            continue
        for rep in r.replicas:
            if rep["status"] != "success":
                reason = rep["reason"].replace("|", "/").replace("\n", " ")[:max_reason]
                lines.append(f"| {r.number} | {rep['seed']} | {rep['status']} | "
                             f"{rep['step']} | {reason} |")
    return "\n".join(lines) if len(lines) > 2 else "No failed replicas."


def markdown(name: str, storage: str, rows: list[TrialRow], best: TrialRow | None,
             names: list[str], plots: list[str]) -> str:
    rates = study_rates(rows)
    states = Counter(r.state for r in rows)
    out = [f"# Sweep report: {name}", "",
           f"Storage: `{storage}`; {len(rows)} trials ("
           + ", ".join(f"{k.lower()} {v}" for k, v in sorted(states.items())) + f"); "
           f"{rates['replicas']} replica runs of complete trials.", "",
           f"**Study success rate {_pct(rates['success_rate'])}** "
           f"({rates['success']}/{rates['replicas']} runs), "
           f"**KL-failure rate {_pct(rates['kl_failure_rate'])}** ({rates['kl_failure']}), "
           f"NaN-failure rate {_pct(rates['nan_failure_rate'])} ({rates['nan_failure']}); "
           f"{_count(states['FAIL'], 'trial')} failed (an error or a dead process: listed "
           "below, not in these rates)"
           + "".join(f"; {_count(states[k], 'trial')} {k.lower()}" for k in ("RUNNING", "WAITING")
                     if states[k]) + ".", ""]
    if best:
        params = ", ".join(f"{k}={_fmt(v)}" for k, v in best.params.items())
        out += [f"Best trial: #{best.number}, objective {_obj(best.value)} "
                f"(outcomes {best.outcomes}): {params}; run directory `{best.run_dir}`.", ""]
    queued = [r for r in rows if r.enqueued and r.state == "COMPLETE"]
    if queued:
        out += ["Queued settings (sweep.enqueue), the reference drawn trials are measured "
                "against: " + "; ".join(f"#{r.number} objective {_obj(r.value)}" for r in queued)
                + ".", ""]
    out += ["## Trials", "", trial_table(rows, names), "",
            "## Trials that did not complete", "",
            "Not counted in the rates above (they measured nothing): a setting that could "
            "not run, a crash, or a process that died.", "", failed_trials_table(rows), "",
            "## Failed runs of complete trials", "", failure_table(rows), ""]
    if plots:
        out += ["## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots] + [""]
    return "\n".join(out)


def best_row(study: optuna.Study, rows: list[TrialRow]) -> TrialRow | None:
    if not any(r.state == "COMPLETE" for r in rows):
        return None
    return next(r for r in rows if r.number == study.best_trial.number)


def param_scales(study: optuna.Study, names: list[str]) -> dict[str, str]:
    """name -> 'log' | 'linear' | 'categorical', from the trials' distributions."""
    scales = {}
    for t in study.get_trials(deepcopy=False):
        for n, d in t.distributions.items():
            if n in names and n not in scales:
                scales[n] = ("categorical" if isinstance(d, optuna.distributions.
                                                         CategoricalDistribution)
                             else "log" if getattr(d, "log", False) else "linear")
    return scales


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("study_dir", nargs="?", help="a sweep directory holding optuna.db")
    ap.add_argument("--storage", help="SQLAlchemy URL of the study storage")
    ap.add_argument("--study", help="study name (default: the only study in the storage)")
    ap.add_argument("--out", help="where to write report.md and the PNGs")
    args = ap.parse_args(argv)
    if not args.storage and not args.study_dir:
        ap.error("give a study directory or --storage")
    storage = args.storage or f"sqlite:///{Path(args.study_dir).resolve() / 'optuna.db'}"
    if not args.storage and not (Path(args.study_dir) / "optuna.db").exists():
        ap.error(f"{args.study_dir}/optuna.db not found; pass --storage URL --study NAME")
    names = [s.study_name for s in open_storage(storage).get_all_studies()]
    name = args.study or (names[0] if len(names) == 1 else None)
    if name is None:
        ap.error(f"the storage holds studies {names}; pick one with --study")
    study = optuna.load_study(study_name=name, storage=open_storage(storage))
    out = Path(args.out or args.study_dir or Path("multirun") / name)
    out.mkdir(parents=True, exist_ok=True)
    from .plots import plot_kl, plot_params  # matplotlib only when writing a report

    rows = load_rows(study)
    params = list(dict.fromkeys(k for r in rows for k in r.params))
    plots = [plot_params(rows, params, param_scales(study, params), out / "params.png"),
             plot_kl(rows, out / "kl.png")]
    text = markdown(name, storage, rows, best_row(study, rows), params,
                    [str(p) for p in plots if p])
    (out / "report.md").write_text(text)
    print(text)
    return text


if __name__ == "__main__":
    main()
