"""A pool of UCI engine processes (Stockfish by default) that labels P positions.

Each process runs 1 thread at a fixed search limit (depth and/or nodes) with
MultiPV; every analysis starts from a cleared hash (`ucinewgame`), so a label
depends only on (FEN, limit), not on what the process searched before. Results
are cached per (FEN, limit). A process that dies is restarted and the call
retried once; `analyse_many` spreads positions over the processes with one
thread per process.

python-chess runs each engine's event loop on a non-daemon thread, which keeps
the interpreter from exiting until the engine ends: close a pool (`close()` or
`with`) when done. A pool still open when the main thread finishes is closed
before Python joins its threads.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import queue
import shutil
import threading
from concurrent.futures import CancelledError, ThreadPoolExecutor
from dataclasses import dataclass

import chess
import chess.engine

MATE_SCORE = 100000
INSTALL_HINT = "apt-get install -y stockfish"
_DEFAULT_PATHS = ("/usr/games/stockfish", "/usr/bin/stockfish", "/usr/local/bin/stockfish")


@dataclass(frozen=True)
class Analysis:
    """moves: the engine's MultiPV first moves in rank order (best first);
    evals: pawns from the side to move's view, same order; label: the engine
    and limit that made them, e.g. "stockfish 15.1 depth=8"."""

    moves: tuple[str, ...]
    evals: tuple[float, ...]
    label: str


def find_engine(path: str | None = None, name: str = "stockfish") -> str:
    """The engine binary: `path` if given, else `name` on PATH, else Debian's
    /usr/games. Raises FileNotFoundError naming the install command."""
    if path is not None:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
        raise FileNotFoundError(f"engine binary {path!r} not found or not executable; "
                                f"install Stockfish with `{INSTALL_HINT}` or fix the path")
    found = shutil.which(name) or next((p for p in _DEFAULT_PATHS if os.path.isfile(p)), None)
    if found is None:
        raise FileNotFoundError(f"no {name!r} on PATH or in {_DEFAULT_PATHS}; install it with "
                                f"`{INSTALL_HINT}` (Debian/Ubuntu) or pass path=")
    return found


_OPEN: set[EnginePool] = set()  # pools not yet closed, which _close_open_pools ends at exit
_OPEN_LOCK = threading.Lock()


def _close_open_pools() -> None:
    with _OPEN_LOCK:
        pools = list(_OPEN)
    for pool in pools:
        pool.close()


# threading's exit hooks run before the interpreter joins non-daemon threads (the engines'
# event loops); the atexit module's run only after that join, too late to end them
getattr(threading, "_register_atexit", atexit.register)(_close_open_pools)


def end_engine(engine: chess.engine.SimpleEngine, timeout: float = 5.0) -> None:
    """Ends one engine process and its event-loop thread, whatever its state: asks it
    to quit, waiting at most `timeout` seconds, then closes it (a process still
    running is killed) and waits up to `timeout` seconds for it to exit. Never raises."""
    if not engine.returncode.done():  # the process has not exited yet
        quit_ = engine.protocol.quit()
        try:
            future = asyncio.run_coroutine_threadsafe(quit_, engine.protocol.loop)
        except RuntimeError:  # its event loop has already ended
            quit_.close()
        else:
            try:
                future.result(timeout)
            except Exception:  # noqa: BLE001 - busy or hung past the timeout, or died meanwhile
                pass
    try:
        engine.close()
        engine.returncode.result(timeout)
    except Exception:  # noqa: BLE001 - its event loop ended without reporting the exit code
        pass


def pawns(score: chess.engine.PovScore) -> float:
    """A PovScore in pawns from the side to move's view (mate in 1 = 999.99)."""
    return score.relative.score(mate_score=MATE_SCORE) / 100


# How python-chess reports an engine process that died: EngineTerminatedError, or a
# cancelled command when the process was gone before the command started.
ENGINE_DIED = (chess.engine.EngineTerminatedError, CancelledError)


class EnginePool:
    """N engine processes at one fixed limit. Thread-safe; use as a context manager
    or call `close()`: the engines' threads keep the interpreter alive until then.

    >>> with EnginePool(processes=1, depth=4) as pool:           # doctest: +SKIP
    ...     pool.analyse(chess.STARTING_FEN).moves[:1]
    ('e2e4',)
    """

    def __init__(self, path: str | None = None, processes: int = 2, depth: int | None = 8,
                 nodes: int | None = None, multipv: int = 5, hash_mb: int = 16):
        if depth is None and nodes is None:
            raise ValueError("EnginePool needs a search limit: set depth or nodes (or both)")
        if processes < 1 or multipv < 1:
            raise ValueError(f"processes ({processes}) and multipv ({multipv}) must be >= 1")
        self.path = find_engine(path)
        self.processes, self.multipv, self.hash_mb = processes, multipv, hash_mb
        self.limit = chess.engine.Limit(depth=depth, nodes=nodes)
        self._closed = False
        self._life = threading.Lock()  # guards _closed and the replacement of an engine
        self._engines: list[chess.engine.SimpleEngine] = []
        with _OPEN_LOCK:
            _OPEN.add(self)
        try:
            for _ in range(processes):
                self._engines.append(self._open())
        except BaseException:
            self.close()
            raise
        self._free: queue.Queue[int] = queue.Queue()
        for i in range(processes):
            self._free.put(i)
        self._cache: dict[tuple, Analysis | float] = {}
        self._lock = threading.Lock()
        name = self._engines[0].id.get("name", os.path.basename(self.path))
        parts = [f"depth={depth}"] * (depth is not None) + [f"nodes={nodes}"] * (nodes is not None)
        self.limit_label = " ".join([name.lower(), *parts])
        self.restarts = 0

    def _open(self) -> chess.engine.SimpleEngine:
        engine = chess.engine.SimpleEngine.popen_uci(self.path)
        engine.configure({"Threads": 1, "Hash": self.hash_mb})
        return engine

    def pids(self) -> list[int]:
        """Process ids of the engines (for tests and monitoring)."""
        return [e.transport.get_pid() for e in self._engines]

    def _run(self, fn):
        """Run fn(engine) on a free engine; restart it and retry once if it died. A
        search that the pool's closing cut short raises EngineTerminatedError."""
        i = self._free.get()
        try:
            try:
                result = fn(self._engines[i])
            except ENGINE_DIED:
                self._restart(i)
                result = fn(self._engines[i])
        finally:
            self._free.put(i)
        if self._closed:
            raise chess.engine.EngineTerminatedError("the engine pool was closed during the search")
        return result

    def _restart(self, i: int) -> None:
        with self._life:
            if self._closed:
                raise chess.engine.EngineTerminatedError("the engine pool is closed")
            end_engine(self._engines[i], timeout=1.0)
            self._engines[i] = self._open()
            self.restarts += 1

    def _cached(self, key: tuple, compute):
        with self._lock:
            if key in self._cache:
                return self._cache[key]
        value = self._run(compute)
        with self._lock:
            self._cache[key] = value
        return value

    def analyse(self, fen: str) -> Analysis:
        """Top-`multipv` moves and evals of `fen`; empty when the game is over."""
        board = chess.Board(fen)

        def compute(engine):
            infos = engine.analyse(board, self.limit, multipv=self.multipv, game=object())
            lines = [(i["pv"][0].uci(), pawns(i["score"])) for i in infos if i.get("pv")]
            return Analysis(tuple(m for m, _ in lines), tuple(e for _, e in lines),
                            self.limit_label)

        if board.is_game_over():
            return Analysis((), (), self.limit_label)
        return self._cached(("analyse", board.fen()), compute)

    def evaluate_after(self, fen: str, move: str) -> float:
        """Eval (pawns, side to move's view) of playing `move` in `fen`: minus the eval of
        the position after it at the pool's limit, whatever the move (mate given = 1000.0,
        as the search reads the mated side's Mate(-0), above the 999.99 of a move that mates
        on the next turn; a draw on the board = 0.0), so that two moves of one position
        compare at the same depth. Raises ValueError for an illegal move.

        Not `root_moves=[move]`: Stockfish 15.1 reports bogus scores for a single
        searchmove (startpos g1h3 at depth 8: +3.84)."""
        board = chess.Board(fen)
        mv = chess.Move.from_uci(move)
        if not board.is_legal(mv):
            raise ValueError(f"{move} is not legal in {fen}")
        board.push(mv)
        if board.is_checkmate():
            return MATE_SCORE / 100
        if board.is_game_over():
            return 0.0

        def compute(engine):
            return -pawns(engine.analyse(board, self.limit, game=object())["score"])

        return self._cached(("after", board.fen()), compute)

    def analyse_many(self, fens, progress: bool = False) -> list[Analysis]:
        """analyse() over many FENs, one thread per engine process; order kept."""
        fens = list(fens)
        with ThreadPoolExecutor(self.processes) as ex:
            it = ex.map(self.analyse, fens)
            if progress:
                from tqdm import tqdm
                it = tqdm(it, total=len(fens), desc=f"label ({self.limit_label})")
            return list(it)

    def close(self, timeout: float = 5.0) -> None:
        """Ends every engine process and its thread (`end_engine`, at most about
        2 x `timeout` seconds per engine); idempotent. Calls after it raise
        EngineTerminatedError."""
        with self._life:
            if self._closed:
                return
            self._closed = True
            engines = list(self._engines)
        for e in engines:
            end_engine(e, timeout)
        with _OPEN_LOCK:
            _OPEN.discard(self)

    def __enter__(self) -> EnginePool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def against_best(pool, fen: str, move: str) -> tuple[float, float] | None:
    """(eval of the engine's best move, eval of the legal `move`) in `fen`, both by the
    pool's `evaluate_after`, so that a move as good as the best compares equal (a root eval
    is a search one ply shallower than the one after a move); None when nothing is lost:
    the move is the engine's first line, or the position has none (a draw by rule, which
    every move keeps). What the engine reward and the centipawn loss score."""
    top = pool.analyse(fen).moves
    if not top or move == top[0]:
        return None
    return pool.evaluate_after(fen, top[0]), pool.evaluate_after(fen, move)


class LabelPool:
    """An engine pool's stand-in that answers from P samples' labels instead of searching
    (no Stockfish): a position's labelled MultiPV lines as its analysis; as the eval after a
    move, its labelled eval when the move is listed, else one pawn below the worst listed.
    For benchmarks, fuzzing and tests of what scores through a pool (`against_best`,
    reward=engine), not an engine: its evals are the labels' depth, not a search after
    the move."""

    def __init__(self, samples):
        self.truth = {s.truth.fen: s.truth for s in samples if s.task == "P"}
        self.limit_label = "labels"

    def analyse(self, fen: str) -> Analysis:
        """The labelled lines, best first as the engine ranks them (a label lists its
        moves in any order)."""
        t = self.truth[fen]
        lines = sorted(zip(t.moves, t.evals), key=lambda line: -line[1])
        return Analysis(tuple(m for m, _ in lines), tuple(e for _, e in lines),
                        self.limit_label)

    def evaluate_after(self, fen: str, move: str) -> float:
        t = self.truth[fen]
        return t.evals[t.moves.index(move)] if move in t.moves else min(t.evals) - 1.0

    def close(self) -> None:
        """Nothing to end (the real pool ends its engine processes)."""
