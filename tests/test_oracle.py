"""The A oracle on 1,000 (FEN, move) pairs from real-looking games, illegal moves
included: its completion parses back and agrees with python-chess computed here."""

import gzip
import json
import random
from pathlib import Path

import chess
import pytest

from rookworld.chess_tasks import env_sample, parse_env
from rookworld.data.positions import drawing_moves, illegal_move, mating_moves

BUNDLED = Path(__file__).resolve().parents[1] / "rookworld/assets/data/train.jsonl.gz"


def _pairs(n: int, seed: int = 0) -> list[tuple[str, str, str]]:
    """(fen, move, kind): a third random legal, a third illegal, the rest the
    game's move or a mating/drawing move where the position has one."""
    rng = random.Random(seed)
    with gzip.open(BUNDLED, "rt") as fh:
        fens = sorted({json.loads(line)["truth"]["fen"] for line in fh})
    rng.shuffle(fens)
    out = []
    for fen in fens:
        board = chess.Board(fen)
        if board.is_game_over():
            continue
        kind = ("legal", "illegal", "end")[len(out) % 3]
        if kind == "illegal":
            move = illegal_move(board, rng)
        elif kind == "end":
            move = rng.choice(mating_moves(board) + drawing_moves(board) or [None])
        else:
            move = rng.choice(list(board.legal_moves)).uci()
        if move is not None:
            out.append((fen, move, kind))
        if len(out) == n:
            break
    return out


@pytest.mark.skipif(not BUNDLED.exists(), reason="bundled data not generated")
def test_oracle_round_trips_and_matches_python_chess():
    pairs = _pairs(1000)
    assert len(pairs) == 1000
    seen = set()
    for fen, move, _ in pairs:
        sample = env_sample(fen, move)
        parsed = parse_env(sample.completion)
        assert parsed.ok, (sample.completion, parsed.reason)
        board = chess.Board(fen)
        mv = chess.Move.from_uci(move)
        if mv not in board.legal_moves:
            expect = (board.fen(), -1.0, 0, 1)
        else:
            board.push(mv)
            over = board.is_game_over()
            reward = 1.0 if board.is_checkmate() else 0.5 if over else 0.001
            expect = (board.fen(), reward, int(over), 0)
        assert (parsed.new_fen, parsed.reward, parsed.terminated, parsed.truncated) == expect
        seen.add(expect[1])
    assert seen == {-1.0, 0.001, 0.5, 1.0}  # every branch of the oracle occurred


def test_en_passant_field_only_when_capture_legal():
    s = env_sample(chess.STARTING_FEN, "e2e4")
    assert parse_env(s.completion).new_fen.split()[3] == "-"
