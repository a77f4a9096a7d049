"""The embedded model's card, written from what `pretrain` measured."""

from __future__ import annotations

from omegaconf import OmegaConf

P_KEYS = ("format", "legal", "best_legal", "best", "top5", "eval_error")
A_KEYS = ("format", "exact", "fen_exact", "fen_similarity", "flags")


def _table(metrics: dict) -> str:
    rows = ["| metric | value |", "|---|---|"]
    for task, keys in (("P", P_KEYS), ("A", A_KEYS)):
        for k in keys:
            key = f"eval/{task}/{k}"
            if key in metrics:
                rows.append(f"| {task} {k} | {metrics[key]:.3f} |")
    return "\n".join(rows)


def model_card(cfg, report: dict) -> str:
    overrides = OmegaConf.to_container(cfg, resolve=False)
    m = cfg.model
    ev = report["eval"]
    ext = ev.get("external")
    return f"""# rookworld embedded model

A character-level GPT-2 ({m.n_layer} layers, {m.n_embd} wide, {m.n_head} heads,
{report['parameters']:,} parameters, {m.n_positions} positions) trained by this project with
`python -m rookworld.pretrain` on its own bundled data (rookworld/assets/data, see DATA_CARD.md):
next-token loss on completions only, both tasks (P and A), exact RookWorld text formats.
It stands in for RookWorld-LM-124M when no hub is reachable.

## How it was made

    python -m rookworld.pretrain export_to=rookworld/assets/model \\
        steps={cfg.steps} max_minutes={cfg.max_minutes} batch_size={cfg.batch_size} lr={cfg.lr} seed={cfg.seed}

Trained for {report['steps']} of {cfg.steps} scheduled steps ({report['samples_seen']:,} samples,
{report['minutes']:.1f} minutes on a 2-core CPU shared with other jobs; the run stops at
`max_minutes`, so on a busy machine it ends before the schedule does). Batches are a
function of (seed, step), so `resume=true` continues exactly. Model config:
`{overrides.get('model')}`.

Greedy decoding is deterministic: `python -m rookworld.evaluate` (defaults: this model,
{cfg.eval_per_task} held-out samples per task, and rook_val_500 when present) prints the
figures below again.

## Greedy metrics on the held-out split ({cfg.eval_per_task} samples per task)

{_table(ev['held_out'])}

## Greedy metrics on rook_val_500 (external P-task set, 30 s Stockfish labels, `B:` relabelled as argmax(E))

{_table(ext) if ext else 'not measured (file not found when the model was made)'}

Metric meanings: format = completion well-formed; legal = share of listed moves legal;
best_legal = best move legal; best = best move equals the engine's; top5 = share of listed
moves among the engine's top 5; eval_error = mean absolute eval error in pawns on matched
moves (capped); A exact = whole completion equals the oracle's; fen_exact = next FEN exact;
fen_similarity = per-square agreement; flags = terminated and truncated both right.
"""
