"""reward=engine: hand-worked scores against a table pool, and a real Stockfish pool
at low depth when Stockfish is installed."""

from typing import NamedTuple

import pytest

from rookworld.chess_tasks import (
    PolicyTruth,
    Sample,
    env_sample,
    policy_prompt,
    policy_sample,
    policy_text,
)
from rookworld.rewards import ContinuousReward, EngineReward, GraduatedReward

PROMO_FEN = "8/4P1k1/8/8/8/8/6K1/8 w - - 0 1"
PROMO = policy_sample(PROMO_FEN, ["e7e8q", "e7e8r", "g2f3", "g2h3", "g2g3"],
                      [9.5, 9.4, 0.5, 0.4, 0.3])
MATE_FEN = "6k1/5ppp/8/8/8/8/5PPP/3R2K1 w - - 0 1"


class Analysis(NamedTuple):
    moves: tuple
    evals: tuple
    label: str


class TablePool:
    """Engine stand-in with fixed answers; counts evaluate_after calls."""

    def __init__(self, analyses, after):
        self.analyses, self.after, self.evaluate_calls = analyses, after, 0

    def analyse(self, fen):
        return self.analyses[fen]

    def evaluate_after(self, fen, move):
        self.evaluate_calls += 1
        return self.after[(fen, move)]


def table_pool():
    # the engine ranks the promotion lines as the stored labels do; the searches after each
    # move agree with the lines except g2h3's (a search one ply deeper than its root line)
    after = dict(zip(((PROMO_FEN, m) for m in PROMO.truth.moves), PROMO.truth.evals))
    after[(PROMO_FEN, "g2f2")] = 8.0
    after[(PROMO_FEN, "g2h3")] = 8.9
    return TablePool({PROMO_FEN: Analysis(PROMO.truth.moves, PROMO.truth.evals, "table")},
                     after)


def completion(best, moves=PROMO.truth.moves, evals=PROMO.truth.evals):
    return policy_text(PROMO_FEN, moves, evals, best)[len(policy_prompt(PROMO_FEN)):]


@pytest.mark.parametrize(("best", "score", "cp_loss", "evaluate_calls"), [
    ("e7e8q", 1.0, 0.0, 0),                        # the engine's best: no loss, no search
    # e7e8r: loss 9.5 - 9.4 = .1 pawn -> .2 + .8 * (1 - .1/3) = .97333...
    ("e7e8r", 0.2 + 0.8 * (1 - 0.1 / 3), 10.0, 2),
    # g2f2 is not an analysed line: searched after, 8.0 -> loss 1.5 -> .2 + .8 * .5 = .6
    ("g2f2", 0.6, 150.0, 2),
    # g2h3 is a line (root eval 0.4) but is scored by the search after it, as the best
    # move is: 9.5 - 8.9 = .6 pawn -> .2 + .8 * .8 = .84
    ("g2h3", 0.84, 60.0, 2),
    ("g2g3", 0.2, 300.0, 2),                       # loss 9.2 capped at 3 -> legal_score
    ("e7e8", 0.0, 300.0, 0),                       # no promotion piece: not legal
])
def test_engine_policy_scores(best, score, cp_loss, evaluate_calls):
    pool = table_pool()
    got = EngineReward(pool)(PROMO, completion(best))
    assert got.score == pytest.approx(score, abs=1e-12)
    assert got.parts["cp_loss"] == pytest.approx(cp_loss, abs=1e-9)
    assert pool.evaluate_calls == evaluate_calls


def test_engine_malformed_never_asks_the_engine():
    pool = TablePool({}, {})
    got = EngineReward(pool)(PROMO, completion("e7e8q")[:-3])  # "B: e7e8q" cut to "B: e7"
    assert got.score == -0.3 and got.parts["cp_loss"] == 300.0


def test_engine_parts_keys_fixed_and_include_measured_parts():
    reward = EngineReward(table_pool())
    keys = {tuple(reward(PROMO, completion(b)).parts) for b in ("e7e8q", "g2f2", "e7e8")}
    keys.add(tuple(reward(PROMO, "junk").parts))
    assert keys == {("format", "legal", "best_legal", "top5", "eval_error", "best", "cp_loss")}


def test_engine_scores_unlabelled_positions():
    unlabelled = Sample("P", policy_prompt(PROMO_FEN), "", PolicyTruth(PROMO_FEN, (), (), ""))
    got = EngineReward(table_pool())(unlabelled, completion("e7e8r"))
    assert got.score == pytest.approx(0.2 + 0.8 * (1 - 0.1 / 3))
    assert got.parts["top5"] == 0.0 and got.parts["best"] == 0.0


def test_engine_position_already_drawn_costs_nothing():
    fen = "8/8/8/8/8/8/4k3/K7 w - - 0 1"  # bare kings: the pool returns no lines
    sample = policy_sample(fen, ["a1b1"], [0.0])
    text = policy_text(fen, ["a1a2"], [0.0], "a1a2")[len(policy_prompt(fen)):]
    got = EngineReward(TablePool({fen: Analysis((), (), "table")}, {}))(sample, text)
    assert got.score == 1.0 and got.parts["cp_loss"] == 0.0


@pytest.mark.parametrize("env", [GraduatedReward(), ContinuousReward(malformed_penalty=0.5)])
def test_engine_env_falls_back(env):
    sample = env_sample(PROMO_FEN, "e7e8q")
    reward = EngineReward(TablePool({}, {}), env=env)
    for text in (sample.completion, "4N3/6k1/8/8/8/8/6K1/8 b - - 0 1+0.001+0+0", "", "+++"):
        assert reward(sample, text) == env(sample, text)
    assert reward.range == (min(-0.3, env.range[0]), 1.0)


def test_engine_rejects_bad_settings():
    with pytest.raises(ValueError, match="max_loss"):
        EngineReward(TablePool({}, {}), max_loss=0)
    with pytest.raises(ValueError, match="legal_score"):
        EngineReward(TablePool({}, {}), legal_score=1.5)


@pytest.fixture(scope="module")
def stockfish_pool(engine_pool):
    return engine_pool(processes=1, depth=6)


def test_real_engine_mate_in_one(stockfish_pool):
    sample = policy_sample(MATE_FEN, ["d1d8"], [999.99])
    reward = EngineReward(stockfish_pool)

    def text(best):
        return policy_text(MATE_FEN, ["d1d8"], [999.99], best)[len(policy_prompt(MATE_FEN)):]

    found = reward(sample, text("d1d8"))
    missed = reward(sample, text("g1f1"))          # misses mate: loss far beyond 3 pawns
    assert found.score == 1.0 and found.parts["cp_loss"] == 0.0
    assert missed.score == pytest.approx(0.2) and missed.parts["cp_loss"] == 300.0
    assert reward(sample, text("g1f1")) == missed  # cached: the same score again


def test_real_engine_bare_kings(stockfish_pool):
    fen = "8/8/8/8/8/8/4k3/K7 w - - 0 1"
    text = policy_text(fen, ["a1a2"], [0.0], "a1a2")[len(policy_prompt(fen)):]
    assert EngineReward(stockfish_pool)(policy_sample(fen, ["a1b1"], [0.0]), text).score == 1.0


def test_the_label_pool_answers_from_the_labels():
    from rookworld.chess_tasks.stockfish_pool import LabelPool, against_best
    pool = LabelPool([PROMO])
    assert against_best(pool, PROMO_FEN, "e7e8q") is None  # the labelled best loses nothing
    assert against_best(pool, PROMO_FEN, "e7e8r") == (9.5, 9.4)
    assert against_best(pool, PROMO_FEN, "g2f2") == (9.5, pytest.approx(0.3 - 1.0))  # unlisted
    assert EngineReward(pool)(PROMO, completion("e7e8r")).score == pytest.approx(
        0.2 + 0.8 * (1 - 0.1 / 3))
    # labels list their moves in any order: the best is the highest eval, not the first
    shuffled = policy_sample(PROMO_FEN, ["g2f3", "e7e8r", "e7e8q"], [0.5, 9.4, 9.5])
    assert against_best(LabelPool([shuffled]), PROMO_FEN, "e7e8q") is None
    assert against_best(LabelPool([shuffled]), PROMO_FEN, "g2f3") == (9.5, 0.5)
