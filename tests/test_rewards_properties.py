"""Property tests: every reward option on hostile text (any string, any unicode, any
length, truncated and corrupted correct answers) returns a finite, deterministic score
inside its documented range with fixed part names; a correct answer scores the
maximum; a completion no better in any part never scores higher.

Example counts come from the hypothesis profile (tests/conftest.py):
HYPOTHESIS_PROFILE=ci runs thousands.
"""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rookworld.chess_tasks import env_sample, policy_sample
from rookworld.chess_tasks.stockfish_pool import LabelPool
from rookworld.rewards import (
    ENV_PARTS,
    EVAL_CAP,
    POLICY_PARTS,
    BinaryReward,
    ContinuousReward,
    CurriculumReward,
    EngineReward,
    GraduatedReward,
)

SAMPLES = [
    policy_sample("1B2k3/1n3p2/1pr1p1p1/7p/1PPR3P/4K1P1/5P2/8 b - - 0 35",
                  ["b7d8", "e8e7", "f7f6", "b6b5", "c6c8"], [-1.2, -2.41, -0.13, -1.67, -0.22]),
    policy_sample("6k1/5ppp/8/8/8/8/5PPP/3R2K1 w - - 0 1",
                  ["d1d8", "g1f1", "h2h3", "g2g3", "f2f3"], [999.99, 4.1, 4.0, 3.9, 3.8]),
    policy_sample("8/4P1k1/8/8/8/8/6K1/8 w - - 0 1",
                  ["e7e8q", "e7e8r", "g2f3", "g2h3", "g2g3"], [9.5, 9.4, 0.5, 0.4, 0.3]),
    policy_sample("rnbqkbnr/ppp1p1pp/8/3pPp2/8/8/PPPP1PPP/RNBQKBNR w KQkq f6 0 3",
                  ["e5f6", "d2d4", "g1f3", "e5e6", "f1b5"], [0.9, 0.5, 0.4, 0.3, 0.2]),
    env_sample("rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1", "e2e4"),
    env_sample("rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1", "e2e5"),
    env_sample("rnbqkbnr/pppp1ppp/8/4p3/6P1/5P2/PPPPP2P/RNBQKBNR b KQkq - 0 2", "d8h4"),
    env_sample("7k/8/5K2/8/8/8/8/6Q1 w - - 0 1", "g1g6"),
    env_sample("r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1", "e1g1"),
]

LADDERS = {"binary": BinaryReward(), "graduated": GraduatedReward(),
           "continuous": ContinuousReward(),
           "continuous_custom": ContinuousReward(malformed_penalty=1.0,
                                                 policy_weights={"best": 0.0, "top5": 2.0})}
REWARDS = dict(LADDERS,
               curriculum_mid=CurriculumReward(GraduatedReward(), BinaryReward(), 100).at(37),
               engine=EngineReward(LabelPool(SAMPLES)))
PART_KEYS = {"P": set(POLICY_PARTS), "A": set(ENV_PARTS)}

CHESSY = "abcdefgh12345678qrbnkpKQRBNPwW-+/ .:MEB09\n\t"
texts = st.one_of(st.text(), st.text(alphabet=CHESSY), st.binary().map(
    lambda b: b.decode("utf-8", "replace")))
samples = st.sampled_from(SAMPLES)


def check(sample, completion):
    """Every reward: finite, in range, deterministic, fixed part names; returns scores."""
    scores = {}
    for name, reward in REWARDS.items():
        got = reward(sample, completion)
        again = reward(sample, completion)
        low, high = reward.range
        assert math.isfinite(got.score) and low <= got.score <= high, (name, got)
        assert got == again, name
        assert PART_KEYS[sample.task] <= set(got.parts), name
        assert all(isinstance(v, float) and math.isfinite(v) for v in got.parts.values())
        scores[name] = got.score
    return scores


def test_correct_answer_scores_the_maximum():
    for sample in SAMPLES:
        for name, score in check(sample, sample.completion).items():
            assert score == REWARDS[name].range[1] == 1.0, (name, sample.prompt)


def test_parts_keys_are_the_same_for_every_call_of_a_task():
    for name, reward in REWARDS.items():
        for task in "PA":
            keys = {tuple(reward(s, t).parts) for s in SAMPLES if s.task == task
                    for t in ("", "x", s.completion, s.completion[:20])}
            assert len(keys) == 1, (name, task, keys)


@given(samples, texts)
def test_any_text(sample, text):
    check(sample, text)


@settings(max_examples=25)
@given(samples, st.text(min_size=2000, max_size=20000))
def test_long_text(sample, text):
    check(sample, text)


@given(samples, st.data())
def test_truncated_correct_answer(sample, data):
    cut = data.draw(st.integers(0, len(sample.completion)))
    for name, score in check(sample, sample.completion[:cut]).items():
        assert score <= REWARDS[name].range[1]


def mutate(data, text):
    """Up to 3 one-character flips, deletions or insertions, then maybe a cut."""
    for _ in range(data.draw(st.integers(0, 3))):
        i = data.draw(st.integers(0, len(text)))
        char = data.draw(st.one_of(st.sampled_from(CHESSY), st.characters()))
        kind = data.draw(st.sampled_from(["flip", "delete", "insert"]))
        if kind == "insert" or i == len(text):
            text = text[:i] + char + text[i:]
        elif kind == "flip":
            text = text[:i] + char + text[i + 1:]
        else:
            text = text[:i] + text[i + 1:]
    if data.draw(st.booleans()):
        text = text[:data.draw(st.integers(0, len(text)))]
    return text


@given(samples, st.data())
def test_one_character_flip(sample, data):
    i = data.draw(st.integers(0, len(sample.completion) - 1))
    char = data.draw(st.one_of(st.sampled_from(CHESSY), st.characters()))
    flipped = sample.completion[:i] + char + sample.completion[i + 1:]
    for name, score in check(sample, flipped).items():
        assert score <= REWARDS[name].range[1]
        if flipped == sample.completion:
            assert score == REWARDS[name].range[1]


def dominated(worse: dict, better: dict) -> bool:
    """Every part of `worse` no better than in `better` (eval_error: lower is better)."""
    return all(worse[k] >= better[k] if k == "eval_error" else worse[k] <= better[k]
               for k in better)


@given(samples, st.data())
def test_no_better_parts_never_score_higher(sample, data):
    x, y = mutate(data, sample.completion), mutate(data, sample.completion)
    rewards = dict(LADDERS, curriculum_mid=REWARDS["curriculum_mid"])
    scored = {name: (r(sample, x), r(sample, y)) for name, r in rewards.items()}
    parts_x, parts_y = scored["graduated"][0].parts, scored["graduated"][1].parts
    for name, (sx, sy) in scored.items():
        if dominated(parts_x, parts_y):
            assert sx.score <= sy.score, (name, x, y)
        if dominated(parts_y, parts_x):
            assert sy.score <= sx.score, (name, x, y)


share = st.floats(0.0, 1.0)
bit = st.sampled_from([0.0, 1.0])
policy_parts_st = st.fixed_dictionaries({
    "format": bit, "legal": share, "best_legal": bit, "top5": share,
    "eval_error": st.floats(0.0, EVAL_CAP), "best": bit})
env_parts_st = st.fixed_dictionaries({
    "format": bit, "fen_exact": bit, "fen_similarity": share, "reward": bit, "flags": bit,
    "exact": bit})


def improve(data, parts):
    """`parts` with one part made better (or left equal)."""
    key = data.draw(st.sampled_from(sorted(parts)))
    if key == "eval_error":
        return dict(parts, eval_error=data.draw(st.floats(0.0, parts[key])))
    return dict(parts, **{key: data.draw(st.floats(parts[key], 1.0))})


@pytest.mark.parametrize("name", sorted(LADDERS))
@given(data=st.data())
def test_score_never_falls_when_a_part_improves(name, data):
    reward = LADDERS[name]
    for parts_st, score in ((policy_parts_st, reward.policy_score),
                            (env_parts_st, reward.env_score)):
        parts = data.draw(parts_st)
        better = improve(data, parts)
        low, high = reward.range
        assert low <= score(parts) <= score(better) <= high


@given(data=st.data())
def test_graduated_scores_only_its_levels(data):
    reward = GraduatedReward()
    levels = {-0.3, 0.2, 0.4, 0.6, 0.8, 1.0}
    assert reward.policy_score(data.draw(policy_parts_st)) in levels
    assert reward.env_score(data.draw(env_parts_st)) in levels
