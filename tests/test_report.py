"""`python -m rookworld.report`: on a hand-written run directory, every number in the
Markdown is worked out by hand; the plots exist, are labelled and keep flat lines flat."""

import json

import matplotlib.pyplot as plt
import pytest
import yaml
from omegaconf import OmegaConf

from rookworld import report
from rookworld.config import compose

OVERRIDES = ["kl=adaptive", "steps=4"]


def _train_row(step, reward):
    return {"step": step, "reward/mean": reward, "reward/P/mean": reward + 0.1,
            "reward/A/mean": reward - 0.1, "kl/k3": 0.01 * step, "kl/value": 0.01 * step,
            "kl/coef": 0.04, "policy/entropy": 2.0, "policy/clip_frac_low": 0.0,
            "policy/clip_frac_high": 0.02, "groups/zero_variance_share": 0.5,
            "time/step_s": 2.0 + step}


def _eval_row(step, best, error):
    return {"step": step, "eval/P/best": best, "eval/P/eval_error": error,
            "eval/reward": best - 0.5, "time/eval_s": 3.0}


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "2026-11-22_09-00-00"
    (d / ".hydra").mkdir(parents=True)
    OmegaConf.save(compose(OVERRIDES), d / ".hydra" / "config.yaml")
    (d / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(OVERRIDES))
    rows = [_eval_row(-1, 0.1, 2.0), _train_row(0, -0.3), _train_row(1, -0.1),
            _eval_row(1, 0.4, 1.5), _train_row(2, 0.1), _train_row(3, 0.3),
            _eval_row(3, 0.3, 1.0)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows)
                                     + '{"step": 4, "rew')
    (d / "outcome.json").write_text(json.dumps({
        "status": "success", "step": 4, "reason": "", "objective": -0.2,
        "initial_eval": rows[0], "final_eval": rows[-1]}))
    ex = {"prompt": "P: 8/8 w - - 0 1 ", "completion": "M: a", "reference": "M: b"}
    (d / "examples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"step": 1, "task": "P", "reward": 0.5, **ex},
        {"step": 3, "task": "P", "reward": 0.7, **ex},
        {"step": 3, "task": "A", "reward": 0.9, **ex, "prompt": "A: x"}]))
    (d / "data_report.json").write_text(json.dumps({"train": {"P": 10, "A": 12},
                                                    "eval": {"P": 3, "A": 4}}))
    return d


def test_report_markdown_by_hand(run_dir):
    md = report.write_report(run_dir).read_text()
    assert md.startswith("# Run report: 2026-11-22_09-00-00\n")
    assert "- Command: `python -m rookworld.train kl=adaptive steps=4`" in md
    assert "- Outcome: **success** at step 4\n- Objective (eval/reward): -0.200" in md
    # 4 training rows, 3 evaluations (the torn last line is skipped); median of 2,3,4,5 s
    assert "- Logged: 4 training steps, 3 evaluations, median 3.5 s per step" in md
    assert "- Data: train P 10, A 12; held-out P 3, A 4, evaluated on at most 500 per task" in md
    assert "| `kl` | `adaptive` |" in md and "| `steps` | `4` |" in md
    assert ("| `kl._target_` | `rookworld.kl_schedule.FixedKL` "
            "| `rookworld.kl_schedule.AdaptiveKL` |") in md
    # before -1, after 3, best over -1, 1, 3; eval_error is lower-better
    assert "| eval/P/best | 0.100 | 0.300 | +0.200 | 0.400 (1) |" in md
    assert "| eval/P/eval_error | 2.000 | 1.000 | -1.000 | 1.000 (3) |" in md
    assert md.index("| eval/P/eval_error") < md.index("| eval/reward | -0.400 | -0.200")
    # first/last step and means of the first and last 4 (window 5 > 4 rows)
    assert "| reward/mean | -0.3 | 0.3 | 0 | 0 |" in md  # fmean(-0.3, -0.1, 0.1, 0.3)
    assert "| kl/value | 0 | 0.03 | 0.015 | 0.015 |" in md
    assert "Greedy completions at the last evaluation (step 3)" in md
    assert "- P, reward 0.700" in md and "- A, reward 0.900" in md and "reward 0.500" not in md
    for name in ("overview", "reward", "kl", "entropy", "clip", "eval"):
        assert f"![{name}]({name}.png)" in md
        assert (run_dir / "report" / f"{name}.png").stat().st_size > 10_000


def test_the_speed_line_is_the_median_step_time(run_dir):
    """One slow step (a first step building its kernels, say) moves the mean, not the median
    the header reports: 3, 4, 5 and 60 s give 4.5 s (the mean would be 18 s)."""
    run = report.load_run(run_dir)
    run.train[0]["time/step_s"] = 60.0
    assert "- Logged: 4 training steps, 3 evaluations, median 4.5 s per step" \
        in report.markdown(run, [])


def test_train_table_window(run_dir):
    lines = report.train_table(report.load_run(run_dir), window=2)
    # first two rows: kl 0, 0.01 -> 0.005; last two: 0.02, 0.03 -> 0.025
    assert "| kl/value | 0 | 0.03 | 0.005 | 0.025 |" in lines


def test_series_last_row_of_a_repeated_step_wins():
    rows = [{"step": 0, "x": 1.0}, {"step": 1, "x": 2.0}, {"step": 1, "x": 3.0}, {"step": 2}]
    assert report.series(rows, "x") == ([0, 1], [1.0, 3.0])


def test_panels_label_axes_and_say_when_nothing_was_logged(run_dir):
    run = report.load_run(run_dir)
    fig, (a, b, c) = plt.subplots(1, 3)
    report.draw(a, report.KL, run)
    report.draw(b, report.ENTROPY, run)
    run.train = [{k: v for k, v in r.items() if not k.startswith("policy/clip")}
                 for r in run.train]
    report.draw(c, report.CLIP, run)
    assert a.get_xlabel() == "training step" and a.get_ylabel() == "nats per token"
    labels = [t.get_text() for t in a.get_legend().get_texts()]
    # the guard's threshold from the run's config; KL (<= 0.03) is far below it: not drawn
    assert labels == ["k3", "guard: k3 > 1.0 (off scale)"] and a.get_ylim()[1] < 0.1
    lo, hi = b.get_ylim()  # entropy 2.0 at every step: +-5% of 2, not a blown-up axis
    assert (lo, hi) == pytest.approx((1.9, 2.1))
    assert [t.get_text() for t in c.texts] == ["not logged in this run"]
    plt.close(fig)


def test_guard_threshold_drawn_when_kl_comes_near_it(run_dir):
    run = report.load_run(run_dir)
    run.train[-1]["kl/k3"] = 0.3  # within a quarter of the threshold 1.0
    fig, ax = plt.subplots()
    report.draw(ax, report.KL, run)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["k3", "guard: k3 > 1.0"]
    assert ax.get_ylim()[1] > 1.0
    plt.close(fig)


def test_clip_panel_explains_zero_with_one_iteration(run_dir):
    run = report.load_run(run_dir)  # algorithm=grpo: num_iterations 1
    fig, ax = plt.subplots()
    report.draw(ax, report.CLIP, run)
    assert "num_iterations=1" in ax.texts[0].get_text()
    plt.close(fig)


def test_dpi_sets_the_picture_size(run_dir, tmp_path):
    report.main([str(run_dir), "--out", str(tmp_path / "small"), "--dpi", "50"])
    import matplotlib.image as mpimg
    height, width = mpimg.imread(tmp_path / "small" / "entropy.png").shape[:2]
    assert (width, height) == (230, 200)  # 4.6 x 4.0 inches at 50 dpi


def test_not_a_run_directory(tmp_path):
    with pytest.raises(SystemExit, match="no metrics.jsonl"):
        report.main([str(tmp_path)])


def test_eval_table_prints_each_figure_with_its_interval():
    from rookworld.held_out import mean_se
    # 10 samples, 3 right: mean 0.3, sd sqrt(0.21 * 10 / 9), se = sd / sqrt(10) = 0.1528
    mean, se = mean_se([1.0] * 3 + [0.0] * 7)
    assert (mean, round(se, 4)) == (0.3, 0.1528)
    first = {"step": -1, "eval/P/best": 0.1, "eval_se/P/best": 0.05, "eval/reward": 0.0}
    last = {"step": 9, "eval/P/best": 0.3, "eval_se/P/best": 0.1, "eval/reward": 0.1}
    run = report.Run(path=None, train=[], evals=[first, last], outcome={}, config={},
                     overrides=[], examples=[], data={})
    lines = report.eval_table(run)
    # 1.96 * 0.05 = 0.098, 1.96 * 0.1 = 0.196, change: hypot(0.098, 0.196) = 0.219
    assert "| eval/P/best | 0.100 ± 0.098 | 0.300 ± 0.196 | +0.200 ± 0.219 | 0.300 (9) |" in lines
    assert "| eval/reward | 0.000 | 0.100 | +0.100 | 0.100 (9) |" in lines  # no error logged


def test_a_mean_of_few_values_gets_students_t_interval_and_one_value_none():
    from rookworld.held_out import change_with_interval, interval, t95
    assert [t95(n) for n in (2, 4, 31, 101)] == pytest.approx([12.706, 3.182, 2.042, 1.984],
                                                              abs=1e-3)
    m = {"eval/strength/selfplay_plies": 6.0, "eval_se/strength/selfplay_plies": 1.0,
         "eval_n/strength/selfplay_plies": 4, "eval_dse/strength/selfplay_plies": 0.5}
    assert interval(m, "eval/strength/selfplay_plies") == pytest.approx(3.182)  # 4 games
    assert change_with_interval({"eval/strength/selfplay_plies": 5.0}, m,
                                "eval/strength/selfplay_plies") == "+1.000 ± 1.591"
    one = {"eval/strength/engine_score": 0.5, "eval_se/strength/engine_score": 0.0,
           "eval_n/strength/engine_score": 1}
    assert interval(one, "eval/strength/engine_score") is None  # not "± 0.000"
    assert interval({"eval/P/best": 0.3, "eval_se/P/best": 0.01, "eval_n/P": 500},
                    "eval/P/best") == pytest.approx(0.01965, abs=1e-5)


def test_a_change_on_the_same_samples_gets_the_paired_interval():
    from rookworld.held_out import change_with_interval, paired_se
    before = {"eval/P/best": [1.0, 0.0, 1.0, 0.0]}
    after = {"eval/P/best": [1.0, 1.0, 1.0, 0.0], "eval/P/other": [1.0]}
    # differences 0, 1, 0, 0: mean 0.25, sd sqrt((3 * 0.0625 + 0.5625) / 3) = 0.5, se 0.25;
    # a key the baseline lacks gets none
    assert paired_se(before, after) == {"eval_dse/P/best": 0.25}
    first = {"eval/P/best": 0.5, "eval_se/P/best": 0.289}
    last = {"eval/P/best": 0.75, "eval_se/P/best": 0.25, "eval_dse/P/best": 0.25}
    assert change_with_interval(first, last, "eval/P/best") == "+0.250 ± 0.490"  # 1.96 * 0.25


def test_strength_figures_are_plotted_and_their_losses_are_lower_better(run_dir):
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()[:-1]]
    strength = {-1: (0.05, 170.0, 0.20), 1: (0.08, 120.0, 0.10), 3: (0.06, 140.0, 0.15)}
    for r in rows:
        if r["step"] in strength and "eval/reward" in r:
            first, acpl, illegal = strength[r["step"]]
            r |= {"eval/strength/puzzles_first": first, "eval/strength/acpl": acpl,
                  "eval/strength/puzzles_illegal": illegal}
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    md = report.write_report(run_dir).read_text()
    assert "| eval/strength/puzzles_first | 0.050 | 0.060 | +0.010 | 0.080 (1) |" in md
    assert "| eval/strength/acpl | 170.000 | 140.000 | -30.000 | 120.000 (1) |" in md
    assert "| eval/strength/puzzles_illegal | 0.200 | 0.150 | -0.050 | 0.100 (1) |" in md
    assert (run_dir / "report" / "strength.png").stat().st_size > 10_000


def test_a_metric_only_one_evaluation_has_keeps_its_row():
    """The centipawn loss of a start that answered nothing legally is absent: the row stays,
    with "-" where a figure is missing."""
    from rookworld.held_out import before_after_table
    first = {"eval/reward": 0.1}
    last = {"eval/reward": 0.2, "eval/strength/acpl": 150.0, "eval_se/strength/acpl": 10.0,
            "eval_n/strength/acpl": 3}
    assert "| eval/strength/acpl | - | 150.000 ± 43.030 | - |" in before_after_table(first, last)


def test_the_run_reports_table_keeps_a_metric_only_one_evaluation_has():
    first = {"step": -1, "eval/reward": 0.0}
    last = {"step": 9, "eval/reward": 0.1, "eval/strength/acpl": 150.0}
    run = report.Run(path=None, train=[], evals=[first, last], outcome={}, config={},
                     overrides=[], examples=[], data={})
    assert "| eval/strength/acpl | - | 150.000 | - | |" in report.eval_table(run)


def test_a_resumed_run_reports_its_steps_and_the_resume_command(run_dir):
    """`resume=<run> steps=5` leaves .hydra/ as the first command wrote it (steps=4): the
    report reads run_config.yaml (steps 5) and lists the resume's overrides."""
    cfg = compose(OVERRIDES)
    cfg.steps = 5
    OmegaConf.save(cfg, run_dir / "run_config.yaml")
    resume = run_dir / ".hydra-resumes" / "2026-11-23_08-00-00"
    resume.mkdir(parents=True)
    (resume / "overrides.yaml").write_text(yaml.safe_dump([f"resume={run_dir}", "steps=5"]))
    md = report.write_report(run_dir).read_text()
    assert ("- Command: `python -m rookworld.train kl=adaptive steps=4`\n"
            f"- Resumed: `python -m rookworld.train resume={run_dir} steps=5`\n") in md
    assert "| `steps` | `4` |\n| `resume: steps` | `5` |\n" in md
    assert "| `steps` | `45` | `5` |" in md  # the config against the defaults
    assert report.load_run(run_dir).config["steps"] == 5
