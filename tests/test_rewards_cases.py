"""Hand-worked cases: for each, the completion, its ground truth, and the exact
parts and scores of binary, graduated and continuous, worked out by hand from
the definitions in rookworld/rewards/ (the arithmetic is in the comments).

Continuous uses the default weights: P legal .15, best_legal .15, top5 .2,
eval_error .1 (as 1 - err/10), best .4; A fen_exact .3, fen_similarity .3,
reward .15, flags .15, exact .1; minus 0.3 when not well-formed.
fen_similarity = (5 * squares_right + 64 * fields_right) / 640.
"""

import pytest

from rookworld.chess_tasks import env_sample, policy_prompt, policy_sample, policy_text
from rookworld.rewards import BinaryReward, ContinuousReward, GraduatedReward

REWARDS = {"binary": BinaryReward(), "graduated": GraduatedReward(),
           "continuous": ContinuousReward()}


def p_completion(fen, moves, evals, best):
    """The exact P completion text for these fields (padding as the data has it)."""
    return policy_text(fen, moves, evals, best)[len(policy_prompt(fen)):]


def P(format, legal, best_legal, top5, eval_error, best):
    return {"format": format, "legal": legal, "best_legal": best_legal, "top5": top5,
            "eval_error": eval_error, "best": best}


def A(format, fen_exact, fen_similarity, reward, flags, exact):
    return {"format": format, "fen_exact": fen_exact, "fen_similarity": fen_similarity,
            "reward": reward, "flags": flags, "exact": exact}


PERFECT_P = P(1.0, 1.0, 1.0, 1.0, 0.0, 1.0)
PERFECT_A = A(1.0, 1.0, 1.0, 1.0, 1.0, 1.0)
TOP = {"binary": 1.0, "graduated": 1.0, "continuous": 1.0}

# --- P samples (labels written by hand; every listed engine move is legal) --------------
# Black to move, real rook_val_500 line: public B: e8e7 is the LOWEST eval; truth is f7f6.
BLACK_FEN = "1B2k3/1n3p2/1pr1p1p1/7p/1PPR3P/4K1P1/5P2/8 b - - 0 35"
BLACK = policy_sample(BLACK_FEN, ["b7d8", "e8e7", "f7f6", "b6b5", "c6c8"],
                      [-1.2, -2.41, -0.13, -1.67, -0.22])
MATE_FEN = "6k1/5ppp/8/8/8/8/5PPP/3R2K1 w - - 0 1"  # d1d8 mates
MATE = policy_sample(MATE_FEN, ["d1d8", "g1f1", "h2h3", "g2g3", "f2f3"],
                     [999.99, 4.1, 4.0, 3.9, 3.8])
DRAW_FEN = "8/8/R7/7p/P2K2k1/7r/8/8 w - - 0 56"  # real line: all five lines 0.0
DRAW = policy_sample(DRAW_FEN, ["a4a5", "d4c4", "a6g6", "a6a8", "d4c5"], [0.0] * 5)
PROMO_FEN = "8/4P1k1/8/8/8/8/6K1/8 w - - 0 1"
PROMO = policy_sample(PROMO_FEN, ["e7e8q", "e7e8r", "g2f3", "g2h3", "g2g3"],
                      [9.5, 9.4, 0.5, 0.4, 0.3])
CASTLE_FEN = "4k3/8/8/8/8/8/8/4K2R w K - 0 1"
CASTLE = policy_sample(CASTLE_FEN, ["e1g1", "h1h7", "e1f2", "e1d2", "h1h2"],
                       [6.2, 6.0, 5.9, 5.8, 5.5])
EP_FEN = "rnbqkbnr/ppp1p1pp/8/3pPp2/8/8/PPPP1PPP/RNBQKBNR w KQkq f6 0 3"  # e5f6 en passant
EP = policy_sample(EP_FEN, ["e5f6", "d2d4", "g1f3", "e5e6", "f1b5"], [0.9, 0.5, 0.4, 0.3, 0.2])

P_CASES = [
    ("black/reference", BLACK,
     " " * 36 + "M: b7d8 e8e7 f7f6 b6b5 c6c8" + " " * 6
     + "E: -1.2 -2.41 -0.13 -1.67 -0.22" + " " * 12 + "B: f7f6",
     PERFECT_P, TOP),
    # the public data's B: (lowest eval). Only best is wrong -> rung 0.6 (best legal, legal 1,
    # top5 1); continuous .15+.15+.2+.1 = .6
    ("black/public_B_wrong", BLACK,
     p_completion(BLACK_FEN, BLACK.truth.moves, BLACK.truth.evals, "e8e7"),
     P(1.0, 1.0, 1.0, 1.0, 0.0, 0.0), {"binary": -1.0, "graduated": 0.6, "continuous": 0.6}),
    ("mate/reference", MATE,
     " " * 52 + "M: d1d8 g1f1 h2h3 g2g3 f2f3" + " " * 6
     + "E: 999.99 4.1 4.0 3.9 3.8" + " " * 18 + "B: d1d8",
     PERFECT_P, TOP),
    # mate found but its eval written 9.99: errors (min(990, 10), 0, 0, 0, 0) -> mean 2.0 >
    # tolerance 0.5 -> rung 0.8; continuous .15+.15+.2+.1*(1-.2)+.4 = .98
    ("mate/eval_off", MATE,
     p_completion(MATE_FEN, MATE.truth.moves, [9.99, 4.1, 4.0, 3.9, 3.8], "d1d8"),
     P(1.0, 1.0, 1.0, 1.0, 2.0, 1.0), {"binary": 1.0, "graduated": 0.8, "continuous": 0.98}),
    ("mate/missed", MATE, p_completion(MATE_FEN, MATE.truth.moves, MATE.truth.evals, "g1f1"),
     P(1.0, 1.0, 1.0, 1.0, 0.0, 0.0), {"binary": -1.0, "graduated": 0.6, "continuous": 0.6}),
    ("draw/reference", DRAW,
     " " * 55 + "M: a4a5 d4c4 a6g6 a6a8 d4c5" + " " * 6
     + "E: 0.0 0.0 0.0 0.0 0.0" + " " * 21 + "B: a4a5",
     PERFECT_P, TOP),
    # public B: d4c5 ties at 0.0 with truth.best a4a5: every tied move is best
    ("draw/public_B_tied", DRAW, p_completion(DRAW_FEN, DRAW.truth.moves, [0.0] * 5, "d4c5"),
     PERFECT_P, TOP),
    # two of five listed: top5 2/max(2,5) = .4 -> rung 0.8 (best right, top5 < 1);
    # continuous .15+.15+.2*.4+.1+.4 = .88
    ("draw/two_moves", DRAW, p_completion(DRAW_FEN, ["d4c5", "a4a5"], [0.0, 0.0], "d4c5"),
     P(1.0, 1.0, 1.0, 0.4, 0.0, 1.0), {"binary": 1.0, "graduated": 0.8, "continuous": 0.88}),
    ("promotion/reference", PROMO,
     " " * 58 + "M: e7e8q e7e8r g2f3 g2h3 g2g3" + " " * 4
     + "E: 9.5 9.4 0.5 0.4 0.3" + " " * 21 + "B: e7e8q",
     PERFECT_P, TOP),
    # e7e8 without its piece is not a legal move: legal 4/5, top5 4/5, best not legal
    # -> rung 0.4 (top5 >= .2); continuous .15*.8 + .2*.8 + .1 = .38
    ("promotion/no_piece", PROMO,
     p_completion(PROMO_FEN, ["e7e8", "e7e8r", "g2f3", "g2h3", "g2g3"],
                  PROMO.truth.evals, "e7e8"),
     P(1.0, 0.8, 0.0, 0.8, 0.0, 0.0), {"binary": -1.0, "graduated": 0.4, "continuous": 0.38}),
    ("castling/reference", CASTLE,
     " " * 59 + "M: e1g1 h1h7 e1f2 e1d2 h1h2" + " " * 6
     + "E: 6.2 6.0 5.9 5.8 5.5" + " " * 21 + "B: e1g1",
     PERFECT_P, TOP),
    # king-takes-rook e1h1 is not canonical UCI (e1g1): same arithmetic as no_piece
    ("castling/e1h1", CASTLE,
     p_completion(CASTLE_FEN, ["e1h1", "h1h7", "e1f2", "e1d2", "h1h2"],
                  CASTLE.truth.evals, "e1h1"),
     P(1.0, 0.8, 0.0, 0.8, 0.0, 0.0), {"binary": -1.0, "graduated": 0.4, "continuous": 0.38}),
    ("en_passant/reference", EP,
     " " * 28 + "M: e5f6 d2d4 g1f3 e5e6 f1b5" + " " * 6
     + "E: 0.9 0.5 0.4 0.3 0.2" + " " * 21 + "B: e5f6",
     PERFECT_P, TOP),
    # e5f6 eval written 0.1 (truth 0.9), B: d2d4: eval_error .8/5 = .16, best wrong -> rung 0.6;
    # continuous .15+.15+.2+.1*(1-.016) = .5984
    ("en_passant/wrong_eval", EP,
     p_completion(EP_FEN, EP.truth.moves, [0.1, 0.5, 0.4, 0.3, 0.2], "d2d4"),
     P(1.0, 1.0, 1.0, 1.0, 0.16, 0.0), {"binary": -1.0, "graduated": 0.6, "continuous": 0.5984}),
    # well-formed nonsense: nothing right, eval_error = cap 10 -> 0.2; continuous 0
    ("nonsense_move", EP, "  M: a1a1  E: 0.0  B: a1a1",
     P(1.0, 0.0, 0.0, 0.0, 10.0, 0.0), {"binary": -1.0, "graduated": 0.2, "continuous": 0.0}),
    # cut before B: -> unparseable, no field is read
    ("truncated", EP, EP.completion[:EP.completion.index("B:")],
     P(0.0, 0.0, 0.0, 0.0, 10.0, 0.0), {"binary": -1.0, "graduated": -0.3, "continuous": -0.3}),
    ("empty", EP, "", P(0.0, 0.0, 0.0, 0.0, 10.0, 0.0),
     {"binary": -1.0, "graduated": -0.3, "continuous": -0.3}),
    # text after the best move: malformed, every field right -> continuous 1 - .3 = .7
    ("trailing_text", EP, EP.completion + " e5f6", P(0.0, 1.0, 1.0, 1.0, 0.0, 1.0),
     {"binary": -1.0, "graduated": -0.3, "continuous": 0.7}),
]

# --- A samples (oracle = python-chess) ----------------------------------------------------
START_FEN = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
E4_FEN = "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1"
E4 = env_sample(START_FEN, "e2e4")
FOOL = env_sample("rnbqkbnr/pppp1ppp/8/4p3/6P1/5P2/PPPPP2P/RNBQKBNR b KQkq - 0 2", "d8h4",
                  ["f2f3", "e7e5", "g2g4", "d8h4"])
STALEMATE = env_sample("7k/8/5K2/8/8/8/8/6Q1 w - - 0 1", "g1g6")
BARE_KINGS = env_sample("k7/8/8/8/8/8/1n6/K7 w - - 0 1", "a1b2")
PROMO_A = env_sample(PROMO_FEN, "e7e8q")
CASTLE_A = env_sample("r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1", "e1g1")
EP_A = env_sample(EP_FEN, "e5f6")
ILLEGAL = env_sample(START_FEN, "e2e5")
BLACK_A = env_sample(E4_FEN, "e7e5", ["e2e4", "e7e5"])

A_CASES = [
    ("e4/reference", E4, E4_FEN + "+0.001+0+0", PERFECT_A, TOP),
    # side to move wrong: 64 squares, 4/5 fields -> (320+256)/640 = .9 -> rung 0.8;
    # continuous .3*.9 + .15 + .15 = .57
    ("e4/side_to_move", E4, E4_FEN.replace(" b ", " w ") + "+0.001+0+0",
     A(1.0, 0.0, 0.9, 1.0, 1.0, 0.0), {"binary": -1.0, "graduated": 0.8, "continuous": 0.57}),
    # the input FEN copied: e2, e4 wrong (62), side wrong (4/5) -> 566/640 = .884375 < .9,
    # k = 2 -> 0.6; continuous .3*.884375 + .3 = .5653125
    ("e4/copied_input", E4, START_FEN + "+0.001+0+0",
     A(1.0, 0.0, 0.884375, 1.0, 1.0, 0.0),
     {"binary": -1.0, "graduated": 0.6, "continuous": 0.5653125}),
    # a trailing newline: all fields right, text not exact -> 0.8; continuous 1 - .1 = .9
    ("e4/newline", E4, E4_FEN + "+0.001+0+0\n", A(1.0, 1.0, 1.0, 1.0, 1.0, 0.0),
     {"binary": -1.0, "graduated": 0.8, "continuous": 0.9}),
    # cut after the FEN: malformed; continuous .3 + .3 - .3 = .3
    ("e4/fen_only", E4, E4_FEN, A(0.0, 1.0, 1.0, 0.0, 0.0, 0.0),
     {"binary": -1.0, "graduated": -0.3, "continuous": 0.3}),
    # flag "2" is malformed; continuous .3 + .3 + .15 - .3 = .45
    ("e4/bad_flag", E4, E4_FEN + "+0.001+2+0", A(0.0, 1.0, 1.0, 1.0, 0.0, 0.0),
     {"binary": -1.0, "graduated": -0.3, "continuous": 0.45}),
    ("e4/empty", E4, "", A(0.0, 0.0, 0.0, 0.0, 0.0, 0.0),
     {"binary": -1.0, "graduated": -0.3, "continuous": -0.3}),
    ("mate/reference", FOOL,
     "rnb1kbnr/pppp1ppp/8/4p3/6Pq/5P2/PPPPP2P/RNBQKBNR w KQkq - 1 3+1.0+1+0", PERFECT_A, TOP),
    # mate not seen: reward and terminated wrong, k = 1 -> 0.4; continuous .3 + .3 = .6
    ("mate/missed", FOOL,
     "rnb1kbnr/pppp1ppp/8/4p3/6Pq/5P2/PPPPP2P/RNBQKBNR w KQkq - 1 3+0.001+0+0",
     A(1.0, 1.0, 1.0, 0.0, 0.0, 0.0), {"binary": -1.0, "graduated": 0.4, "continuous": 0.6}),
    # called a draw: reward wrong, flags right, k = 2 -> 0.6; continuous .3+.3+.15 = .75
    ("mate/called_draw", FOOL,
     "rnb1kbnr/pppp1ppp/8/4p3/6Pq/5P2/PPPPP2P/RNBQKBNR w KQkq - 1 3+0.5+1+0",
     A(1.0, 1.0, 1.0, 0.0, 1.0, 0.0), {"binary": -1.0, "graduated": 0.6, "continuous": 0.75}),
    ("stalemate/reference", STALEMATE, "7k/8/5KQ1/8/8/8/8/8 b - - 1 1+0.5+1+0", PERFECT_A, TOP),
    ("stalemate/called_mate", STALEMATE, "7k/8/5KQ1/8/8/8/8/8 b - - 1 1+1.0+1+0",
     A(1.0, 1.0, 1.0, 0.0, 1.0, 0.0), {"binary": -1.0, "graduated": 0.6, "continuous": 0.75}),
    ("bare_kings/reference", BARE_KINGS, "k7/8/8/8/8/8/1K6/8 b - - 0 1+0.5+1+0", PERFECT_A, TOP),
    ("bare_kings/game_goes_on", BARE_KINGS, "k7/8/8/8/8/8/1K6/8 b - - 0 1+0.001+0+0",
     A(1.0, 1.0, 1.0, 0.0, 0.0, 0.0), {"binary": -1.0, "graduated": 0.4, "continuous": 0.6}),
    ("promotion/reference", PROMO_A, "4Q3/6k1/8/8/8/8/6K1/8 b - - 0 1+0.001+0+0", PERFECT_A, TOP),
    # knight instead of queen: 63 squares, 5 fields -> (315+320)/640 = .9921875 -> 0.8;
    # continuous .3*.9921875 + .3 = .59765625
    ("promotion/knight", PROMO_A, "4N3/6k1/8/8/8/8/6K1/8 b - - 0 1+0.001+0+0",
     A(1.0, 0.0, 0.9921875, 1.0, 1.0, 0.0),
     {"binary": -1.0, "graduated": 0.8, "continuous": 0.59765625}),
    ("castling/reference", CASTLE_A, "r3k2r/8/8/8/8/8/8/R4RK1 b kq - 1 1+0.001+0+0",
     PERFECT_A, TOP),
    # rook left on h1: f1 and h1 wrong (62 squares), fields right -> 630/640 = .984375;
    # continuous .3*.984375 + .3 = .5953125
    ("castling/rook_stays", CASTLE_A, "r3k2r/8/8/8/8/8/8/R5KR b kq - 1 1+0.001+0+0",
     A(1.0, 0.0, 0.984375, 1.0, 1.0, 0.0),
     {"binary": -1.0, "graduated": 0.8, "continuous": 0.5953125}),
    ("en_passant/reference", EP_A,
     "rnbqkbnr/ppp1p1pp/5P2/3p4/8/8/PPPP1PPP/RNBQKBNR b KQkq - 0 3+0.001+0+0", PERFECT_A, TOP),
    # captured pawn left on f5: 63 squares -> .9921875 as for the knight
    ("en_passant/pawn_stays", EP_A,
     "rnbqkbnr/ppp1p1pp/5P2/3p1p2/8/8/PPPP1PPP/RNBQKBNR b KQkq - 0 3+0.001+0+0",
     A(1.0, 0.0, 0.9921875, 1.0, 1.0, 0.0),
     {"binary": -1.0, "graduated": 0.8, "continuous": 0.59765625}),
    ("illegal/reference", ILLEGAL, START_FEN + "+-1.0+0+1", PERFECT_A, TOP),
    # played the illegal move as if legal: e2, e5 wrong (62), side wrong (4) -> .884375;
    # reward wrong, truncated wrong: k = 0 -> 0.2; continuous .3*.884375 = .2653125
    ("illegal/played_anyway", ILLEGAL,
     "rnbqkbnr/pppppppp/8/4P3/8/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1+0.001+0+0",
     A(1.0, 0.0, 0.884375, 0.0, 0.0, 0.0),
     {"binary": -1.0, "graduated": 0.2, "continuous": 0.2653125}),
    ("black/reference", BLACK_A,
     "rnbqkbnr/pppp1ppp/8/4p3/4P3/8/PPPP1PPP/RNBQKBNR w KQkq - 0 2+0.001+0+0", PERFECT_A, TOP),
    # fullmove not incremented after Black's move: 64 squares, 4/5 fields -> .9 -> 0.8
    ("black/fullmove", BLACK_A,
     "rnbqkbnr/pppp1ppp/8/4p3/4P3/8/PPPP1PPP/RNBQKBNR w KQkq - 0 1+0.001+0+0",
     A(1.0, 0.0, 0.9, 1.0, 1.0, 0.0), {"binary": -1.0, "graduated": 0.8, "continuous": 0.57}),
]

CASES = P_CASES + A_CASES


@pytest.mark.parametrize(("name", "sample", "completion", "parts", "scores"), CASES,
                         ids=[c[0] for c in CASES])
def test_hand_worked_case(name, sample, completion, parts, scores):
    for option, expected in scores.items():
        got = REWARDS[option](sample, completion)
        assert got.parts == pytest.approx(parts, abs=1e-12), (option, got.parts)
        assert got.score == pytest.approx(expected, abs=1e-12), option


@pytest.mark.parametrize(("name", "sample"), [(c[0], c[1]) for c in CASES if "reference" in c[0]])
def test_reference_completion_is_the_case_text(name, sample):
    """The hand-written reference texts are the oracle's / generator's own."""
    case = next(c for c in CASES if c[0] == name and c[1] is sample)
    assert case[2] == sample.completion


def test_public_black_best_is_lowest_eval():
    """The defect the BLACK case guards: the public B: (e8e7) has the lowest eval."""
    evals = dict(zip(BLACK.truth.moves, BLACK.truth.evals, strict=True))
    assert min(evals, key=evals.get) == "e8e7" and BLACK.truth.best == "f7f6"


@pytest.mark.parametrize("option", sorted(REWARDS))
@pytest.mark.parametrize("ladder", [
    # each completion no better in any part than the one before it
    [E4.completion, E4.completion + "\n", E4_FEN.replace(" b ", " w ") + "+0.001+0+0",
     START_FEN + "+0.001+0+0", START_FEN + "+0.5+0+0", START_FEN + "+0.5+1+0",
     START_FEN + "+0.5+1+", ""],
    [MATE.completion,
     p_completion(MATE_FEN, MATE.truth.moves, [9.99, 4.1, 4.0, 3.9, 3.8], "d1d8"),
     p_completion(MATE_FEN, MATE.truth.moves, [9.99, 4.1, 4.0, 3.9, 3.8], "g1f1"),
     p_completion(MATE_FEN, ["g1f1", "h2h3", "a1a1"], [0.0, 0.0, 0.0], "g1f1"),
     p_completion(MATE_FEN, ["a2a1", "a1a1"], [4.1, 0.0], "g1f1"),
     p_completion(MATE_FEN, ["a2a1", "a1a1"], [4.1, 0.0], "a1a1"),
     p_completion(MATE_FEN, ["a2a1", "a1a1"], [4.1, 0.0], "a1a1")[:-1] + "x"],
], ids=["A", "P"])
def test_worse_never_scores_higher(option, ladder):
    sample = E4 if ladder[0] == E4.completion else MATE
    scores = [REWARDS[option](sample, c).score for c in ladder]
    assert scores == sorted(scores, reverse=True), scores
