"""`python -m rookworld.data.generate`: play games, pick positions, label, write.

    python -m rookworld.data.generate         # the bundled data's settings, into outputs/data
    python -m rookworld.data.generate out_dir=/tmp/d counts.train.P=2000 engine.depth=12

Writes `train.jsonl.gz` and `eval.jsonl.gz` (rows of `Sample.to_json()`) and
`DATA_CARD.md` into `out_dir`: the set is built in the sibling folder
`.<out_dir>.tmp` and swapped in whole, so `out_dir` holds one run's complete set at
every moment. Games and engine labels are cached under `cache_dir`, so a re-run with
the same arguments replays nothing and labels only positions it has not labelled at
this limit yet; an unreadable cache entry is named and made again. A write that fails
(a full disk) ends in a `WriteError` naming the file and the OS error. Deterministic
for a seed.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
import shutil
import tempfile
import time
import zlib
from contextlib import contextmanager
from pathlib import Path

import hydra
from hydra.utils import to_absolute_path
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from rookworld.chess_tasks.policy import MAX_MOVES
from rookworld.chess_tasks.stockfish_pool import Analysis, EnginePool
from rookworld.errors import ConfigError, check_not_shipped
from rookworld.files import atomic_write_bytes, fsync_dir

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
OUTPUTS = ("train.jsonl.gz", "eval.jsonl.gz", "DATA_CARD.md")


class WriteError(RuntimeError):
    """Writing a cache file or the outputs failed (a full disk, a size limit, no
    permission); the message names the file or folder and the OS error."""


@contextmanager
def _writing(what: str, after: str):
    """Turn an OSError raised inside into a WriteError: `writing <what> failed (<error>);
    <after>`."""
    try:
        yield
    except OSError as e:
        raise WriteError(f"writing {what} failed ({e.strerror or e}); {after}") from e


def _digest(*parts) -> str:
    return hashlib.sha1(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


def load_or_play(cfg: DictConfig, cache: Path) -> list[list[str]]:
    style = GameStyle(**{k: tuple(v) if isinstance(v, list) else v
                         for k, v in OmegaConf.to_container(cfg.style).items()})
    path = cache / f"games-{_digest(cfg.seed, cfg.n_games, style, cfg.engine.path)}.json.gz"
    if path.exists():
        try:
            games = json.loads(gzip.decompress(path.read_bytes()))
            if _are_games(games, cfg.n_games):
                return games
            problem = f"not a list of {cfg.n_games} games"
        except (OSError, EOFError, zlib.error, ValueError) as e:
            problem = f"{type(e).__name__}: {e}"
        print(f"[rookworld] games cache {path} is unreadable ({problem}); playing the games "
              "again and replacing it", flush=True)
    games = play_games(cfg.seed, cfg.n_games, style, cfg.workers, cfg.engine.path, cfg.progress)
    with _writing(f"the games cache {path}", "nothing was written; free space and run again"):
        atomic_write_bytes(path, gzip.compress(json.dumps(games).encode(), mtime=0))
    return games


def _are_games(games, n: int) -> bool:
    return (isinstance(games, list) and len(games) == n
            and all(isinstance(g, list) and all(isinstance(m, str) for m in g) for g in games))


def label(fens: list[str], pool: EnginePool, cache: Path, progress: bool,
          timing: dict) -> dict[str, Analysis]:
    """FEN -> Analysis, reading and appending `labels-<limit>.jsonl` under cache;
    adds the count and seconds of new analyses to timing["labelled"/"label_s"] and
    the count read from the cache to timing["cached"]."""
    path = cache / f"labels-{pool.limit_label.replace(' ', '_')}-multipv={pool.multipv}.jsonl"
    data = path.read_bytes() if path.exists() else b""
    done, skipped = {}, 0
    for line in data.splitlines():
        try:
            r = json.loads(line)
            done[r["fen"]] = Analysis(tuple(r["moves"]), tuple(r["evals"]), r["label"])
        except (ValueError, KeyError, TypeError):  # cut short by a kill, or damaged
            skipped += 1
    if skipped:
        print(f"[rookworld] labels cache {path}: {skipped} unreadable line(s) skipped; their "
              "positions are labelled again", flush=True)
    todo = [f for f in dict.fromkeys(fens) if f not in done]
    t0 = time.perf_counter()
    bar = tqdm(total=len(todo), desc=f"label ({pool.limit_label})", disable=not progress)
    start = "\n" if data and not data.endswith(b"\n") else ""  # ends a line left open
    with bar:
        for i in range(0, len(todo), 256):  # appended per chunk: an interrupted run resumes
            chunk = todo[i:i + 256]
            lines = []
            for fen, a in zip(chunk, pool.analyse_many(chunk), strict=True):
                done[fen] = a
                lines.append(json.dumps({"fen": fen, "moves": a.moves, "evals": a.evals,
                                         "label": a.label}) + "\n")
            with _writing(f"the labels cache {path}", "the labels appended before are kept "
                          "and a rerun labels the rest; free space and run again"):
                with path.open("a") as fh:
                    fh.write(start + "".join(lines))
            start = ""
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


BUILDING = ".generate-"  # prefix of the folder inside out_dir a set is built in
MARK = "building-a-set"  # the file that marks such a folder as the generator's own
MOVING = "DATA_CARD.md.writing"  # the previous card while a new set moves in


def _recover(out: Path) -> None:
    """Remove the folders a killed run left inside out while building its set (only those
    holding the generator's mark: nothing else in out is touched)."""
    for entry in out.glob(f"{BUILDING}*") if out.is_dir() else []:
        if entry.is_dir() and not entry.is_symlink() and (entry / MARK).is_file():
            shutil.rmtree(entry, ignore_errors=True)


def write_outputs(out: Path, cache: Path, splits: dict[str, list], card) -> None:
    """Build the splits and the data card (`card(path)` writes it, keeping the previous
    card's hand-written notes) in a marked folder inside out, then move them in over the
    previous set: the previous card steps aside first (`DATA_CARD.md.writing`) and the new
    card comes last, so out without a DATA_CARD.md is a set a kill interrupted (run the
    command again: its card keeps the notes). A failure while building leaves out as it
    was. Nothing else in out is read or moved."""
    after = (f"out_dir={out} keeps its previous files; free space and run again (games and "
             f"labels are cached in {cache})")
    with _writing(f"the outputs into {out}", after):
        out.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=BUILDING, dir=out))
        try:
            (tmp / MARK).touch()
            for previous in (out / "DATA_CARD.md", out / MOVING):
                if previous.is_file():
                    shutil.copyfile(previous, tmp / "DATA_CARD.md")
                    break
            for name, samples in splits.items():
                write_jsonl_gz(tmp / f"{name}.jsonl.gz", samples)
            card(tmp / "DATA_CARD.md")
            for name in OUTPUTS:
                with open(tmp / name, "rb") as fh:
                    os.fsync(fh.fileno())
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    with _writing(f"out_dir={out} (moving the new set in from {tmp})",
                  f"{out} lacks its DATA_CARD.md until the command runs again"):
        if (out / "DATA_CARD.md").is_file():
            os.replace(out / "DATA_CARD.md", out / MOVING)
        for name in OUTPUTS:  # the card last
            os.replace(tmp / name, out / name)
        (out / MOVING).unlink(missing_ok=True)
        fsync_dir(out)
        shutil.rmtree(tmp, ignore_errors=True)


def run(cfg: DictConfig) -> dict:
    if not 1 <= cfg.engine.multipv <= MAX_MOVES:  # the M: field holds the engine's lines
        raise ValueError(f"engine.multipv must lie in 1..{MAX_MOVES} (the P task lists at most "
                         f"{MAX_MOVES} moves), got {cfg.engine.multipv}")
    check_p_kinds(_p_kinds(cfg), cfg.get("only_move_gap", 1.0), cfg.engine.multipv)
    check_a_kinds(OmegaConf.to_container(cfg.a_kinds))
    out, cache = Path(to_absolute_path(cfg.out_dir)), Path(to_absolute_path(cfg.cache_dir))
    check_not_shipped(str(out), SHIPPED_DATA, cfg.get("replace_shipped", False), "out_dir")
    out = out.resolve()
    if out.exists() and not out.is_dir():
        raise ConfigError(f"out_dir={out} is a file; name a folder")
    with _writing(f"out_dir={out} or cache_dir={cache}", "nothing was written"):
        _recover(out)
        out.parent.mkdir(parents=True, exist_ok=True)
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
    timing["total_s"] = time.perf_counter() - t0
    write_outputs(out, cache, splits,
                  lambda path: write_card(path, cfg, splits, limit_label, timing, len(games)))
    return {"counts": {name: len(s) for name, s in splits.items()}, "timing": timing}


@hydra.main(config_path="../../conf", config_name="generate")
def main(cfg: DictConfig) -> None:
    try:
        print(run(cfg))
    except (ConfigError, WriteError) as e:
        raise SystemExit(f"rookworld: {e}") from None


if __name__ == "__main__":
    main()
