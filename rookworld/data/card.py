"""DATA_CARD.md for a generated data set: how it was made and what is in it."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import chess
from omegaconf import DictConfig, OmegaConf

from ..files import sha256_file

NOTES = "## Notes (hand-written, kept when the card is regenerated)"
_REWARD_NAMES = {"0.001": "legal", "1.0": "mate", "-1.0": "illegal"}


def outcome(sample) -> str:
    """legal / mate / illegal / draw:<rule> of an A sample's oracle truth."""
    name = _REWARD_NAMES.get(sample.truth.reward)
    if name:
        return name
    board = chess.Board(sample.truth.new_fen)
    rule = ("stalemate" if board.is_stalemate() else "material"
            if board.is_insufficient_material() else "75-move")
    return "draw:" + rule


def _table(title: str, counts: dict[str, Counter]) -> list[str]:
    cols = sorted({k for c in counts.values() for k in c})
    lines = [f"### {title}", "", "| split | " + " | ".join(cols) + " | total |",
             "|---" * (len(cols) + 2) + "|"]
    for split, c in counts.items():
        lines.append(f"| {split} | " + " | ".join(str(c[k]) for k in cols)
                     + f" | {sum(c.values())} |")
    return lines + [""]


def summary(splits: dict[str, list]) -> list[str]:
    """Markdown tables: counts per task x phase, A kinds, A oracle outcomes."""
    def count(task, key):
        return {s: Counter(key(x) for x in xs if x.task == task) for s, xs in splits.items()}
    kinds = any("kind" in x.meta for xs in splits.values() for x in xs if x.task == "P")
    return (_table("P samples per game phase", count("P", lambda x: x.meta["phase"]))
            + (_table("P samples per kind of position (p_kinds; any: drawn by phase)",
                      count("P", lambda x: x.meta.get("kind", "any"))) if kinds else [])
            + _table("A samples per game phase", count("A", lambda x: x.meta["phase"]))
            + _table("A samples per kind of move", count("A", lambda x: x.meta["kind"]))
            + _table("A samples per oracle outcome", count("A", outcome)))


def write_card(path: Path, cfg: DictConfig, splits: dict[str, list], limit_label: str,
               timing: dict, n_games: int) -> None:
    labelled, label_s = timing.get("labelled", 0), timing.get("label_s", 0.0)
    rate = f"{labelled / label_s:.1f}" if label_s > 0 and labelled else "n/a"
    lines = [
        "# RookWorld data", "",
        "Made by this project's generator (`rookworld/data/generate.py`):", "",
        "    python -m rookworld.data.generate " + " ".join(sys.argv[1:]), "",
        f"- P labels: `{limit_label}`, MultiPV {cfg.engine.multipv}, 1 thread per process, "
        f"{cfg.engine.processes} processes, hash cleared before every position; evals in "
        "pawns, side to move's view (mate = +-999.9x); moves listed in a random order; "
        "`B:` = argmax(E).",
        "- A labels: the python-chess oracle (`rookworld.chess_tasks.env_step`).",
        f"- Positions: {n_games} games (seed {cfg.seed}), each side mixing random legal "
        f"moves with Stockfish depth {list(cfg.style.mover_depths)} moves, the first "
        f"0-{cfg.style.random_opening_plies} plies random; P positions deduplicated on "
        "placement/side/castling/en passant.",
        f"- Split: eval = positions whose sha1(FEN without counters) < {cfg.eval_fraction} "
        "(`rookworld.data.splits`); no prompt position is in both splits (an A sample's "
        "answer FEN may be a prompt of the other split: the split is by position, not game).",
        "- Rows: `Sample.to_json()`, gzip JSON lines.", "",
        "## Counts", "", *summary(splits),
        "## Checksums", "",
        "sha256 of each file as written (gzip without a timestamp: a re-run with the same "
        "config, code and Stockfish writes the same bytes):", "",
        *(f"- {name}.jsonl.gz: `{sha256_file(path.parent / f'{name}.jsonl.gz')}`"
          for name in splits), "",
        "## Time (measured by this run)", "",
        f"- playing games: {timing['games_s']:.1f} s (0 when read from the cache)",
        f"- P labelling: {labelled} new positions in {label_s:.1f} s ({rate} positions/s); "
        f"{timing.get('cached', 0)} read from the cache"
        + (" (including the only-move candidates labelled and not chosen)"
           if _p_kinds_on(cfg) else ""),
        f"- whole run: {timing['total_s']:.1f} s", "",
        "Config:", "", "```yaml", OmegaConf.to_yaml(cfg).rstrip(), "```", ""]
    path.write_text("\n".join(lines) + _kept_notes(path))


def _p_kinds_on(cfg) -> bool:
    return bool(cfg.get("p_kinds") and cfg.p_kinds.get("only_move"))


def _kept_notes(path: Path) -> str:
    """The hand-written `## Notes` section of an existing card, kept on regeneration."""
    if not path.exists():
        return ""
    text = path.read_text()
    i = text.find(NOTES)
    return "\n" + text[i:] if i >= 0 else ""
