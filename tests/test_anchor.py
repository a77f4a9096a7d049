"""The supervised anchor (PPO-ptx): what it draws, that its term moves the weights toward
the ground truth, and the settings it refuses."""

import pytest
import torch
from test_engine import LengthReward

from rookworld.anchor import Anchor
from rookworld.config import ConfigError, compose
from rookworld.data.load import read_samples
from rookworld.train import build_engine, build_parts


class TiedReward(LengthReward):
    """The same score for every completion: every advantage is zero."""

    def __call__(self, sample, completion):
        return super().__call__(sample, "")


def _pools(cfg):
    train = read_samples(cfg.data.train)
    return {t: [s for s in train if s.task == t] for t in "PA"}


def test_the_draw_is_a_function_of_seed_and_step_from_the_named_tasks(tiny_overrides):
    pools = _pools(compose(tiny_overrides))
    a = Anchor(coef=0.1, samples=6, tasks=["A"])
    first = a.draw(pools, 3, 0)
    assert first == a.draw(pools, 3, 0)  # a resumed run draws the same samples
    assert first != a.draw(pools, 4, 0) and first != a.draw(pools, 3, 1)
    assert len(first) == 6 and {s.task for s in first} == {"A"}
    assert {s.task for s in Anchor(coef=0.1, samples=40, tasks=["P"]).draw(pools, 0, 0)} == {"P"}


def _anchor_ce(engine, samples) -> float:
    with torch.no_grad():
        return float(engine.anchor.loss(engine.policy, samples, engine.device))


def test_its_term_lowers_the_cross_entropy_of_the_ground_truth(tiny_overrides):
    """Rewards tied within every group give zero advantages: with KL off, the anchor is the
    only gradient, and three updates lower its cross-entropy on the samples it drew."""
    cfg = compose(tiny_overrides + ["optim.lr=3e-3", "kl=none", "anchor.coef=1.0",
                                    "anchor.samples=4"])
    parts = build_parts(cfg)
    torch.manual_seed(0)
    engine = build_engine(cfg, parts, TiedReward())
    pools = _pools(cfg)
    drawn = parts.anchor.draw(pools, 0, cfg.seed)
    before = _anchor_ce(engine, drawn)
    for step in range(3):
        batch = engine.rollout(parts.task_mix.draw(pools, 2, 0, 0), 0)
        assert float(batch.advantages.abs().max()) == 0.0
        batch.anchor = drawn
        m = engine.update(batch, step)
    assert m["loss/anchor_ce"] < before
    assert _anchor_ce(engine, drawn) < before - 0.05


def test_off_by_default_and_no_term_is_logged(tiny_overrides):
    cfg = compose(tiny_overrides)
    parts = build_parts(cfg)
    assert not parts.anchor.active
    engine = build_engine(cfg, parts, LengthReward())
    pools = _pools(cfg)
    m = engine.update(engine.rollout(parts.task_mix.draw(pools, 2, 0, 0), 0), 0)
    assert "loss/anchor_ce" not in m


@pytest.mark.parametrize("kwargs, words", [
    ({"coef": -0.1}, "anchor.coef"),
    ({"coef": 0.1, "samples": 0}, "anchor.samples"),
    ({"coef": 0.1, "tasks": ["B"]}, "anchor.tasks"),
])
def test_bad_settings_are_refused_by_name(kwargs, words):
    with pytest.raises(ValueError, match=words):
        Anchor(**kwargs)


def test_a_run_whose_data_lacks_the_anchor_task_stops_before_training(tiny_overrides, tmp_path):
    from rookworld.data.load import load_data

    p_only = tmp_path / "p.jsonl"
    cfg = compose(tiny_overrides)
    p_only.write_text("".join(__import__("json").dumps(s.to_json()) + "\n"
                              for s in read_samples(cfg.data.train) if s.task == "P"))
    cfg = compose(tiny_overrides + [f"data.train={p_only}", "anchor.coef=0.1",
                                    "task_mix=policy_only"])
    with pytest.raises(ConfigError, match=r"anchor.tasks needs task\(s\) \['A'\]"):
        load_data(cfg, build_parts(cfg), tmp_path / "run")
