"""Games: the model against an opponent (a random mover, Stockfish limited in strength by
UCI_Elo or, reproducibly, by a node limit) or against itself, many games in lockstep so
that the model answers them in one batch.

An illegal or unparseable move loses the game for the side that made it (the game's
record keeps the move in a comment). A game also ends on the board (checkmate,
stalemate, insufficient material, a position that has occurred three times, 50 moves
without a capture or pawn move) or at the ply limit, scored a draw there. A game in which the engine
opponent died twice on one move is void: recorded, never scored.
"""

from __future__ import annotations

import datetime
import random
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import chess
import chess.engine
import chess.pgn

from ..chess_tasks import legal_move
from ..chess_tasks.stockfish_pool import ENGINE_DIED, EnginePool, end_engine, find_engine

ILLEGAL, UNPARSEABLE, PLY_LIMIT, VOID = ("illegal move", "unparseable move", "ply limit",
                                         "void: the engine died")


@dataclass(frozen=True)
class Opening:
    """A named start: the moves from the initial position (UCI)."""

    name: str
    moves: tuple[str, ...]

    def board(self) -> chess.Board:
        board = chess.Board()
        for uci in self.moves:
            board.push_uci(uci)
        return board


START = Opening("Initial position", ())


def read_openings(path: str | Path) -> list[Opening]:
    """'name | e2e4 e7e5 ...' per line ('#' comments and blank lines skipped); every move
    is checked: ValueError naming the file and line otherwise."""
    out = []
    for n, raw in enumerate(Path(path).read_text().splitlines(), 1):
        text = raw.split("#", 1)[0].strip()
        if not text:
            continue
        name, sep, moves = text.partition("|")
        if not sep:
            raise ValueError(f"{path}:{n}: expected 'name | move move ...', got {raw!r}")
        opening = Opening(name.strip(), tuple(moves.split()))
        try:
            opening.board()
        except ValueError as e:
            raise ValueError(f"{path}:{n}: {opening.name}: {e}") from None
        out.append(opening)
    return out


class EngineVoid(RuntimeError):
    """The engine opponent died twice on one move: the game cannot be scored."""


class RandomMover:
    """A uniformly random legal move, from a generator seeded per game (seed, game)."""

    name = "random mover"

    def __init__(self, seed: int = 0):
        self.seed = seed

    def moves(self, boards: Sequence[chess.Board], games: Sequence[int]) -> list[str]:
        out = []
        for board, game in zip(boards, games):
            rng = random.Random(f"{self.seed}:{game}:{board.ply()}")
            out.append(rng.choice(sorted(m.uci() for m in board.legal_moves)))
        return out

    def close(self) -> None:
        pass


class EngineMover:
    """Stockfish's best move at a node limit: one thread, a cleared hash for every move
    (EnginePool), so a position always gets the same move and a resumed run replays the
    same games. `nodes` sets its strength (1 plays about like a one-ply search)."""

    def __init__(self, nodes: int = 64, path: str | None = None, processes: int = 1):
        self.pool = EnginePool(path, processes=processes, depth=None, nodes=nodes, multipv=1)
        self.name = f"stockfish nodes={nodes}"

    def moves(self, boards: Sequence[chess.Board], games: Sequence[int]) -> list[str]:
        return [a.moves[0] for a in self.pool.analyse_many(b.fen() for b in boards)]

    def close(self) -> None:
        self.pool.close()


class EngineOpponent:
    """Stockfish with UCI_LimitStrength at `elo` (None: the lowest UCI_Elo the engine
    offers), `seconds` a move, over `processes` engine processes. A process that dies is
    restarted and the move asked again; a second death raises EngineVoid. Its moves are
    not reproducible: Stockfish's weakened play draws from a clock-seeded generator."""

    def __init__(self, path: str | None = None, elo: int | None = None,
                 seconds: float = 0.05, processes: int = 2):
        self.path = find_engine(path)
        self.seconds, self.restarts = seconds, 0
        self._engines: list[chess.engine.SimpleEngine] = []
        self._lock = threading.Lock()
        probe = self._open(None)
        try:
            self._configure(probe, elo, processes)
        except BaseException:
            for e in [probe, *self._engines]:
                end_engine(e)
            self._engines = []
            raise
        self.name = f"stockfish UCI_Elo={self.elo} {seconds:g}s/move"

    def _configure(self, probe, elo: int | None, processes: int) -> None:
        option = probe.options.get("UCI_Elo")
        if option is None or "UCI_LimitStrength" not in probe.options:
            raise ValueError(f"{self.path} has no UCI_LimitStrength/UCI_Elo options")
        self.elo = int(option.min) if elo is None else int(elo)
        if not option.min <= self.elo <= option.max:
            raise ValueError(f"engine elo {self.elo} outside the engine's UCI_Elo range "
                             f"[{option.min}, {option.max}]")
        probe.configure({"UCI_LimitStrength": True, "UCI_Elo": self.elo})
        self._engines = [probe]
        for _ in range(processes - 1):
            self._engines.append(self._open(self.elo))

    def _open(self, elo: int | None) -> chess.engine.SimpleEngine:
        engine = chess.engine.SimpleEngine.popen_uci(self.path)
        try:
            engine.configure({"Threads": 1, "Hash": 16})
            if elo is not None:
                engine.configure({"UCI_LimitStrength": True, "UCI_Elo": elo})
        except BaseException:
            end_engine(engine)
            raise
        return engine

    def pids(self) -> list[int]:
        return [e.transport.get_pid() for e in self._engines]

    def _move(self, i: int, board: chess.Board, game: int) -> str:
        for attempt in range(2):
            try:
                return self._engines[i].play(board, chess.engine.Limit(time=self.seconds),
                                             game=game).move.uci()
            except (*ENGINE_DIED, chess.engine.EngineError,
                    TimeoutError):  # died, or hung past python-chess's timeout
                with self._lock:
                    self.restarts += 1
                end_engine(self._engines[i], timeout=1.0)
                self._engines[i] = self._open(self.elo)
                if attempt:
                    raise EngineVoid(f"the engine died twice on one move in {board.fen()}"
                                     ) from None
        raise AssertionError("unreachable")

    def moves(self, boards: Sequence[chess.Board], games: Sequence[int]) -> list[str | None]:
        """One move per board; None where the engine died twice (the game is void)."""
        n = len(self._engines)

        def work(k: int) -> list[tuple[int, str | None]]:
            out = []
            for j in range(k, len(boards), n):
                try:
                    out.append((j, self._move(k, boards[j], games[j])))
                except EngineVoid:
                    out.append((j, None))
            return out

        result: list[str | None] = [None] * len(boards)
        with ThreadPoolExecutor(n) as ex:
            for part in ex.map(work, range(n)):
                for j, move in part:
                    result[j] = move
        return result

    def close(self) -> None:
        """Ends every engine process (idempotent)."""
        for e in self._engines:
            end_engine(e)
        self._engines = []

    def __enter__(self) -> EngineOpponent:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass
class GameRecord:
    """One game. model_color: the model's side, None when it plays both (self-play);
    moves: the legal moves played (UCI); illegal: the move text that ended the game, if
    the model's; result: '1-0', '0-1', '1/2-1/2' or '*' (void)."""

    opening: Opening
    model_color: chess.Color | None
    white: str
    black: str
    moves: list[str] = field(default_factory=list)
    result: str = "*"
    termination: str = ""
    illegal: str | None = None

    def score(self) -> float | None:
        """The model's score (1, 0.5, 0); None in self-play and in a void game."""
        if self.model_color is None or self.result == "*":
            return None
        if self.result == "1/2-1/2":
            return 0.5
        return 1.0 if (self.result == "1-0") == (self.model_color == chess.WHITE) else 0.0

    def legal_plies(self) -> int:
        """Legal half-moves played from the start (self-play: all the model's own)."""
        return len(self.moves)


def game_over(board: chess.Board) -> tuple[str, str] | None:
    """(result, termination) once the game is over on the board: a draw by repetition or
    the 50-move rule only once it has happened (python-chess's claim_draw also ends a
    game where the side to move merely could repeat)."""
    outcome = board.outcome(claim_draw=False)
    if outcome is not None:
        return outcome.result(), outcome.termination.name.lower().replace("_", " ")
    if board.is_repetition(3):
        return "1/2-1/2", "threefold repetition"
    if board.halfmove_clock >= 100:
        return "1/2-1/2", "fifty moves"
    return None


def play_games(openings: Sequence[Opening], colours: Sequence[chess.Color | None],
               model: Callable[[list[str]], list[str | None]], model_name: str,
               opponent=None, max_plies: int = 200, progress=None) -> list[GameRecord]:
    """Play game i from openings[i] with the model on colours[i] (None: both sides,
    `opponent` unused) against opponent.moves(boards, games). model(fens) -> moves, as a
    batch. progress(n): n games finished. Returns the records in game order."""
    opp_name = opponent.name if opponent is not None else model_name
    records, boards = [], []
    for opening, colour in zip(openings, colours):
        white = model_name if colour in (None, chess.WHITE) else opp_name
        black = model_name if colour in (None, chess.BLACK) else opp_name
        records.append(GameRecord(opening, colour, white, black))
        boards.append(opening.board())
    active = set(range(len(records)))

    def finish(i: int, result: str, termination: str, illegal: str | None = None) -> None:
        rec = records[i]
        rec.result, rec.termination, rec.illegal = result, termination, illegal
        active.discard(i)
        if progress is not None:
            progress(1)

    for i in list(active):
        if (ended := game_over(boards[i])) is not None:
            finish(i, *ended)
    while active:
        mine = sorted(i for i in active if records[i].model_color in (None, boards[i].turn))
        theirs = sorted(active - set(mine))
        if mine:
            said = model([boards[i].fen() for i in mine])
            if len(said) != len(mine):
                raise ValueError(f"the player answered {len(said)} of {len(mine)} positions")
            for i, move in zip(mine, said):
                loser_white = boards[i].turn == chess.WHITE
                lost = "0-1" if loser_white else "1-0"
                if move is None:
                    finish(i, lost, UNPARSEABLE)
                    continue
                mv = legal_move(boards[i], move)
                if mv is None:
                    finish(i, lost, ILLEGAL, move)
                    continue
                _push(boards[i], records[i], mv, max_plies, finish, i)
        if theirs:
            for i, move in zip(theirs, opponent.moves([boards[i] for i in theirs], theirs)):
                if move is None:
                    finish(i, "*", VOID)
                    continue
                _push(boards[i], records[i], chess.Move.from_uci(move), max_plies, finish, i)
    return records


def _push(board: chess.Board, rec: GameRecord, move: chess.Move, max_plies: int, finish,
          i: int) -> None:
    board.push(move)
    rec.moves.append(move.uci())
    if (ended := game_over(board)) is not None:
        finish(i, *ended)
    elif len(rec.moves) >= max_plies:
        finish(i, "1/2-1/2", PLY_LIMIT)


# PGN's Termination tag takes a few standard values; the detail goes to the Ending tag
PGN_TERMINATION = {ILLEGAL: "rules infraction", UNPARSEABLE: "rules infraction",
                   PLY_LIMIT: "adjudication", VOID: "unterminated"}


def to_pgn(rec: GameRecord, event: str, round_: int, headers: dict | None = None
           ) -> chess.pgn.Game:
    """The game as PGN: players, result, Termination (standard values) and Ending (how
    exactly), the opening's moves played out from the initial position, the illegal move
    in a comment on the last move, and `headers` (the settings)."""
    game = chess.pgn.Game()
    game.headers["Event"] = event
    game.headers["Site"] = "rookworld"
    game.headers["Date"] = datetime.date.today().strftime("%Y.%m.%d")
    game.headers["Round"] = str(round_)
    game.headers["White"], game.headers["Black"] = rec.white, rec.black
    game.headers["Result"] = rec.result
    game.headers["Termination"] = PGN_TERMINATION.get(rec.termination, "normal")
    game.headers["Ending"] = rec.termination
    game.headers["Opening"] = rec.opening.name
    for k, v in (headers or {}).items():
        game.headers[k] = str(v)
    node = game
    for uci in rec.opening.moves + tuple(rec.moves):
        node = node.add_variation(chess.Move.from_uci(uci))
    if len(rec.opening.moves):
        game.headers["PlyCountOpening"] = str(len(rec.opening.moves))
    if rec.termination in (ILLEGAL, UNPARSEABLE):
        board = node.board()
        side = "White" if board.turn == chess.WHITE else "Black"
        what = f"the illegal move {rec.illegal}" if rec.illegal else "no parseable move"
        node.comment = f"{side} ({rec.white if side == 'White' else rec.black}) played " \
                       f"{what}: the game is lost"
    elif rec.termination == VOID:
        node.comment = "the engine died twice on one move: the game is void, not scored"
    return game


def write_pgn(records: Sequence[GameRecord], path: str | Path, event: str,
              headers: dict | None = None) -> Path:
    """Every game of records into one PGN file (games separated by a blank line)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "\n\n".join(str(to_pgn(r, event, i + 1, headers)) for i, r in enumerate(records))
    from ..files import atomic_write_text
    atomic_write_text(path, text + "\n")
    return path
