"""EnginePool: labels, cache, restart of a dead process, missing binary. Low depth."""

import os
import signal
import threading
import time
from pathlib import Path

import chess
import pytest

from rookworld.chess_tasks.stockfish_pool import EnginePool, against_best

pytestmark = pytest.mark.usefixtures("stockfish")

MATE_IN_1 = "6k1/5ppp/8/8/8/8/5PPP/R5K1 w - - 0 1"  # Ra8#


@pytest.fixture(scope="module")
def pool(engine_pool):
    return engine_pool(processes=2, depth=4)


def test_label_names_engine_and_limit(pool):
    assert pool.limit_label.startswith("stockfish ")
    assert pool.limit_label.endswith(" depth=4")


def test_analyse_startpos_gives_five_legal_moves(pool):
    a = pool.analyse(chess.STARTING_FEN)
    board = chess.Board()
    assert len(a.moves) == len(a.evals) == 5
    assert all(chess.Move.from_uci(m) in board.legal_moves for m in a.moves)
    assert list(a.evals) == sorted(a.evals, reverse=True)  # rank order, best first
    assert a.label == pool.limit_label


def test_mate_in_one_reads_999_99(pool):
    a = pool.analyse(MATE_IN_1)
    assert a.moves[0] == "a1a8"
    assert a.evals[0] == pytest.approx(999.99)  # (100000 - 1) / 100


def test_fewer_legal_moves_than_multipv(pool):
    fen = "7k/8/5Q2/8/8/8/8/K7 b - - 0 1"  # black king: h8g8 or h8h7 only
    assert chess.Board(fen).legal_moves.count() == 2
    assert sorted(pool.analyse(fen).moves) == ["h8g8", "h8h7"]


def test_game_over_position_is_empty(pool):
    mated = "R5k1/5ppp/8/8/8/8/5PPP/6K1 b - - 1 1"
    assert pool.analyse(mated).moves == ()


def test_cache_returns_same_object(pool):
    fen = "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3"
    assert pool.analyse(fen) is pool.analyse(fen)


def test_evaluate_after_side_to_move_view(pool):
    assert pool.evaluate_after(MATE_IN_1, "a1a8") == 1000.0  # mate given: Mate(-0)
    top = pool.analyse(chess.STARTING_FEN)
    blunder = pool.evaluate_after(chess.STARTING_FEN, "g2g4")
    assert "g2g4" not in top.moves  # searched after the move, from the mover's view
    assert blunder < pool.evaluate_after(chess.STARTING_FEN, top.moves[0])
    with pytest.raises(ValueError):
        pool.evaluate_after(chess.STARTING_FEN, "e2e5")


def test_against_best_compares_both_moves_searched_after_them(pool):
    top = pool.analyse(chess.STARTING_FEN).moves
    assert against_best(pool, chess.STARTING_FEN, top[0]) is None  # the best loses nothing
    best, second = against_best(pool, chess.STARTING_FEN, top[1])
    assert best == pool.evaluate_after(chess.STARTING_FEN, top[0])
    assert second == pool.evaluate_after(chess.STARTING_FEN, top[1])
    assert against_best(pool, "8/8/8/8/8/8/4k3/K7 w - - 0 1", "a1b1") is None  # no lines


def test_analyse_many_keeps_order(pool):
    board, fens = chess.Board(), []
    for uci in ["e2e4", "e7e5", "g1f3", "b8c6", "f1b5", "a7a6"]:
        board.push_uci(uci)
        fens.append(board.fen())
    got = pool.analyse_many(fens)
    assert [pool.analyse(f) for f in fens] == got
    for fen, a in zip(fens, got, strict=True):
        assert all(chess.Move.from_uci(m) in chess.Board(fen).legal_moves for m in a.moves)


def test_killed_process_is_restarted():
    with EnginePool(processes=1, depth=3) as p:
        old = p.pids()[0]
        os.kill(old, signal.SIGKILL)
        time.sleep(0.2)
        a = p.analyse(chess.STARTING_FEN)
        assert len(a.moves) == 5
        assert p.restarts == 1 and p.pids()[0] != old


def test_missing_binary_names_install_command():
    with pytest.raises(FileNotFoundError, match="apt-get install -y stockfish"):
        EnginePool(path="/nonexistent/stockfish")


def test_needs_a_limit():
    with pytest.raises(ValueError, match="depth or nodes"):
        EnginePool(depth=None, nodes=None)


def test_nodes_limit_in_label(engine_pool):
    p = engine_pool(processes=1, depth=None, nodes=500)
    assert p.limit_label.endswith(" nodes=500")
    assert len(p.analyse(chess.STARTING_FEN).moves) == 5


def test_a_mate_given_beats_a_mate_on_the_next_turn(engine_pool):
    fen = "7k/8/6K1/8/8/8/8/QR6 w - - 0 1"  # Rb8# mates at once; Qa4 mates a move later
    best, slower = against_best(engine_pool(processes=1, depth=8), fen, "a1a4")
    assert best == 1000.0 and slower == pytest.approx(999.99)


def test_evaluate_after_outside_top_lines(engine_pool):
    two_mates = "6k1/5ppp/8/8/8/8/5PPP/R3R1K1 w - - 0 1"  # Ra8# and Re8#
    queen_hang = "4k3/7r/8/8/8/8/3Q4/4K3 w - - 0 1"  # Qd7+?? Kxd7: rook vs nothing
    p = engine_pool(processes=1, depth=4, multipv=1)
    (top,) = p.analyse(two_mates).moves
    other = ({"a1a8", "e1e8"} - {top}).pop()
    assert p.evaluate_after(two_mates, other) == 1000.0  # mate given
    assert p.evaluate_after(queen_hang, "d2d7") < -5  # mover's view: lost


def _cpu_ticks(pid: int) -> int:
    """User plus system CPU clock ticks the process has used (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def test_engine_pool_survives_a_process_killed_just_before_a_search(engine_pool):
    """python-chess reports this death as a cancelled command, not EngineTerminatedError."""
    fen = "r1bqkb1r/pppp1ppp/2n2n2/4p3/2B1P3/5N2/PPPP1PPP/RNBQK2R w KQkq - 4 4"
    expected = engine_pool(processes=1, depth=8).analyse(fen)
    with EnginePool(processes=1, depth=8) as pool:
        victim = pool.pids()[0]
        os.kill(victim, signal.SIGKILL)
        assert pool.analyse(fen) == expected
        assert pool.restarts == 1 and pool.pids()[0] != victim


def test_engine_pool_survives_a_process_killed_mid_analysis(engine_pool):
    fen = "r1bqkb1r/pppp1ppp/2n2n2/4p3/2B1P3/5N2/PPPP1PPP/RNBQK2R w KQkq - 4 4"
    expected = engine_pool(processes=1, depth=14).analyse(fen)
    with EnginePool(processes=1, depth=14) as pool:
        victim, got = pool.pids()[0], {}
        idle = _cpu_ticks(victim)
        worker = threading.Thread(target=lambda: got.update(a=pool.analyse(fen)))
        worker.start()
        deadline = time.monotonic() + 60
        while _cpu_ticks(victim) == idle and time.monotonic() < deadline:
            time.sleep(0.005)  # kill once the engine is searching, however fast the host
        assert worker.is_alive(), "the analysis finished before the kill: raise the depth"
        os.kill(victim, signal.SIGKILL)
        worker.join(120)
        assert got["a"] == expected  # retried on a fresh process, same label
        assert pool.restarts == 1 and pool.pids()[0] != victim
        assert pool.analyse(fen) is got["a"]  # and cached
