"""The reward config group (conf/reward/*.yaml), settings that fail early, and the
curriculum schedule."""

from pathlib import Path

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from rookworld.chess_tasks import env_sample, policy_prompt, policy_sample, policy_text
from rookworld.rewards import (
    BinaryReward,
    BlendReward,
    ContinuousReward,
    CurriculumReward,
    EngineReward,
    GraduatedReward,
    Reward,
)

CONF = Path(__file__).resolve().parents[1] / "conf" / "reward"
OPTIONS = {"binary": BinaryReward, "graduated": GraduatedReward,
           "continuous": ContinuousReward, "engine": EngineReward,
           "graduated_curriculum": CurriculumReward, "legal_moves": ContinuousReward}

FEN = "1B2k3/1n3p2/1pr1p1p1/7p/1PPR3P/4K1P1/5P2/8 b - - 0 35"
P = policy_sample(FEN, ["b7d8", "e8e7", "f7f6", "b6b5", "c6c8"], [-1.2, -2.41, -0.13, -1.67, -0.22])
PUBLIC_B = policy_text(FEN, P.truth.moves, P.truth.evals, "e8e7")[len(policy_prompt(FEN)):]
MATE = policy_sample("6k1/5ppp/8/8/8/8/5PPP/3R2K1 w - - 0 1", ["d1d8", "g1f1"], [999.99, 4.1])
A = env_sample("rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1", "e2e4")


def test_every_option_has_a_yaml():
    assert {p.stem for p in CONF.glob("*.yaml")} == set(OPTIONS)


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_yaml_instantiates_and_scores(name, request):
    cfg = OmegaConf.load(CONF / f"{name}.yaml")
    if name == "engine":
        request.getfixturevalue("stockfish")  # skips without Stockfish
        cfg.pool.depth = 4
    reward = instantiate(cfg, _execution_whitelist_=["rookworld.*"])
    try:
        assert isinstance(reward, OPTIONS[name])
        for sample in (MATE, A):  # mate in one: even a shallow engine agrees
            assert reward(sample, sample.completion).score == reward.range[1] == 1.0
    finally:
        if name == "engine":
            reward.pool.close()


def test_legal_moves_scores_legality_not_the_engine_match():
    reward = instantiate(OmegaConf.load(CONF / "legal_moves.yaml"),
                         _execution_whitelist_=["rookworld.*"])
    graduated = GraduatedReward()
    assert reward(P, P.completion).score == reward(P, PUBLIC_B).score == 1.0  # e8e7: legal
    assert graduated(P, PUBLIC_B).score < graduated(P, P.completion).score == 1.0
    illegal_b = PUBLIC_B.replace("B: e8e7", "B: e8e1")
    assert illegal_b != PUBLIC_B and reward(P, illegal_b).score == 0.5


@pytest.mark.parametrize(("build", "match"), [
    (lambda: BinaryReward(wrong=1.0), "wrong"),
    (lambda: GraduatedReward(malformed_penalty=-0.1), "malformed_penalty"),
    (lambda: GraduatedReward(most_share=1.5), "most_share"),
    (lambda: GraduatedReward(eval_tolerance=-1), "eval_tolerance"),
    (lambda: ContinuousReward(policy_weights={"bogus": 1.0}), "policy_weights.bogus"),
    (lambda: ContinuousReward(env_weights={"exact": -1.0}), "env_weights.exact"),
    (lambda: ContinuousReward(env_weights=dict.fromkeys(
        ["fen_exact", "fen_similarity", "reward", "flags", "exact"], 0.0)), "positive"),
    (lambda: CurriculumReward(GraduatedReward(), BinaryReward(), steps=0), "steps"),
    (lambda: CurriculumReward(GraduatedReward(), BinaryReward(), steps=5, warmup=-1), "warmup"),
])
def test_bad_settings_fail_early_naming_the_key(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_continuous_weights_override_only_what_is_given():
    reward = ContinuousReward(policy_weights={"best": 1.0})
    # PUBLIC_B: every part right but best -> (.15 + .15 + .2 + .1) / (.6 + 1.0) = .375
    assert reward(P, PUBLIC_B).score == pytest.approx(0.6 / 1.6)


def test_unknown_task_is_a_data_bug():
    bad = P.__class__("Q", P.prompt, P.completion, P.truth)
    with pytest.raises(ValueError, match="unknown task"):
        GraduatedReward()(bad, "")


def test_base_reward_at_is_identity():
    reward = GraduatedReward()
    assert isinstance(reward, Reward) and reward.at(10**6) is reward


CURRICULUM = CurriculumReward(GraduatedReward(), BinaryReward(), steps=100, warmup=20)


@pytest.mark.parametrize(("step", "weight", "score"), [
    # PUBLIC_B scores graduated 0.6, binary -1: blend = .6 - 1.6 * w
    (0, 0.0, 0.6), (20, 0.0, 0.6), (45, 0.25, 0.2), (70, 0.5, -0.2), (120, 1.0, -1.0),
    (10**9, 1.0, -1.0),
])
def test_curriculum_moves_from_lenient_to_strict(step, weight, score):
    reward = CURRICULUM.at(step)
    assert isinstance(reward, BlendReward) and reward.weight == weight
    got = reward(P, PUBLIC_B)
    assert got.score == pytest.approx(score, abs=1e-12)
    assert got.parts == GraduatedReward()(P, PUBLIC_B).parts


def test_curriculum_called_directly_scores_as_step_zero():
    assert CURRICULUM(P, PUBLIC_B) == CURRICULUM.at(0)(P, PUBLIC_B)
    assert CURRICULUM.range == (-1.0, 1.0)


def test_curriculum_passes_the_step_to_nested_schedules():
    inner = CurriculumReward(GraduatedReward(), BinaryReward(), steps=10)
    outer = CurriculumReward(inner, BinaryReward(), steps=10**6)
    assert outer.at(10).start.weight == 1.0
