"""Lichess puzzles: reading the published CSV and scoring a player's answers.

The Lichess puzzle database (CC0, database.lichess.org) has the columns PuzzleId, FEN,
Moves, Rating, RatingDeviation, Popularity, NbPlays, Themes, GameUrl, OpeningTags (newer
exports add DailyDate; extra columns are ignored). FEN is the position *before* the
opponent's move that sets up the puzzle: Moves[0] is that move, the solver plays
Moves[1], Moves[3], ... and the file plays the replies Moves[2], Moves[4], ...

A solver's move is right when it is the listed move, or when it gives checkmate (Lichess
accepts any mating move: a mate-in-1 has no single answer).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import chess

from ..chess_tasks import legal_move

REQUIRED = ("PuzzleId", "FEN", "Moves", "Rating", "Themes")
# rating bands of the report: (label, low inclusive, high exclusive)
BANDS = (("<1000", 0, 1000), ("1000-1499", 1000, 1500), ("1500-1999", 1500, 2000),
         (">=2000", 2000, math.inf))
# themes reported on their own (a puzzle counts under each of its themes listed here)
THEMES = ("mateIn1", "mateIn2", "mateIn3", "fork", "pin", "skewer", "hangingPiece",
          "discoveredAttack", "sacrifice", "defensiveMove", "opening", "middlegame", "endgame")


class PuzzleFileError(ValueError):
    """A puzzle file that cannot be read as a whole (missing file or columns)."""


@dataclass(frozen=True)
class Puzzle:
    """fen: the position the solver faces (after the setup move); solution: the solver's
    moves and the file's replies after it, alternating, solver first (UCI)."""

    puzzle_id: str
    fen: str
    solution: tuple[str, ...]
    rating: int
    themes: tuple[str, ...]
    line: int  # line number in its file (1 = the header)

    @property
    def band(self) -> str:
        return next(label for label, lo, hi in BANDS if lo <= self.rating < hi)


@dataclass
class PuzzleSet:
    """The puzzles of a file and the lines skipped, each as 'path:line: reason'."""

    path: str
    puzzles: list[Puzzle]
    skipped: list[str] = field(default_factory=list)


def _parse_row(row: dict, line: int) -> Puzzle:
    """One CSV row -> Puzzle; ValueError naming what is wrong."""
    try:
        board = chess.Board(row["FEN"])
    except ValueError as e:
        raise ValueError(f"broken FEN {row['FEN']!r} ({e})") from None
    if not board.is_valid():
        raise ValueError(f"invalid position {row['FEN']!r}")
    moves = (row["Moves"] or "").split()
    if len(moves) < 2 or len(moves) % 2:
        raise ValueError(f"Moves must hold the setup move and whole solver/reply pairs, "
                         f"got {len(moves)} moves")
    for i, uci in enumerate(moves):
        try:
            move = chess.Move.from_uci(uci)
        except ValueError:
            raise ValueError(f"move {i + 1} {uci!r} is not UCI") from None
        if not board.is_legal(move):
            raise ValueError(f"move {i + 1} {uci} is illegal in {board.fen()}")
        moves[i] = board.uci(move)  # castling as the king's two-square move (e1h1 -> e1g1)
        board.push(move)
    after = chess.Board(row["FEN"])
    after.push_uci(moves[0])
    try:
        rating = int(row["Rating"])
    except (TypeError, ValueError):
        raise ValueError(f"Rating {row['Rating']!r} is not a whole number") from None
    if rating < 0:
        raise ValueError(f"Rating {rating} is negative")
    return Puzzle(row["PuzzleId"], after.fen(), tuple(moves[1:]), rating,
                  tuple((row["Themes"] or "").split()), line)


def read_puzzles(path: str | Path, limit: int = 0) -> PuzzleSet:
    """The puzzles of a Lichess-format CSV, in file order (the first `limit`; 0 = all).
    A missing file or column raises PuzzleFileError naming the file (and the line of
    the header); a bad row (broken FEN, illegal or non-UCI move, junk) is skipped and
    counted with its line number."""
    path = Path(path)
    if not path.is_file():
        raise PuzzleFileError(f"{path}: no such puzzle file")
    out = PuzzleSet(str(path), [])
    with path.open(newline="", encoding="utf-8", errors="replace") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
        if missing:
            raise PuzzleFileError(f"{path}:1: the header lacks the column(s) "
                                  f"{', '.join(missing)} of the Lichess puzzle format "
                                  f"({', '.join(REQUIRED)}, ...); got {reader.fieldnames}")
        for row in reader:
            line = reader.line_num
            if None in row or any(row.get(c) is None for c in REQUIRED):
                out.skipped.append(f"{path}:{line}: wrong number of fields")
                continue
            try:
                out.puzzles.append(_parse_row(row, line))
            except ValueError as e:
                out.skipped.append(f"{path}:{line}: {e}")
            if limit and len(out.puzzles) >= limit:
                break
    return out


def is_right(board: chess.Board, answer: str | None, listed: str) -> bool:
    """The solver's answer is the listed move, or any legal move that mates."""
    if not answer:
        return False
    move = legal_move(board, answer)
    if move is None:
        return False
    if answer == listed:
        return True
    board = board.copy(stack=False)
    board.push(move)
    return board.is_checkmate()


def is_legal(board: chess.Board, answer: str | None) -> bool:
    """The answer is a legal move of the board in canonical UCI (`legal_move`)."""
    return legal_move(board, answer) is not None


@dataclass(frozen=True)
class PuzzleResult:
    """first: the first answer is right; line: every answer of the line is right;
    illegal: the first answer is illegal or unparseable; answers: what the player said."""

    puzzle: Puzzle
    first: bool
    line: bool
    illegal: bool
    answers: tuple[str | None, ...]


def solve(puzzles: Sequence[Puzzle], player: Callable[[list[str]], list[str | None]]
          ) -> list[PuzzleResult]:
    """Score a player on puzzles. player(fens) -> one answer (UCI, or None when it gave
    none) per FEN; it is called once per solver turn with every puzzle still being
    solved, so a batched player answers all of them at once. A line is solved when each
    answer is right; a mating answer ends the line solved."""
    boards = [chess.Board(p.fen) for p in puzzles]
    answers: list[list[str | None]] = [[] for _ in puzzles]
    alive = [True] * len(puzzles)
    solved_line = [False] * len(puzzles)
    turn = 0
    while any(alive):
        idx = [i for i, a in enumerate(alive) if a]
        said = player([boards[i].fen() for i in idx])
        if len(said) != len(idx):
            raise ValueError(f"the player answered {len(said)} of {len(idx)} puzzles")
        for i, answer in zip(idx, said):
            listed = puzzles[i].solution[2 * turn]
            answers[i].append(answer)
            if not is_right(boards[i], answer, listed):
                alive[i] = False
                continue
            boards[i].push(chess.Move.from_uci(answer))
            if boards[i].is_checkmate() or 2 * turn + 1 >= len(puzzles[i].solution):
                alive[i], solved_line[i] = False, True
                continue
            boards[i].push_uci(puzzles[i].solution[2 * turn + 1])
        turn += 1
    return [PuzzleResult(p, is_right(chess.Board(p.fen), a[0], p.solution[0]), line,
                         not is_legal(chess.Board(p.fen), a[0]), tuple(a))
            for p, a, line in zip(puzzles, answers, solved_line)]
