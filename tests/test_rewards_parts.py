"""The measured parts (rookworld/rewards/parts.py), hand-computed."""

import doctest

import pytest

import rookworld.credit
import rookworld.rewards.binary
import rookworld.rewards.curriculum
import rookworld.rewards.parts
from rookworld.chess_tasks import EnvTruth, PolicyTruth
from rookworld.rewards.parts import (
    ENV_PARTS,
    EVAL_CAP,
    POLICY_PARTS,
    env_parts,
    fen_similarity,
    legal_moves,
    policy_parts,
)

KINGS = "8/8/8/8/8/8/4k3/K7 w - - 0 1"  # White: a1b1, a1a2, a1b2
T = PolicyTruth(KINGS, ("a1b1", "a1a2"), (-0.1, -0.3), "a1b1")


@pytest.mark.parametrize("module", [rookworld.rewards.parts, rookworld.rewards.binary,
                                    rookworld.rewards.curriculum, rookworld.credit])
def test_docstring_examples(module):
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


def test_legal_moves_are_canonical_uci():
    moves = legal_moves("r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1")
    assert {"e1g1", "e1c1"} <= moves and "e1h1" not in moves and "e1a1" not in moves
    assert legal_moves(KINGS) == {"a1b1", "a1a2", "a1b2"}


def test_legal_moves_rejects_invalid_truth_fen():
    with pytest.raises(ValueError):
        legal_moves("not a fen")


def test_policy_keys_and_perfect():
    c = " M: a1b1 a1a2  E: -0.1 -0.3  B: a1b1"
    parts = policy_parts(T, c)
    assert tuple(parts) == POLICY_PARTS
    assert parts == {"format": 1.0, "legal": 1.0, "best_legal": 1.0, "top5": 1.0,
                     "eval_error": 0.0, "best": 1.0}


def test_policy_repeated_move_counts_once_for_legal_and_top5():
    # listed (a1b1, a1b1, a1a2): 2 distinct, both legal -> 1.0; top5 2 / max(2, 2) = 1;
    # eval error only from the first a1b1 (0.0) and a1a2 (|-0.5 - -0.3| = .2) -> .1
    parts = policy_parts(T, "M: a1b1 a1b1 a1a2 E: -0.1 5.0 -0.5 B: a1b1")
    assert parts["legal"] == 1.0
    assert parts["top5"] == 1.0
    assert parts["eval_error"] == pytest.approx(0.1)


@pytest.mark.parametrize("completion, legal", [
    ("M: a1b1 a1b1 E: 0 0 B: a1b1", 1.0),            # a repeat counts once
    ("M:  a1b1    a1b1  E: 0  0 B: a1b1", 1.0),      # whitespace does not matter
    ("M: a1b1 a1b1 h7h8 E: 0 0 0 B: a1b1", 0.5),     # 1 of 2 distinct moves legal
    ("M: a1b1 A1B1 E: 0 0 B: a1b1", 1.0),            # upper case is not UCI: not listed
])
def test_policy_legal_is_the_share_of_distinct_listed_moves(completion, legal):
    assert policy_parts(T, completion)["legal"] == legal


def test_policy_more_than_five_moves_is_malformed_in_every_reward():
    from rookworld.chess_tasks import policy_sample
    from rookworld.rewards.continuous import ContinuousReward
    from rookworld.rewards.graduated import GraduatedReward
    fen = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
    s = policy_sample(fen, ("e2e4", "d2d4", "g1f3", "c2c4", "e2e3"), (0.3, 0.3, 0.2, 0.2, 0.1))
    moves, evals = s.truth.moves * 2, s.truth.evals * 2  # the engine's five, twice
    text = f"M: {' '.join(moves)} E: {' '.join(map(str, evals))} B: {s.truth.best}"
    assert policy_parts(s.truth, text)["format"] == 0.0
    assert GraduatedReward()(s, text).score == -0.3
    assert ContinuousReward()(s, text).score < ContinuousReward()(s, s.completion).score


def test_policy_extra_moves_lower_top5():
    # 3 listed, 2 engine moves, overlap 2 -> 2/3
    parts = policy_parts(T, "M: a1b1 a1a2 a1b2 E: -0.1 -0.3 -0.4 B: a1b1")
    assert parts["top5"] == pytest.approx(2 / 3) and parts["legal"] == 1.0


def test_policy_eval_error_capped_per_move_and_when_none_match():
    parts = policy_parts(T, "M: a1b1 a1a2 E: 999.99 -0.3 B: a1b1")
    assert parts["eval_error"] == pytest.approx(EVAL_CAP / 2)  # (10 + 0) / 2
    assert policy_parts(T, "M: a1b2 E: 0.0 B: a1b2")["eval_error"] == EVAL_CAP


def test_policy_eval_error_against_two_decimal_truth():
    truth = PolicyTruth(KINGS, ("a1b1",), (-0.1234,), "a1b1")
    assert policy_parts(truth, "M: a1b1 E: -0.12 B: a1b1")["eval_error"] == 0.0


def test_policy_best_counts_ties():
    truth = PolicyTruth(KINGS, ("a1b1", "a1a2", "a1b2"), (0.0, 0.0, -1.0), "a1b1")
    assert policy_parts(truth, "M: a1a2 E: 0.0 B: a1a2")["best"] == 1.0
    assert policy_parts(truth, "M: a1b2 E: 0.0 B: a1b2")["best"] == 0.0


def test_policy_unparseable_still_reads_lone_best():
    parts = policy_parts(T, "garbage B: a1b1")
    assert parts == {"format": 0.0, "legal": 0.0, "best_legal": 1.0, "top5": 0.0,
                     "eval_error": EVAL_CAP, "best": 1.0}


E = EnvTruth(KINGS, "a1b1", ("a1b1",), "8/8/8/8/8/8/4k3/1K6 b - - 1 1", "0.001", 0, 0)


def test_env_keys_and_perfect():
    parts = env_parts(E, "8/8/8/8/8/8/4k3/1K6 b - - 1 1+0.001+0+0")
    assert tuple(parts) == ENV_PARTS and set(parts.values()) == {1.0}


def test_env_reward_value_not_text():
    # "0.0010" is the value 0.001: reward right, but the text is not exact
    parts = env_parts(E, "8/8/8/8/8/8/4k3/1K6 b - - 1 1+0.0010+0+0")
    assert parts["reward"] == 1.0 and parts["format"] == 1.0 and parts["exact"] == 0.0


def test_env_flags_need_both():
    assert env_parts(E, "8/8/8/8/8/8/4k3/1K6 b - - 1 1+0.001+1+0")["flags"] == 0.0
    assert env_parts(E, "8/8/8/8/8/8/4k3/1K6 b - - 1 1+0.001+0+1")["flags"] == 0.0


@pytest.mark.parametrize(("fen", "expected"), [
    ("8/8/8/8/8/8/4k3/1K6 b - - 1 1", 1.0),
    ("8/8/8/8/8/8/4k3/K7 b - - 1 1", (5 * 62 + 64 * 5) / 640),  # a1, b1 differ
    ("8/8/8/8/8/8/4k3/1K6 w - - 0 2", (5 * 64 + 64 * 2) / 640),  # 3 fields differ
    ("8/8/8/8/8/8/4k3/1K6", (5 * 64) / 640),  # no fields
    ("8/8/8/8", (5 * 32) / 640),  # ranks 8-5 empty and right, ranks 4-1 missing
    ("44/8/8/8/8/8/4k3/1K6 b", (5 * 64 + 64) / 640),  # "44" is 8 empty squares
    ("9/8/8/8/8/8/4k3/1K6 b - - 1 1", (5 * 56 + 64 * 5) / 640),  # "9" is one unknown symbol
    ("", 0.0),
    ("P" * 100000 + "/" * 100000, 0.0),
    ("8" * 100000, (5 * 8) / 640),
])
def test_fen_similarity(fen, expected):
    assert fen_similarity(fen, E.new_fen) == pytest.approx(expected, abs=1e-15)
