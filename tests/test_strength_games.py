"""Games: an illegal move loses, the ply limit draws, PGN round trips, the engine
opponent survives a killed process and voids a game it cannot finish."""

from __future__ import annotations

import io
import os
import signal
import sys
import textwrap

import chess
import chess.pgn
import pytest

from rookworld.strength.games import (
    ILLEGAL,
    PLY_LIMIT,
    START,
    UNPARSEABLE,
    VOID,
    EngineMover,
    EngineOpponent,
    Opening,
    RandomMover,
    play_games,
    read_openings,
    to_pgn,
    write_pgn,
)
from rookworld.strength.stats import elo_estimate, median_interval, wilson


def first_legal(fens):
    return [sorted(m.uci() for m in chess.Board(f).legal_moves)[0] for f in fens]


def test_an_illegal_or_unparseable_move_loses_the_game_for_the_side_that_made_it():
    def model(fens):
        return ["e2e5" if chess.Board(f).turn == chess.WHITE else None for f in fens]

    white, black = play_games([START, START], [chess.WHITE, chess.BLACK], model, "m",
                              RandomMover(0))
    assert (white.result, white.termination, white.illegal) == ("0-1", ILLEGAL, "e2e5")
    assert white.score() == 0.0 and white.moves == []
    # as Black the model meets one random move, then gives no move: Black loses
    assert (black.result, black.termination, black.score()) == ("1-0", UNPARSEABLE, 0.0)
    assert len(black.moves) == 1


def test_games_reach_the_board_end_or_the_ply_limit_and_score_from_the_models_side():
    fools = Opening("fool's mate set-up", ("f2f3", "e7e5", "g2g4"))

    def mate_or_first(fens):
        out = []
        for f in fens:
            b = chess.Board(f)
            out.append("d8h4" if b.is_legal(chess.Move.from_uci("d8h4")) else first_legal([f])[0])
        return out
    (won,) = play_games([fools], [chess.BLACK], mate_or_first, "m", RandomMover(0))
    assert (won.result, won.termination, won.score()) == ("0-1", "checkmate", 1.0)
    (limited,) = play_games([START], [chess.WHITE], first_legal, "m", RandomMover(1),
                            max_plies=6)
    assert (limited.result, limited.termination, limited.score()) == ("1/2-1/2", PLY_LIMIT, 0.5)
    assert len(limited.moves) == 6


def test_a_draw_by_repetition_ends_a_game_only_once_it_has_happened():
    shuffle = ["g1f3", "g8f6", "f3g1", "f6g8"]

    def knights(fens):  # both sides shuffle their knights out and back
        return [shuffle[(chess.Board(f).ply()) % 4] for f in fens]
    (game,) = play_games([START], [None], knights, "m", max_plies=40)
    # the initial position occurs a third time after 8 half-moves, not before
    assert (game.result, game.termination, game.legal_plies()) == \
        ("1/2-1/2", "threefold repetition", 8)


def test_self_play_counts_legal_half_moves_and_has_no_score():
    (game,) = play_games([START], [None], first_legal, "m", max_plies=10)
    assert game.score() is None and game.legal_plies() == 10
    assert game.white == game.black == "m"


def test_the_random_mover_is_a_pure_function_of_seed_game_and_position():
    boards = [chess.Board(), chess.Board()]
    a = RandomMover(3).moves(boards, [0, 1])
    assert a == RandomMover(3).moves(boards, [0, 1])
    assert all(chess.Board().is_legal(chess.Move.from_uci(m)) for m in a)
    many = {RandomMover(s).moves([chess.Board()], [0])[0] for s in range(20)}
    assert len(many) > 5


def test_pgn_round_trips_moves_result_headers_and_the_illegal_move_comment(tmp_path):
    ruy = Opening("Ruy Lopez", ("e2e4", "e7e5", "g1f3", "b8c6", "f1b5", "a7a6"))

    def model(fens):
        b = chess.Board(fens[0])
        return ["b5c6"] if b.fullmove_number == 4 else ["a1a8"]
    (game,) = play_games([ruy], [chess.WHITE], model, "rookworld:test", RandomMover(0))
    path = write_pgn([game, game], tmp_path / "g.pgn", "test event", {"Mode": "free"})
    text = path.read_text()
    read = [chess.pgn.read_game(io.StringIO(text))]
    fh = io.StringIO(text)
    games = []
    while (g := chess.pgn.read_game(fh)) is not None:
        games.append(g)
    assert len(games) == 2 and read[0].headers["Round"] == "1"
    g = games[1]
    assert g.headers["White"] == "rookworld:test" and g.headers["Black"] == "random mover"
    assert g.headers["Result"] == game.result == "0-1"
    assert g.headers["Termination"] == "rules infraction" and g.headers["Ending"] == ILLEGAL
    assert g.headers["Mode"] == "free" and g.headers["Date"] != "????.??.??"
    assert g.headers["Opening"] == "Ruy Lopez"
    played = [m.uci() for m in g.mainline_moves()]
    assert played == list(ruy.moves) + game.moves
    assert "illegal move a1a8" in g.end().comment and g.errors == []


def test_openings_file_errors_name_the_file_and_line(tmp_path):
    good = tmp_path / "o.txt"
    good.write_text("# comment\n\nA | e2e4 e7e5\n")
    assert read_openings(good) == [Opening("A", ("e2e4", "e7e5"))]
    bad = tmp_path / "bad.txt"
    bad.write_text("A | e2e4\nB | e2e4 e2e4\n")
    with pytest.raises(ValueError, match=r"bad\.txt:2: B"):
        read_openings(bad)
    bad.write_text("no bar here\n")
    with pytest.raises(ValueError, match=r"bad\.txt:1"):
        read_openings(bad)


def test_stats_wilson_median_and_elo():
    lo, hi = wilson(0, 40)
    assert lo == 0.0 and 0.05 < hi < 0.1  # honest at 0 of 40
    assert median_interval([3, 3, 3])[0] == 3
    est = elo_estimate([1.0, 0.0, 0.5, 0.5], 1350)
    assert est["elo"] == pytest.approx(1350) and est["low"] < 1350 < est["high"]
    zero = elo_estimate([0.0] * 10, 1350)
    assert zero["elo"] is None and zero["low"] is None and zero["high"] < 1350


def test_wilson_bounds_are_exact_at_none_and_all_so_the_elo_has_one_bound():
    for n in range(1, 301):
        assert wilson(0, n)[0] == 0.0 and wilson(n, n)[1] == 1.0
    lost = elo_estimate([0.0] * 11, 1350)  # 11 and 6: the formula's rounding missed 0 and 1
    won = elo_estimate([1.0] * 6, 1350)
    assert lost["low"] is None and lost["high"] < 1350
    assert won["high"] is None and won["low"] > 1350


@pytest.mark.usefixtures("stockfish")
def test_engine_opponent_at_its_floor_restarts_a_killed_process_and_ends_its_engines():
    with EngineOpponent(seconds=0.01, processes=1) as engine:
        assert 1000 <= engine.elo <= 1500  # the engine's floor (Stockfish 15.1: 1350)
        pid = engine.pids()[0]
        os.kill(pid, signal.SIGKILL)
        (game,) = play_games([START], [chess.WHITE], first_legal, "m", engine, max_plies=6)
        assert game.termination == PLY_LIMIT and engine.restarts >= 1
        pids = engine.pids()
    assert not any(alive(p) for p in pids + [pid])


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def dying_engine(tmp_path):
    """A UCI engine that offers UCI_LimitStrength and exits whenever it is asked to search."""
    path = tmp_path / "dying_engine.py"
    path.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import sys
        for line in sys.stdin:
            cmd = line.split()
            if not cmd:
                continue
            if cmd[0] == "uci":
                print("id name dying")
                print("option name UCI_LimitStrength type check default false")
                print("option name UCI_Elo type spin default 1350 min 1350 max 2850")
                print("option name Threads type spin default 1 min 1 max 8")
                print("option name Hash type spin default 16 min 1 max 1024")
                print("uciok", flush=True)
            elif cmd[0] == "isready":
                print("readyok", flush=True)
            elif cmd[0] == "go":
                sys.exit(1)
            elif cmd[0] == "quit":
                break
        """))
    path.chmod(0o755)
    return str(path)


def test_a_game_the_engine_cannot_finish_is_void_and_never_scored(dying_engine):
    with EngineOpponent(path=dying_engine, seconds=0.01, processes=1) as engine:
        (game,) = play_games([START], [chess.BLACK], first_legal, "m", engine)
    assert (game.result, game.termination, game.score()) == ("*", VOID, None)
    assert engine.restarts == 2
    assert "void" in to_pgn(game, "e", 1).end().comment


@pytest.mark.usefixtures("stockfish")
def test_the_node_limited_engine_gives_every_position_the_same_move_in_every_process():
    boards = [chess.Board(),
              chess.Board("r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3"),
              chess.Board("6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 1")]
    first, second = EngineMover(nodes=64), EngineMover(nodes=64)
    try:
        once = first.moves(boards, [0, 1, 2])
        # a second process, asked in another order after other searches, answers alike
        again = second.moves(boards[::-1] + boards, [2, 1, 0, 0, 1, 2])
    finally:
        first.close()
        second.close()
    assert again == once[::-1] + once
    assert once[2] == "a1a8"  # the mate in one
    assert all(chess.Move.from_uci(m) in b.legal_moves for m, b in zip(once, boards))
