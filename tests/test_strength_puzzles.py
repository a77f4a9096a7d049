"""Lichess puzzles: reading the published format, bad input, and scoring answers."""

from __future__ import annotations

import csv
import hashlib
from pathlib import Path

import chess
import pytest

from rookworld.strength.puzzles import (
    BANDS,
    PuzzleFileError,
    is_legal,
    is_right,
    read_puzzles,
    solve,
)

SAMPLE = Path(__file__).resolve().parents[1] / "rookworld" / "assets" / "strength" / \
    "lichess_puzzles.csv"
HEADER = "PuzzleId,FEN,Moves,Rating,RatingDeviation,Popularity,NbPlays,Themes,GameUrl,OpeningTags"
# After the setup move b8c6 White mates with Qxf7# (h5f7); the listed solution is h5f7.
SCHOLAR = "rnbqkbnr/pppp1ppp/8/4p2Q/2B1P3/8/PPPP1PPP/RNB1K1NR b KQkq - 3 3"
# Back-rank position with two mating moves after the setup move: Ra8# and Re8# (listed: a1a8).
TWO_MATES = "6k1/5ppp/8/n7/8/8/5PPP/R3R1K1 b - - 0 1"


def write(tmp_path, *rows, header=HEADER) -> Path:
    path = tmp_path / "puzzles.csv"
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def test_the_shipped_sample_is_the_documented_file_and_reads_whole():
    assert hashlib.sha256(SAMPLE.read_bytes()).hexdigest() in \
        (SAMPLE.parent / "DATA_CARD.md").read_text()
    got = read_puzzles(SAMPLE)
    assert len(got.puzzles) >= 1000 and got.skipped == []
    for p in got.puzzles[:50]:
        board = chess.Board(p.fen)
        for uci in p.solution:
            board.push_uci(uci)  # every listed move is legal in turn
        assert len(p.solution) % 2 == 1


def test_the_first_move_is_the_opponents_and_the_solver_moves_next(tmp_path):
    path = write(tmp_path, f"p1,{SCHOLAR},b8c6 h5f7,600,80,90,100,mate mateIn1 opening,u,")
    (p,) = read_puzzles(path).puzzles
    assert chess.Board(p.fen).turn == chess.WHITE and p.solution == ("h5f7",)
    assert p.band == BANDS[0][0] and "mateIn1" in p.themes and p.line == 2


def test_any_mating_move_solves_a_mate_in_one(tmp_path):
    path = write(tmp_path, f"m,{TWO_MATES},a5c4 a1a8,700,80,90,100,mateIn1 mate,u,")
    puzzles = read_puzzles(path).puzzles
    for answer in ("a1a8", "e1e8"):
        (r,) = solve(puzzles, lambda fens, a=answer: [a] * len(fens))
        assert r.first and r.line and not r.illegal
    (r,) = solve(puzzles, lambda fens: ["g1f1"] * len(fens))  # legal, no mate
    assert not r.first and not r.line and not r.illegal


def test_a_line_is_solved_only_when_every_answer_is_right(tmp_path):
    # 00MQl-like line: the solver answers twice, the file replies in between
    line = "d1c1 e2c2"  # setup move, then the mate
    row = f"x,r1b1kb1Q/ppp4p/6pB/3P4/2pn4/8/PPP1qPPP/RN1K3R w q - 2 13,{line},838,79,100,1,mate,u,"
    two = ("y,6k1/2q2p1p/4pPp1/4P3/p1pP1P2/RrP5/6QP/4B1K1 b - - 0 33,"
           "b3a3 g2a8 c7b8 a8b8,970,168,100,10,mateIn2,u,")
    puzzles = read_puzzles(write(tmp_path, row, two)).puzzles
    script = {0: ["e2c2", "g2a8"], 1: [None, "a8b8"]}
    calls = []

    def player(fens):
        calls.append(len(fens))
        return script[len(calls) - 1][-len(fens):]
    one, both = solve(puzzles, player)
    assert one.first and one.line
    assert both.first and both.line and calls == [2, 1]
    (wrong,) = solve(puzzles[1:], lambda fens: ["g2a8"] * len(fens))  # right, then wrong
    assert wrong.first and not wrong.line


def test_castling_written_as_the_king_taking_its_rook_is_read_as_the_kings_move(tmp_path):
    castle = "4k3/7p/8/8/8/8/8/4K2R b K - 0 1"
    (p,) = read_puzzles(write(tmp_path, f"c,{castle},h7h6 e1h1,10000000,80,90,100,x,u,")
                        ).puzzles
    assert p.solution == ("e1g1",) and p.band == BANDS[-1][0]  # any rating has a band
    (right,) = solve([p], lambda fens: ["e1g1"] * len(fens))
    (rooks,) = solve([p], lambda fens: ["e1h1"] * len(fens))
    assert right.first and not right.illegal
    assert rooks.illegal and not rooks.first  # not canonical UCI: illegal, never right


def test_illegal_and_missing_answers_are_counted_apart(tmp_path):
    puzzles = read_puzzles(write(
        tmp_path, f"p1,{SCHOLAR},b8c6 h5f7,600,80,90,100,mate,u,")).puzzles
    for answer in ("e1e8", None, "zz99"):
        (r,) = solve(puzzles, lambda fens, a=answer: [a] * len(fens))
        assert r.illegal and not r.first and not r.line
    assert not is_right(chess.Board(puzzles[0].fen), "h5h7", "h5f7")


def test_a_file_without_a_required_column_names_the_file_and_the_header_line(tmp_path):
    path = write(tmp_path, f"p1,{SCHOLAR},b8c6 h5f7,600", header="PuzzleId,FEN,Moves,Rating")
    with pytest.raises(PuzzleFileError, match=r"puzzles\.csv:1: .*Themes"):
        read_puzzles(path)
    with pytest.raises(PuzzleFileError, match="no such puzzle file"):
        read_puzzles(tmp_path / "absent.csv")


def test_bad_rows_are_skipped_and_counted_with_their_line_numbers(tmp_path):
    path = write(tmp_path,
                 f"ok,{SCHOLAR},b8c6 h5f7,600,80,90,100,mate,u,",
                 "broken,not/a/fen w - - 0 1,e2e4 e7e5,600,80,90,100,mate,u,",
                 f"illegal,{SCHOLAR},e2e4 h5f7,600,80,90,100,mate,u,",
                 f"odd,{SCHOLAR},b8c6,600,80,90,100,mate,u,",
                 f"rating,{SCHOLAR},b8c6 h5f7,strong,80,90,100,mate,u,",
                 "junk line without commas",
                 f"ok2,{SCHOLAR},b8c6 h5f7,1600,80,90,100,mate,u,")
    got = read_puzzles(path)
    assert [p.puzzle_id for p in got.puzzles] == ["ok", "ok2"]
    assert len(got.skipped) == 5
    for line, words in zip(range(3, 8), ("broken FEN", "illegal", "setup move",
                                         "whole number", "fields")):
        assert any(s.startswith(f"{path}:{line}:") and words in s for s in got.skipped), \
            (line, got.skipped)


def test_the_reader_keeps_the_first_n_readable_puzzles(tmp_path):
    rows = [f"p{i},{SCHOLAR},b8c6 h5f7,{600 + i},80,90,100,mate,u," for i in range(5)]
    assert [p.puzzle_id for p in read_puzzles(write(tmp_path, *rows), limit=3).puzzles] == \
        ["p0", "p1", "p2"]


def test_extra_columns_of_newer_exports_are_ignored(tmp_path):
    path = tmp_path / "new.csv"
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(HEADER.split(",") + ["DailyDate"])
        w.writerow(["p1", SCHOLAR, "b8c6 h5f7", "600", "80", "90", "100", "mate", "u", "",
                    "2024-01-01"])
    assert len(read_puzzles(path).puzzles) == 1


def test_castling_written_as_the_king_taking_its_rook_is_illegal_as_in_the_rewards():
    """python-chess reads e1h1 as castling; the data and the rewards' legality write it
    e1g1, so a puzzle answer e1h1 is illegal, not a wrong legal move."""
    from rookworld.rewards.parts import legal_moves
    board = chess.Board("r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1")
    assert "e1h1" not in legal_moves(board.fen()) and "e1g1" in legal_moves(board.fen())
    assert not is_legal(board, "e1h1") and not is_right(board, "e1h1", "e1g1")
    assert is_legal(board, "e1g1") and is_right(board, "e1g1", "e1g1")
