"""`python -m rookworld.diff`: flattening, hand-worked diffs, the argument kinds, and every
experiment overlay composing and training for a step."""

import json

import pytest
import yaml
from omegaconf import OmegaConf

from rookworld import diff
from rookworld.config import CONF_DIR, compose
from rookworld.train import build_parts, run

EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))


def test_flatten_dotted_paths_lists_and_empty_dicts_are_leaves():
    d = {"a": {"b": 1, "c": {}, "d": {"e": None}}, "l": [1, {"x": 2}]}
    assert diff.flatten(d) == {"a.b": 1, "a.c": {}, "a.d.e": None, "l": [1, {"x": 2}]}


def test_diff_dicts_by_hand():
    a = {"kl": {"_target_": "Fixed", "beta": 0.04}, "seed": 0, "guard": {"kl": {"t": 1.0}},
         "tags": [1]}
    b = {"kl": {"_target_": "NoKL"}, "seed": 0, "guard": {"kl": None}, "tags": [1, 2],
         "new": {"x": True}}
    assert diff.diff_dicts(a, b) == {
        "added": [("guard.kl", None), ("new.x", True)],
        "removed": [("guard.kl.t", 1.0), ("kl.beta", 0.04)],
        "changed": [("kl._target_", "Fixed", "NoKL"), ("tags", [1], [1, 2])],
    }
    assert diff.diff_dicts(a, a) == {"added": [], "removed": [], "changed": []}


def test_diff_overrides_by_key_last_one_wins():
    d = diff.diff_overrides(["kl=none", "seed=1", "seed=2", "~guard.kl"],
                            ["kl=fixed", "seed=2", "+x.y=3"])
    assert d == {"added": [("+x.y", "3")], "removed": [("~guard.kl", "")],
                 "changed": [("kl", "none", "fixed")]}


def test_one_argument_is_compared_with_the_defaults(capsys):
    text = diff.main(["dapo"])
    assert text.startswith("A: defaults\nB: experiment=dapo\n")
    assert "+ experiment  dapo" in text
    assert "~ kl._target_" in text
    assert "rookworld.kl_schedule.FixedKL -> rookworld.kl_schedule.NoKL" in text
    assert "~ zero_variance" in text and "keep -> drop" in text
    assert "- kl.beta" in text


def test_overrides_argument_and_markdown():
    md = diff.main(["defaults", "kl=none seed=3", "--format", "md"])
    assert md.startswith("### Config diff: `defaults` → `kl=none seed=3`\n")
    assert "`python -m rookworld.train kl=none seed=3`" in md
    assert "**Command-line overrides**: 0 changed, 2 added, 0 removed." in md
    assert "| `seed` | `0` | `3` |" in md
    assert "| `kl.beta` | `0.04` | - |" in md


def test_identical_sides_say_so():
    assert "The resolved configs are identical." in diff.main(["defaults", "defaults"])


def _fake_run(path, overrides, outcome=None):
    (path / ".hydra").mkdir(parents=True)
    OmegaConf.save(compose(overrides), path / ".hydra" / "config.yaml")
    (path / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    if outcome:
        (path / "outcome.json").write_text(json.dumps(outcome))
    return path


def test_run_directories_and_multirun_jobs(tmp_path):
    a = _fake_run(tmp_path / "multi" / "0", ["seed=0", "kl=fixed"],
                  {"status": "success", "step": 30, "objective": 0.25})
    b = _fake_run(tmp_path / "multi" / "1", ["seed=1", "kl=adaptive"],
                  {"status": "kl_failure", "step": 12, "objective": -1.0})
    text = diff.main([str(a), str(b)])
    assert f"A: {a} (success at step 30, objective 0.25)" in text
    assert f"B: {b} (kl_failure at step 12, objective -1)" in text  # 4 significant digits
    assert "~ kl    fixed -> adaptive" in text and "~ seed  0 -> 1" in text  # aligned
    assert "+ kl.target" in text
    with pytest.raises(SystemExit, match="multirun jobs 0, 1: pass one of them"):
        diff.main([str(tmp_path / "multi"), str(a)])


def test_unknown_argument_lists_the_experiments():
    with pytest.raises(SystemExit, match="dapo"):
        diff.main(["no_such_experiment"])


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_composes_and_builds(name):
    cfg = compose([f"experiment={name}"])
    build_parts(cfg)
    assert diff.main([name]).count("\n") > 4  # differs from the defaults


@pytest.mark.slow
@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_trains_one_step(name, tiny_overrides, tmp_path):
    overrides = [f"experiment={name}", *tiny_overrides, "steps=1",
                 "optim.schedule.warmup_steps=0"]  # a warmup must fit in the steps
    result = run(compose(overrides), tmp_path)
    assert result.outcome.status == "success"
