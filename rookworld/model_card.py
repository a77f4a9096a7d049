"""The embedded model's card and compute curve, written from what `pretrain` measured;
`python -m rookworld.model_card` writes a later strength evaluation into a card."""

from __future__ import annotations

import json
import platform
from pathlib import Path

from .held_out import INTERVAL_NOTE, interval, n_key, with_interval
from .strength.stats import wilson
from .strength.suite import MEANS

P_KEYS = ("format", "legal", "best_legal", "best", "top5", "eval_error")
A_KEYS = ("format", "exact", "fen_exact", "fen_similarity", "flags")
CURVE_KEYS = (("P", "format"), ("P", "best_legal"), ("P", "legal"), ("P", "top5"),
              ("A", "format"), ("A", "fen_exact"), ("A", "flags"))
# the strength suite's measures (docs/strength.md) the card reports, in this order
STRENGTH_KEYS = ("puzzles_first", "puzzles_line", "puzzles_illegal", "random_score",
                 "random_illegal_loss", "engine_score", "engine_illegal_loss", "engine_elo",
                 "selfplay_plies", "selfplay_plies_median", "acpl", "blunder", "acpl_illegal")


def _table(metrics: dict) -> str:
    rows = ["| metric | value |", "|---|---|"]
    for task, keys in (("P", P_KEYS), ("A", A_KEYS)):
        for k in keys:
            key = f"eval/{task}/{k}"
            if key in metrics:
                rows.append(f"| {task} {k} | {with_interval(metrics, key)} |")
    return "\n".join(rows)


def _strength_cell(metrics: dict, name: str, key: str) -> str:
    """A share or game score with its Wilson interval (honest at 0 of 40), else the mean
    with its standard-error interval."""
    n = metrics.get(n_key(key))
    if name not in MEANS and n:
        lo, hi = wilson(metrics[key] * n, n)
        return f"{metrics[key]:.3f} [{lo:.3f}, {hi:.3f}]"
    return with_interval(metrics, key)


def _strength_table(metrics: dict) -> str:
    rows = ["| measure | free (the model's own move) | masked (legal moves only) |",
            "|---|---|---|"]
    for k in STRENGTH_KEYS:
        cells = [_strength_cell(metrics, k, key) if (key := f"eval/strength/{k}{suffix}")
                 in metrics else "-" for suffix in ("", "_masked")]
        if cells != ["-", "-"]:
            rows.append(f"| {k} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _counts(metrics: dict) -> str:
    return ", ".join(f"{t} {metrics[f'eval_n/{t}']}" for t in "PA" if f"eval_n/{t}" in metrics)


def host() -> str:
    """'<CPU model>, <n> cores' from /proc/cpuinfo where it exists."""
    import os
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} cores"


def code_commit() -> str | None:
    """The commit of the checkout this package runs from (with "+changes" when its tracked
    files differ from it), or None outside a git checkout: the code a stage trained with."""
    import subprocess
    root = Path(__file__).resolve().parent.parent
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()

    try:
        top, head = git("rev-parse", "--show-toplevel", "--short", "HEAD").splitlines()
        if Path(top).resolve() != root:  # installed inside another repository
            return None
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return head + ("+changes" if dirty else "")


def plot_curve(rows: list[dict], out: Path, stage_ends: list[int] = ()) -> Path | None:
    """Greedy held-out metrics against samples seen, with ~95% intervals (PNG); a dotted
    line where one pretraining stage ended and the next began."""
    if not rows:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    x = [r["samples"] for r in rows]
    for task, part in CURVE_KEYS:
        key = f"eval/{task}/{part}"
        if key not in rows[-1]:
            continue
        y = [r.get(key, float("nan")) for r in rows]
        err = [interval(r, key) or 0.0 for r in rows]
        ax.errorbar(x, y, yerr=err, marker="o", ms=3, capsize=2, label=f"{task} {part}")
    for end in stage_ends:
        ax.axvline(end, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("training samples seen")
    ax.set_ylabel("greedy held-out share")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    ax.set_title("embedded model: held-out metrics against pretraining compute")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


# the strength measures a compute curve shows, when its rows carry them
CURVE_STRENGTH = ("puzzles_first", "puzzles_illegal", "selfplay_plies", "acpl")


def curve_table(rows: list[dict]) -> str:
    """A compute curve as a markdown table: greedy held-out shares with t intervals,
    and the strength measures the rows carry (shares with Wilson intervals)."""
    keys = ["eval/P/best_legal", "eval/P/legal", "eval/A/format", "eval/A/fen_exact"]
    names = ["P best_legal", "P legal", "A format", "A fen_exact"]
    strength = [k for k in CURVE_STRENGTH if any(f"eval/strength/{k}" in r for r in rows)]
    keys += [f"eval/strength/{k}" for k in strength]
    names += strength
    lines = ["| stage | step | samples | training min | " + " | ".join(names) + " |",
             "|---" * (4 + len(names)) + "|"]
    for r in rows:
        cells = [(_strength_cell(r, k.rsplit("/", 1)[1], k) if k.startswith("eval/strength/")
                  else with_interval(r, k)) if k in r else "" for k in keys]
        lines.append(f"| {r.get('stage', 1)} | {r['step']} | {r['samples']:,} | "
                     f"{r['train_minutes']:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _where(stage: dict) -> str:
    """The CPU host, and the GPU when the stage trained on one."""
    where = stage.get("host") or "a CPU"
    gpu = stage.get("device")
    return f"{gpu} (host {where})" if gpu and gpu != "cpu" else where


def _data(stage: dict) -> str:
    """What a stage trained on: the file, its size and checksum, and how it was made."""
    d = stage.get("data")
    if not d:
        return ""
    text = (f"\n\n   Data: `{d['path']}`, {d['samples']:,} samples, sha256 "
            f"`{d['sha256'][:16]}`")
    if d.get("made_by"):
        text += f", made by\n\n       {d['made_by']}"
    return text


def _code(stage: dict) -> str:
    """The code a stage trained with: its commit, recorded by `pretrain`; for a stage from
    before that record, the commit that added it to the model's lineage (training.json)."""
    if stage.get("commit"):
        return f", code of commit {stage['commit']}"
    if stage.get("recorded_in"):
        return f", recorded in commit {stage['recorded_in']}"
    return ""


def _stages(stages: list[dict]) -> str:
    parts = []
    for s in stages:
        parts.append(f"{s['stage']}. From {s.get('start', 'random weights')}: "
                     f"{s['steps']} steps, {s['samples']:,} samples, "
                     f"{s['minutes']:.1f} training minutes on {_where(s)}, "
                     f"torch {s.get('torch') or '?'}, {s.get('threads') or '?'} "
                     f"thread{'' if s.get('threads') == 1 else 's'}{_code(s)}:\n\n"
                     f"       {s['command']}" + _data(s))
    return "\n\n".join(parts)


def architecture(config, parameters: int) -> str:
    """'A character-level GPT-2 (4 layers, 256 wide, 4 heads, ... positions)' from a model's
    config: GPT-2's names or transformers' common ones (a Llama or Qwen2 exported too)."""
    def first(*names):
        return next((getattr(config, n) for n in names if getattr(config, n, None)), "?")
    kind = getattr(config, "model_type", None) or "gpt2"
    name = "GPT-2" if kind == "gpt2" else f"{kind} model"
    char = "character-level " if (getattr(config, "vocab_size", None) or 1 << 30) <= 256 else ""
    return (f"A {char}{name} ({first('n_layer', 'num_hidden_layers')} layers, "
            f"{first('n_embd', 'hidden_size')} wide, {first('n_head', 'num_attention_heads')} "
            f"heads, {parameters:,} parameters, "
            f"{first('n_positions', 'max_position_embeddings')} positions)")


STRENGTH_NOTE = ("shares and game scores carry Wilson ~95% intervals, other means ± Student's "
                 "t standard errors over the games or positions (3.18 over 4, 1.97 over 500)")


def strength_section(metrics: dict, source: str) -> str:
    """The card's playing-strength section: the suite's measures (`eval/strength/...`,
    as `StrengthSuite` returns them) with intervals, after `source`, a sentence saying
    how and where they were measured."""
    return (f"{source} The strength suite: `rookworld.strength`, docs/strength.md; "
            f"{STRENGTH_NOTE}.\n\n{_strength_table(metrics)}")


def _strength_section(report: dict) -> str:
    """The strength suite's measures of the final model (`strength=` of the last stage)."""
    if "strength" not in report:
        return ("not measured when the model was made (`strength=none`); `python -m "
                "rookworld.evaluate suite=strength` measures it (docs/strength.md)")
    return strength_section(report["strength"],
                            "Measured at the end of the last stage, at its `strength` sizes.")


def replace_section(card: str, head: str, section: str) -> str:
    """The card with the body of its section headed `head` (a whole '## ...' line)
    replaced, or the section inserted before '## Compute curve' when the card has none."""
    lines = card.splitlines(keepends=True)
    at = next((i for i, line in enumerate(lines) if line.rstrip("\n") == head), None)
    if at is not None:
        end = next((j for j in range(at + 1, len(lines)) if lines[j].startswith("## ")),
                   len(lines))
    else:
        at = end = next((i for i, line in enumerate(lines)
                         if line.rstrip("\n") == "## Compute curve"), None)
        if at is None:
            raise ValueError(f"the card has neither a '{head}' nor a '## Compute curve' "
                             "section to place one before")
    return "".join(lines[:at]) + f"{head}\n\n{section}\n\n" + "".join(lines[end:])


def replace_strength_section(card: str, section: str) -> str:
    """The card with its '## Playing strength' section's body replaced (inserted before
    '## Compute curve' when the card has none)."""
    return replace_section(card, "## Playing strength", section)


STRENGTH_CURVE = "## Strength against pretraining compute"  # the card's section of a curve


def strength_curve_section(rows: list[dict], source: str) -> str:
    """The card's section of a strength curve (`curve.jsonl` rows of `pretrain
    strength=fast|full`, or of several runs joined): `source`, then the table."""
    return f"{source} {STRENGTH_NOTE[0].upper()}{STRENGTH_NOTE[1:]}.\n\n{curve_table(rows)}"


def _evaluate_again(per_task: int) -> str:
    """The command that measures the card's held-out and external figures again."""
    split = "" if not per_task else f"'s first {per_task} samples per task"
    return (f"`python -m rookworld.evaluate model.path=<this directory> "
            f"data.eval_per_task={per_task}` (the held-out split{split}, and rook_val_500 "
            "when present)")


def model_card(cfg, arch, report: dict, lineage: dict, curve_png: str | None = None) -> str:
    """The model card: how the model was made (every stage of its lineage), its greedy
    held-out and external metrics with intervals, and its compute curve.
    arch: the model's config (`architecture` describes it)."""
    ev = report["eval"]
    ext = ev.get("external")
    per_task = getattr(getattr(cfg, "data", None), "eval_per_task", 0)  # the figures' samples
    curve = lineage["curve"]
    total = lineage["stages"][-1]
    curve_md = "no curve was recorded (`curve_every=0`)"
    if curve:
        curve_md = ("Greedy metrics on the first held-out samples per task "
                    f"({cfg.curve_per_task} in the last stage), against samples seen over all "
                    "stages:\n\n"
                    + (f"![compute curve]({curve_png})\n\n" if curve_png else "")
                    + curve_table(curve))
    return f"""# rookworld embedded model

{architecture(arch, report['parameters'])} trained by this project with
`python -m rookworld.pretrain` on data from its own generator (`rookworld.data.generate`;
each stage below names its training file and the command it was run with): next-token
loss on completions only, both tasks (P and A), exact RookWorld text formats
(docs/formats.md). It stands in for RookWorld-LM-124M when no hub
is reachable.

## How it was made

{_stages(lineage["stages"])}

In all: {sum(s["samples"] for s in lineage["stages"]):,} samples and
{sum(s["minutes"] for s in lineage["stages"]):.1f} training minutes. A stage that starts from
`model=embedded` continued the shipped weights of its time (the stage before's) with a fresh
optimiser and schedule; to run a stage again, point `model.path=` at the stage before's export,
and add `replace_shipped=true` where it exports to rookworld/assets/model (pretrain refuses to
replace the shipped model without it);
`training.json` beside the weights records every stage and the whole curve. A stage stops at
`max_minutes`, so on a busy machine it ends before its schedule does (the last stage ran
{total['steps']} of {cfg.steps} scheduled steps). Batches are a function of (seed, step), so
`resume=true` continues a stage exactly.

Greedy decoding is deterministic: {_evaluate_again(per_task)} prints the figures below
again.

## Greedy metrics on the held-out split ({_counts(ev['held_out'])} samples)

{INTERVAL_NOTE}.

{_table(ev['held_out'])}

## Greedy metrics on rook_val_500 (external P-task set, 30 s Stockfish labels, \
`B:` relabelled as argmax(E))

{_table(ext) if ext else 'not measured (`data.external_eval` unset, or its file absent)'}

## Playing strength

{_strength_section(report)}

## Compute curve

{curve_md}

Metric meanings (docs/formats.md): format = completion well-formed; legal = share of the
distinct listed moves that are legal; best_legal = best move legal; best = best move equals
the engine's; top5 = |listed and engine moves| / max(|listed|, |engine moves|); eval_error =
mean absolute eval error in pawns on matched moves (capped); A exact = whole completion
equals the oracle's; fen_exact = next FEN exact; fen_similarity = (share of squares right +
share of the 5 other FEN fields right) / 2; flags = terminated and truncated both right.
"""


def _read_curve(path: Path) -> list[dict]:
    """The rows of a curve file (one JSON object a line)."""
    try:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as e:
        raise SystemExit(f"model_card: {path}: not a curve file (one JSON row a line, as "
                         f"`pretrain` writes curve.jsonl): {e}") from None
    if not rows or not all(isinstance(r, dict) and {"step", "samples", "train_minutes"} <= r.keys()
                           for r in rows):
        raise SystemExit(f"model_card: {path}: not a curve file: every row needs step, "
                         "samples and train_minutes")
    return rows


def main(argv: list[str] | None = None) -> None:
    """Write a strength evaluation (`python -m rookworld.evaluate suite=strength out=F`)
    into a model card's '## Playing strength' section, or, with --curve, a curve of the
    strength measures against pretraining compute into its own section."""
    import argparse

    from .files import atomic_write_text
    ap = argparse.ArgumentParser(prog="python -m rookworld.model_card", description=main.__doc__)
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("evaluation", type=Path, nargs="?",
                      help="the JSON that `evaluate out=F` wrote")
    what.add_argument("--curve", type=Path,
                      help="a curve file (rows of `pretrain`'s curve.jsonl with strength "
                           "measures) for the section " + repr(STRENGTH_CURVE[3:]))
    card = Path(__file__).parent / "assets" / "model" / "MODEL_CARD.md"
    ap.add_argument("--card", type=Path, default=card,
                    help="the card to update (default: the embedded model's)")
    ap.add_argument("--source", required=True,
                    help="one sentence: the command, code commit and host that measured it")
    args = ap.parse_args(argv)
    if args.curve is not None:
        head, body = STRENGTH_CURVE, strength_curve_section(_read_curve(args.curve), args.source)
    else:
        try:
            metrics = json.loads(args.evaluation.read_text())["strength"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SystemExit(f"model_card: {args.evaluation} holds no strength evaluation "
                             f"(`evaluate suite=strength out=F` writes one): {e}") from None
        head, body = "## Playing strength", strength_section(metrics, args.source)
    try:
        atomic_write_text(args.card, replace_section(args.card.read_text(), head, body))
    except (OSError, ValueError) as e:
        raise SystemExit(f"model_card: {args.card}: {e}") from None
    print(f"[rookworld] wrote the section '{head[3:]}' of {args.card}")


if __name__ == "__main__":
    main()
