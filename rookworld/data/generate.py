"""`python -m rookworld.data.generate`: play games, pick positions, label, write.

    python -m rookworld.data.generate                         # the bundled data
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
from collections import defaultdict
from pathlib import Path

import chess
import hydra
from hydra.utils import to_absolute_path
from omegaconf import DictConfig, OmegaConf

from rookworld.chess_tasks import env_sample, policy_sample
from rookworld.chess_tasks.engine import Analysis, EnginePool

from .card import write_card
from .games import GameStyle, play_games
from .positions import (
    Position,
    drawing_moves,
    game_positions,
    illegal_move,
    mating_moves,
    seventyfive_move,
)
from .splits import split_of


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


def stratified(cands: list, n: int, shares: dict, rng: random.Random, make=lambda c: c) -> list:
    """Up to n items `make(c)` (None = skip c), a share of n per phase, shortfalls
    filled from the other phases. cands have `.phase`."""
    by_phase = defaultdict(list)
    for c in cands:
        by_phase[c.phase].append(c)
    out, rest = [], []
    for phase, share in shares.items():
        pool = by_phase.get(phase, [])
        rng.shuffle(pool)
        quota, used = round(n * share), 0
        for c in pool:
            if quota <= 0:
                break
            used += 1
            if (x := make(c)) is not None:
                out.append(x)
                quota -= 1
        rest += pool[used:]
    rng.shuffle(rest)
    for c in rest:
        if len(out) >= n:
            break
        if (x := make(c)) is not None:
            out.append(x)
    return out[:n]


def label(fens: list[str], pool: EnginePool, cache: Path, progress: bool,
          timing: dict) -> dict[str, Analysis]:
    """FEN -> Analysis, reading and appending `labels-<limit>.jsonl` under cache;
    adds the count and seconds of new analyses to timing["labelled"/"label_s"]."""
    path = cache / f"labels-{pool.limit_label.replace(' ', '_')}.jsonl"
    done = {}
    if path.exists():
        for line in path.read_text().splitlines():
            r = json.loads(line)
            done[r["fen"]] = Analysis(tuple(r["moves"]), tuple(r["evals"]), r["label"])
    todo = [f for f in dict.fromkeys(fens) if f not in done]
    t0 = time.perf_counter()
    with path.open("a") as fh:
        for i in range(0, len(todo), 256):
            chunk = todo[i:i + 256]
            for fen, a in zip(chunk, pool.analyse_many(chunk, progress=False), strict=True):
                done[fen] = a
                fh.write(json.dumps({"fen": fen, "moves": a.moves, "evals": a.evals,
                                     "label": a.label}) + "\n")
            fh.flush()
            if progress:
                print(f"labelled {min(i + 256, len(todo))}/{len(todo)} new positions", flush=True)
    timing["labelled"] = timing.get("labelled", 0) + len(todo)
    timing["label_s"] = timing.get("label_s", 0.0) + time.perf_counter() - t0
    return done


def policy_samples(positions: list[Position], labels: dict, seed: int) -> list:
    out = []
    for p in positions:
        a = labels[p.fen]
        if not a.moves:
            continue
        order = list(range(len(a.moves)))
        random.Random(f"{seed}:{p.fen}").shuffle(order)  # SPEC: the order carries no rank
        out.append(policy_sample(p.fen, [a.moves[i] for i in order], [a.evals[i] for i in order],
                                 source=a.label, meta={"phase": p.phase, "game": p.game,
                                                       "ply": p.ply}))
    return out


def _choice(items: list, rng: random.Random):
    return rng.choice(items) if items else None


def _env(p: Position, move: str | None, fen: str | None = None, kind: str = ""):
    """An A sample for `move` at p (None when there is no such move)."""
    if move is None:
        return None
    return env_sample(fen or p.fen, move, p.history + (move,),
                      meta={"phase": p.phase, "game": p.game, "ply": p.ply, "kind": kind})


def env_samples(positions: list[Position], n: int, kinds: dict, shares: dict,
                rng: random.Random) -> list:
    """n A samples, `kinds` the share of each kind (see positions.py)."""
    positions = [p for p in positions if p.played]  # the game goes on: a legal move exists
    played = list({(p.key, p.played): p for p in positions}.values())
    ends = [p for p in positions if p.phase == "endgame"]
    makers = {
        "played": (played, lambda p: _env(p, p.played, kind="played")),
        "illegal": (positions, lambda p: _env(p, illegal_move(_board(p), rng), kind="illegal")),
        "mate": (positions, lambda p: _env(p, _choice(mating_moves(_board(p)), rng),
                                           kind="mate")),
        "draw": (ends, lambda p: _env(p, _choice(drawing_moves(_board(p)), rng), kind="draw")),
        "seventyfive": (ends, _seventyfive),
    }
    out = []
    for kind, share in kinds.items():
        cands, make = makers[kind]
        want = n - len(out) if kind == list(kinds)[-1] else round(n * share)
        out += stratified(cands, want, shares, rng, make)
    return out


def _seventyfive(p: Position):
    found = seventyfive_move(_board(p))
    return _env(p, found[1], found[0], kind="seventyfive") if found else None


def _board(p: Position) -> chess.Board:
    return chess.Board(p.fen)


def build_split(split: str, positions: list[Position], labels_for, cfg, rng) -> list:
    counts = cfg.counts[split]
    shares = OmegaConf.to_container(cfg.phase_shares)
    mine = [p for p in positions if split_of(p.fen, cfg.eval_fraction) == split]
    seen, fresh = set(), []
    for p in mine:  # first occurrence of each position that still has a move to play
        if p.played and p.key not in seen:
            seen.add(p.key)
            fresh.append(p)
    chosen = stratified(fresh, counts.P, shares, rng)
    labels = labels_for([p.fen for p in chosen])
    samples = policy_samples(chosen, labels, cfg.seed)
    samples += env_samples(mine, counts.A, OmegaConf.to_container(cfg.a_kinds), shares, rng)
    rng.shuffle(samples)
    return samples


def write_jsonl_gz(path: Path, samples) -> None:
    lines = "".join(json.dumps(s.to_json()) + "\n" for s in samples)
    path.write_bytes(gzip.compress(lines.encode(), mtime=0))


def run(cfg: DictConfig) -> dict:
    out, cache = Path(to_absolute_path(cfg.out_dir)), Path(to_absolute_path(cfg.cache_dir))
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
    return {name: len(s) for name, s in splits.items()}


@hydra.main(config_path="../../conf", config_name="generate")
def main(cfg: DictConfig) -> None:
    print(run(cfg))


if __name__ == "__main__":
    main()
