"""Real-looking games: a weak engine mixed with random moves, from random openings.

Game `i` of a seed is a pure function of (seed, i, GameStyle) given the engine
binary: its own RNG, and the mover's hash is cleared once per game
(`ucinewgame`), so which worker plays it does not matter.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from multiprocessing import get_context

import chess
import chess.engine

from rookworld.chess_tasks.stockfish_pool import find_engine


@dataclass(frozen=True)
class GameStyle:
    """random_opening_plies: the first 0..N plies are uniformly random moves;
    random_share: (lo, hi) range a game draws its share of random moves from;
    mover_depths: depths the cheap engine move is searched at, drawn per game;
    max_plies: a game stops after this many plies if not over."""

    random_opening_plies: int = 8
    random_share: tuple[float, float] = (0.1, 0.5)
    mover_depths: tuple[int, ...] = (1, 2)
    max_plies: int = 400


_ENGINE: chess.engine.SimpleEngine | None = None


def _init_worker(path: str | None) -> None:
    global _ENGINE
    _ENGINE = chess.engine.SimpleEngine.popen_uci(find_engine(path))
    _ENGINE.configure({"Threads": 1, "Hash": 1})


def play_game(seed: int, index: int, style: GameStyle,
              engine: chess.engine.SimpleEngine) -> list[str]:
    """The UCI moves of game `index`, played until over or `max_plies`."""
    rng = random.Random(f"{seed}:{index}")
    opening = rng.randint(0, style.random_opening_plies)
    share = rng.uniform(*style.random_share)
    limit = chess.engine.Limit(depth=rng.choice(style.mover_depths))
    board, game = chess.Board(), object()
    while not board.is_game_over() and board.ply() < style.max_plies:
        legal = list(board.legal_moves)
        if board.ply() < opening or rng.random() < share:
            move = rng.choice(legal)
        else:
            move = engine.play(board, limit, game=game).move
        board.push(move)
    return [m.uci() for m in board.move_stack]


def _play(args) -> list[str]:
    seed, index, style = args
    return play_game(seed, index, style, _ENGINE)


def play_games(seed: int, n_games: int, style: GameStyle, workers: int = 2,
               engine_path: str | None = None, progress: bool = False) -> list[list[str]]:
    """n_games games over `workers` processes, in index order."""
    jobs = [(seed, i, style) for i in range(n_games)]
    with get_context("fork").Pool(workers, _init_worker, (engine_path,)) as pool:
        it = pool.imap(_play, jobs, chunksize=4)
        if progress:
            from tqdm import tqdm
            it = tqdm(it, total=n_games, desc="play games")
        games = list(it)
    if _ENGINE is not None:
        _ENGINE.quit()
    return games
