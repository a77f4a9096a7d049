"""The prompt filter: off, it trains on the draw; on, on the drawn prompts whose greedy
answers score lowest, and a run with it logs what it kept."""

import json

import pytest
import torch
from test_engine import LengthReward

from rookworld.config import ConfigError, compose
from rookworld.data.load import read_samples
from rookworld.held_out import Evaluator
from rookworld.prompt_filter import HardestGreedy, greedy_scores
from rookworld.rewards.base import Scored
from rookworld.train import build_engine, build_parts, run


class CharReward(LengthReward):
    """A score that differs between answers of the same length (the tiny model's greedy
    answers all fill their budget)."""

    def __call__(self, sample, completion):
        return Scored(sum(map(ord, completion)) % 97 / 96, {})


def _pools(cfg):
    train = read_samples(cfg.data.train)
    return {t: [s for s in train if s.task == t] for t in "PA"}


def test_off_it_draws_and_keeps_the_prompts_of_the_step(tiny_overrides):
    cfg = compose(tiny_overrides + ["prompt_filter.oversample=1"])
    parts = build_parts(cfg)
    f = parts.prompt_filter
    assert not f.active and f.drawn(16) == 16
    drawn = parts.task_mix.draw(_pools(cfg), 4, 0, 0)
    assert f.select(None, drawn, 4, 0) == (drawn, {})  # nothing decoded: no engine needed


def test_a_larger_draw_begins_with_the_draw_it_extends(tiny_overrides):
    """Oversampling adds prompts after the step's own draw, so oversample=1 trains on
    exactly the prompts a run without the filter draws."""
    cfg = compose(tiny_overrides)
    mix, pools = build_parts(cfg).task_mix, _pools(cfg)
    assert mix.draw(pools, 8, 3, 0)[:4] == mix.draw(pools, 4, 3, 0)


def test_it_keeps_the_prompts_whose_greedy_answers_score_lowest(tiny_overrides):
    cfg = compose(tiny_overrides + ["prompt_filter.oversample=3"])
    parts = build_parts(cfg)
    torch.manual_seed(0)
    engine = build_engine(cfg, parts, CharReward())
    drawn = parts.task_mix.draw(_pools(cfg), parts.prompt_filter.drawn(4), 0, 0)
    assert len(drawn) == 12
    kept, m = parts.prompt_filter.select(engine, drawn, 4, 0)
    # the greedy answers again, decoded per task in one batch each
    greedy = Evaluator(drawn, parts.sampling)
    score = {}
    for task, items in greedy.samples.items():
        for s, text in zip(items, greedy.completions(engine.policy, task)):
            score[id(s)] = CharReward()(s, text).score
    scores = [score[id(s)] for s in drawn]
    assert len(set(scores)) > 1  # the test means something: answers differ
    order = sorted(range(12), key=lambda i: (scores[i], i))
    assert kept == [drawn[i] for i in sorted(order[:4])]  # lowest four, in draw order
    assert m["filter/greedy_reward_kept"] == pytest.approx(sum(sorted(scores)[:4]) / 4)
    assert m["filter/greedy_reward_drawn"] == pytest.approx(sum(scores) / 12)
    assert m["filter/greedy_reward_kept"] <= m["filter/greedy_reward_drawn"]


@pytest.mark.parametrize("oversample", [0.5, 0.0, float("nan")])
def test_an_oversample_below_one_is_refused(oversample):
    with pytest.raises(ValueError, match="prompt_filter.oversample"):
        HardestGreedy(oversample)


def test_a_run_with_it_trains_on_prompts_per_step_and_logs_the_filter(tiny_overrides, tmp_path):
    cfg = compose(tiny_overrides + ["prompt_filter.oversample=2", "logger=none"])
    result = run(cfg, tmp_path)
    assert result.outcome.status == "success"
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "filter/greedy_reward_kept" in r]
    assert [r["step"] for r in steps] == [0, 1]
    for r in steps:
        assert r["filter/greedy_reward_kept"] <= r["filter/greedy_reward_drawn"]
        assert r["time/filter_s"] > 0
        assert r["sample/tokens"] <= 2 * 2 * 24  # prompts_per_step x G rows, not the draw's


class TwoRanks:
    """One rank of two for `HardestGreedy.select`: the gather returns this rank's (index,
    score) pairs and the other rank's, decoded here as that rank would (every 2nd prompt)."""

    def __init__(self, rank: int, engine, drawn):
        self.rank, self.world, self.engine, self.drawn = rank, 2, engine, drawn

    def all_gather_list(self, items: list) -> list:
        other = range(1 - self.rank, len(self.drawn), 2)
        theirs = list(zip(other, greedy_scores(self.engine, [self.drawn[i] for i in other], 0)))
        return (items + theirs) if self.rank == 0 else (theirs + items)


def test_ranks_that_each_decode_a_share_keep_what_one_process_keeps(tiny_overrides):
    """Five drawn prompts split 3 + 2 over two ranks: every rank keeps the prompts one
    process keeps."""
    cfg = compose(tiny_overrides + ["prompt_filter.oversample=2.5"])
    parts = build_parts(cfg)
    torch.manual_seed(0)
    engine = build_engine(cfg, parts, CharReward())
    drawn = parts.task_mix.draw(_pools(cfg), parts.prompt_filter.drawn(2), 0, 0)
    alone, m = parts.prompt_filter.select(engine, drawn, 2, 0)
    assert len(drawn) == 5 and len(set(greedy_scores(engine, drawn, 0))) > 1
    for rank in (0, 1):
        engine.dist = TwoRanks(rank, engine, drawn)
        kept, m_rank = parts.prompt_filter.select(engine, drawn, 2, 0)
        assert kept == alone
        assert m_rank["filter/greedy_reward_kept"] == m["filter/greedy_reward_kept"]
    engine.dist = None


def test_a_fixed_batch_turns_the_filter_off_and_refuses_it_on(tiny_overrides):
    assert not build_parts(compose(tiny_overrides + ["task_mix=fixed_batch"])).prompt_filter.active
    assert not build_parts(compose(["experiment=overfit_one_batch"])).prompt_filter.active
    with pytest.raises(ConfigError, match="set prompt_filter.oversample=1"):
        build_parts(compose(tiny_overrides
                            + ["task_mix=fixed_batch", "prompt_filter.oversample=2"]))
