"""`python -m rookworld.data.generate`: play games, pick positions, label, write.

    python -m rookworld.data.generate         # the bundled data's settings, into outputs/data
    python -m rookworld.data.generate out_dir=/tmp/d counts.train.P=2000 engine.depth=12

Writes `train.jsonl.gz` and `eval.jsonl.gz` (rows of `Sample.to_json()`) and
`DATA_CARD.md` into `out_dir`. Games and engine labels are cached under
`cache_dir`, so a re-run with the same arguments replays nothing and labels
only positions it has not labelled at this limit yet. Deterministic for a seed.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import time
from pathlib import Path

import hydra
from hydra.utils import to_absolute_path
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from rookworld.chess_tasks.policy import MAX_MOVES
from rookworld.chess_tasks.stockfish_pool import Analysis, EnginePool
from rookworld.errors import ConfigError, check_not_shipped

from .card import write_card
from .games import GameStyle, play_games
from .positions import Position, game_positions
from .select import (
    check_a_kinds,
    check_p_kinds,
    env_samples,
    policy_positions,
    policy_samples,
)
from .splits import split_of

SHIPPED_DATA = Path(__file__).parents[1] / "assets" / "data"  # the bundled splits default runs read


def _digest(*parts) -> str:
    return hashlib.sha1(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


def load_or_play(cfg: DictConfig, cache: Path) -> list[list[str]]:
    style = GameStyle(**{k: tuple(v) if isinstance(v, list) else v
                         for k, v in OmegaConf.to_container(cfg.style).items()})
    path = cache / f"games-{_digest(cfg.seed, cfg.n_games, style, cfg.engine.path)}.json.gz"
    if path.exists():
        return json.loads(gzip.decompress(path.read_bytes()))
    games = play_games(cfg.seed, cfg.n_games, style, cfg.workers, cfg.engine.path, cfg.progress)
    path.write_bytes(gzip.compress(json.dumps(games).encode(), mtime=0))
    return games


def label(fens: list[str], pool: EnginePool, cache: Path, progress: bool,
          timing: dict) -> dict[str, Analysis]:
    """FEN -> Analysis, reading and appending `labels-<limit>.jsonl` under cache;
    adds the count and seconds of new analyses to timing["labelled"/"label_s"] and
    the count read from the cache to timing["cached"]."""
    path = cache / f"labels-{pool.limit_label.replace(' ', '_')}-multipv={pool.multipv}.jsonl"
    done = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            r = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by an interrupted run
            continue
        done[r["fen"]] = Analysis(tuple(r["moves"]), tuple(r["evals"]), r["label"])
    todo = [f for f in dict.fromkeys(fens) if f not in done]
    t0 = time.perf_counter()
    bar = tqdm(total=len(todo), desc=f"label ({pool.limit_label})", disable=not progress)
    with path.open("a") as fh, bar:
        if path.stat().st_size and not path.read_bytes().endswith(b"\n"):
            fh.write("\n")  # end a line an interrupted run left open
        for i in range(0, len(todo), 256):  # flushed per chunk: an interrupted run resumes
            chunk = todo[i:i + 256]
            for fen, a in zip(chunk, pool.analyse_many(chunk), strict=True):
                done[fen] = a
                fh.write(json.dumps({"fen": fen, "moves": a.moves, "evals": a.evals,
                                     "label": a.label}) + "\n")
            fh.flush()
            bar.update(len(chunk))
    timing["labelled"] = timing.get("labelled", 0) + len(todo)
    timing["cached"] = timing.get("cached", 0) + len(set(fens)) - len(todo)
    timing["label_s"] = timing.get("label_s", 0.0) + time.perf_counter() - t0
    return done


def build_split(split: str, positions: list[Position], labels_for, cfg, rng) -> list:
    counts = cfg.counts[split]
    shares = OmegaConf.to_container(cfg.phase_shares)
    mine = [p for p in positions if split_of(p.fen, cfg.eval_fraction) == split]
    seen, fresh = set(), []
    for p in mine:  # first occurrence of each position that still has a move to play
        if p.played and p.key not in seen:
            seen.add(p.key)
            fresh.append(p)
    chosen, kind_of = policy_positions(fresh, counts.P, shares, _p_kinds(cfg),
                                       cfg.get("only_move_gap", 1.0), labels_for, rng)
    labels = labels_for([p.fen for p in chosen])
    samples = policy_samples(chosen, labels, cfg.seed, kind_of)
    samples += env_samples(mine, counts.A, OmegaConf.to_container(cfg.a_kinds), shares, rng)
    rng.shuffle(samples)
    return samples


def _p_kinds(cfg) -> dict:
    return OmegaConf.to_container(cfg.p_kinds) if cfg.get("p_kinds") else {}


def write_jsonl_gz(path: Path, samples) -> None:
    lines = "".join(json.dumps(s.to_json()) + "\n" for s in samples)
    path.write_bytes(gzip.compress(lines.encode(), mtime=0))


def run(cfg: DictConfig) -> dict:
    if not 1 <= cfg.engine.multipv <= MAX_MOVES:  # the M: field holds the engine's lines
        raise ValueError(f"engine.multipv must lie in 1..{MAX_MOVES} (the P task lists at most "
                         f"{MAX_MOVES} moves), got {cfg.engine.multipv}")
    check_p_kinds(_p_kinds(cfg), cfg.get("only_move_gap", 1.0), cfg.engine.multipv)
    check_a_kinds(OmegaConf.to_container(cfg.a_kinds))
    out, cache = Path(to_absolute_path(cfg.out_dir)), Path(to_absolute_path(cfg.cache_dir))
    check_not_shipped(str(out), SHIPPED_DATA, cfg.get("replace_shipped", False), "out_dir")
    out.mkdir(parents=True, exist_ok=True)
    cache.mkdir(parents=True, exist_ok=True)
    timing, t0 = {}, time.perf_counter()
    games = load_or_play(cfg, cache)
    timing["games_s"] = time.perf_counter() - t0
    positions = [p for i, g in enumerate(games) for p in game_positions(i, g)]
    rng = random.Random(cfg.seed)
    with EnginePool(cfg.engine.path, cfg.engine.processes, cfg.engine.depth,
                    cfg.engine.nodes, cfg.engine.multipv) as pool:
        t1 = time.perf_counter()
        labels_for = lambda fens: label(fens, pool, cache, cfg.progress, timing)  # noqa: E731
        splits = {s: build_split(s, positions, labels_for, cfg, rng) for s in ("train", "eval")}
        timing["build_s"] = time.perf_counter() - t1
        limit_label = pool.limit_label
    for name, samples in splits.items():
        write_jsonl_gz(out / f"{name}.jsonl.gz", samples)
    timing["total_s"] = time.perf_counter() - t0
    write_card(out / "DATA_CARD.md", cfg, splits, limit_label, timing, len(games))
    return {"counts": {name: len(s) for name, s in splits.items()}, "timing": timing}


@hydra.main(config_path="../../conf", config_name="generate")
def main(cfg: DictConfig) -> None:
    try:
        print(run(cfg))
    except ConfigError as e:
        raise SystemExit(f"rookworld: {e}") from None


if __name__ == "__main__":
    main()
