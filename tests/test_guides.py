"""The task guides in docs/guides/ hold code that runs: the reward of rewards.md is built from
its own yaml as a `reward` option and scores hand-made samples, its commands compose, and
the torchrun commands of scaling.md compose as `python -m rookworld.train` would."""

import re
import shlex
import sys
import types

import pytest
from test_documented_commands import overrides
from test_text import ROOT

from rookworld.chess_tasks import env_sample, policy_prompt, policy_sample, policy_text
from rookworld.config import ConfigError, compose, instantiate, validate

GUIDES = ROOT / "docs" / "guides"
REWARDS = GUIDES / "rewards.md"
MODULE = "rookworld.rewards.check_bonus"  # where the guide tells the reader to put the class
CHECK_FEN = "6k1/5ppp/8/8/8/8/5PPP/3R2K1 w - - 0 1"  # d1d8 gives check (and mates)


def blocks(path, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", path.read_text(), re.S)


@pytest.fixture
def reward_module(monkeypatch):
    """The guide's first Python block, run as the module its yaml's `_target_` names."""
    module = types.ModuleType(MODULE)
    monkeypatch.setitem(sys.modules, MODULE, module)
    exec(compile(blocks(REWARDS, "python")[0], str(REWARDS), "exec"), module.__dict__)
    return module


@pytest.fixture
def conf_dir(tmp_path):
    """A config directory holding the guide's yaml as the option reward=check_bonus."""
    (yaml,) = blocks(REWARDS, "yaml")
    assert f"_target_: {MODULE}." in yaml
    (tmp_path / "reward").mkdir()
    (tmp_path / "reward" / "check_bonus.yaml").write_text(yaml)
    return tmp_path


def with_option(conf_dir, args=()) -> list[str]:
    return [f"hydra.searchpath=[file://{conf_dir}]", "reward=check_bonus", *args]


def p_completion(moves, evals, best):
    return policy_text(CHECK_FEN, moves, evals, best)[len(policy_prompt(CHECK_FEN)):]


def test_the_guides_reward_composes_from_its_yaml_and_scores_samples(reward_module, conf_dir):
    cfg = compose(with_option(conf_dir))
    validate(cfg)  # the execution whitelist, the keys and their types
    reward = instantiate(cfg.reward)
    assert isinstance(reward, reward_module.CheckBonusReward) and reward.legal_score == 0.5
    moves, evals = ["d1d8", "g1f1", "h2h3"], [999.99, 0.1, 0.05]
    p = policy_sample(CHECK_FEN, moves, evals)
    cases = [(p_completion(moves, evals, "d1d8"), 1.0),  # legal and check
             (p_completion(moves, evals, "g1f1"), 0.5),  # legal
             (p_completion(moves, evals, "d1e2"), 0.0),  # a rook does not move diagonally
             (p_completion(moves, evals, "d1d8") + " e2e4", 0.0),  # malformed: text after B:
             ("B: d1d8", 0.0), ("", 0.0), ("\x00 junk M: E: B: a1a1", 0.0)]
    for completion, score in cases:
        scored = reward(p, completion)
        assert scored.score == score, completion
        assert set(scored.parts) == {"format", "legal", "check"}
        assert reward.range[0] <= scored.score <= reward.range[1]
    a = env_sample("8/8/8/8/8/8/4k3/K7 w - - 0 1", "a1b1")
    assert reward(a, a.completion).score == 1.0
    assert reward(a, a.completion + " ").parts == {"exact": 0.0}
    lower = instantiate(compose(with_option(conf_dir, ["reward.legal_score=0.3"])).reward)
    assert lower(p, cases[1][0]).score == 0.3


def test_a_key_the_guides_reward_does_not_take_is_refused(reward_module, conf_dir):
    with pytest.raises(ConfigError, match="reward.bogus is not an option"):
        validate(compose(with_option(conf_dir, ["+reward.bogus=1"])))


def test_the_guides_scoring_example_prints_what_its_comments_say(reward_module, capsys):
    example = blocks(REWARDS, "python")[1]
    exec(compile(example, str(REWARDS), "exec"), dict(vars(reward_module)))
    printed = capsys.readouterr().out.split()
    said = re.findall(r"# (\d\.\d):", example)
    assert printed == said == ["1.0", "0.5", "0.0"]


def test_the_guides_train_commands_compose_with_the_option(conf_dir, reward_module):
    lines = [m.group(1) for m in re.finditer(r"python -m rookworld\.train(.*)",
                                             REWARDS.read_text())]
    assert lines
    for line in lines:
        words = shlex.split(re.split(r"\s#|`", line.replace("<name>", "check_bonus"))[0])
        validate(compose([f"hydra.searchpath=[file://{conf_dir}]", *overrides(words)]))


TORCHRUN = re.compile(r"torchrun\b.*?-m rookworld\.train\b(.*)")
TORCHRUN_COMMANDS = [(f"{path.name}:{m.group(0)}", m.group(1))
                     for path in sorted(GUIDES.glob("*.md"))
                     for m in TORCHRUN.finditer(path.read_text())]


def test_the_guides_hold_torchrun_commands():
    assert TORCHRUN_COMMANDS


@pytest.mark.parametrize(("where", "text"), TORCHRUN_COMMANDS,
                         ids=[w for w, _ in TORCHRUN_COMMANDS])
def test_a_torchrun_command_composes(where, text):
    compose(overrides(shlex.split(re.split(r"\s#|`", text)[0])))


@pytest.mark.parametrize("name", ["own_model", "rewards", "sweeps", "scaling",
                                  "troubleshooting"])
def test_a_guide_is_short(name):
    assert len((GUIDES / f"{name}.md").read_text().splitlines()) <= 130
