"""rookworld.advantages against hand-computed values: EMA normalisation, EMA and adaptive
baselines, running scale, warm-up, and the state a checkpoint carries."""

import math

import pytest
import torch

from rookworld.advantages import RunningAdvantage, RunningStats


def test_running_stats_by_hand():
    s = RunningStats(momentum=0.75)
    s.update("P", torch.tensor([1.0, 3.0]))  # the first batch sets mean 2, var 1
    assert (s.mean["P"], s.var["P"]) == (2.0, 1.0)
    # mean 0.75 * 2 + 0.25 * 4 = 2.5; var 0.75 * 1 + 0.25 * (0 + (4 - 2)^2) = 1.75
    s.update("P", torch.tensor([4.0, 4.0]))
    assert s.mean["P"] == pytest.approx(2.5) and s.var["P"] == pytest.approx(1.75)
    t = RunningStats(0.75)
    t.load_state_dict(s.state_dict())
    assert (t.mean, t.var) == (s.mean, s.var)


def test_ema_normalisation_then_the_group_mean():
    adv = RunningAdvantage(normalize="ema", scale="none", momentum=0.5, std_floor=0.01)
    r = torch.tensor([0.0, 2.0, 4.0, 6.0])  # one task, groups (0, 2) and (4, 6)
    out = adv(r, 2, ["P"] * 4, step=0)
    # first batch: mean 3, std sqrt(5); z = (r - 3) / sqrt(5) = [-3, -1, 1, 3] / sqrt(5);
    # minus each group's mean (-2 and 2 over sqrt(5)): [-1, 1, -1, 1] / sqrt(5)
    torch.testing.assert_close(out, torch.tensor([-1.0, 1.0, -1.0, 1.0]) / math.sqrt(5))
    assert adv.metrics()["adv/ema_mean/P"] == 3.0
    assert adv.metrics()["adv/ema_std/P"] == pytest.approx(math.sqrt(5))
    # the second batch [3, 3, 3, 7]: mean 0.5 * 3 + 0.5 * 4 = 3.5, var 0.5 * 5 + 0.5 * (3 + 1)
    # = 4.5; group 2's (3, 7) -> (-0.5, 3.5) / sqrt(4.5), minus its mean 1.5 / sqrt(4.5)
    out = adv(torch.tensor([3.0, 3.0, 3.0, 7.0]), 2, ["P"] * 4, step=1)
    torch.testing.assert_close(out, torch.tensor([0.0, 0.0, -2.0, 2.0]) / math.sqrt(4.5))


def test_ema_baseline_moves_a_tied_group_against_the_tasks_usual_reward():
    adv = RunningAdvantage(baseline="ema", scale="none", momentum=0.5)
    first = adv(torch.tensor([0.0, 0.0, 1.0, 1.0]), 2, ["P"] * 4)  # baseline: batch mean 0.5
    torch.testing.assert_close(first, torch.tensor([-0.5, -0.5, 0.5, 0.5]))
    # running mean is now 0.5 (one batch of mean 0.5); a tied group at 1.0 gets +0.5 each
    second = adv(torch.tensor([1.0, 1.0, 1.0, 1.0]), 2, ["P"] * 4)
    torch.testing.assert_close(second, torch.full((4,), 0.5))
    assert adv.base_stats.mean["P"] == pytest.approx(0.75)  # 0.5 * 0.5 + 0.5 * 1.0


def test_per_task_baselines_are_separate():
    adv = RunningAdvantage(baseline="ema", scale="none")
    out = adv(torch.tensor([1.0, 1.0, 5.0, 5.0]), 2, ["P", "P", "A", "A"])
    torch.testing.assert_close(out, torch.zeros(4))  # each task's own first mean
    both = RunningAdvantage(baseline="ema", scale="none", per_task=False)
    torch.testing.assert_close(both(torch.tensor([1.0, 1.0, 5.0, 5.0]), 2, ["P", "P", "A", "A"]),
                               torch.tensor([-2.0, -2.0, 2.0, 2.0]))


def test_adaptive_baseline_weights_by_group_variance():
    adv = RunningAdvantage(baseline="adaptive", scale="none", momentum=0.5)
    adv.base_stats.mean["P"], adv.base_stats.var["P"] = 0.5, 0.25
    r = torch.tensor([0.0, 1.0, 1.0, 1.0])  # group 1: var 0.25 -> w 0.5; group 2 tied -> w 0
    out = adv(r, 2, ["P"] * 4)
    base1 = 0.5 * 0.5 + 0.5 * 0.5  # w * group mean 0.5 + (1 - w) * running mean 0.5
    torch.testing.assert_close(out, torch.tensor([0.0 - base1, 1.0 - base1, 0.5, 0.5]))
    assert adv.metrics()["adv/baseline_weight"] == pytest.approx(0.25)


def test_running_scale_and_warmup():
    adv = RunningAdvantage(baseline="ema", scale="running", warmup_steps=10, warmup_start=0.2)
    r = torch.tensor([0.0, 2.0])  # first batch: baseline 1, running std 1
    torch.testing.assert_close(adv(r, 2, ["P", "P"], step=0), torch.tensor([-0.2, 0.2]))
    assert adv.warmup(5) == pytest.approx(0.6) and adv.warmup(20) == 1.0


@pytest.mark.parametrize("kwargs, match", [
    ({"baseline": "ema", "scale": "group"}, "scale=group divides a tied group"),
    ({"normalize": "zscore"}, "normalize must be one of"),
    ({"normalize": "ema", "scale": "group"}, "gives GRPO's group advantages unchanged"),
    ({"momentum": 1.0}, "momentum"), ({"warmup_start": 2.0}, "warmup"),
])
def test_bad_settings_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RunningAdvantage(**kwargs)
