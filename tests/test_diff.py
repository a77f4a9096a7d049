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


def test_an_unresolvable_interpolation_keeps_its_text_and_only_its_own(tmp_path, monkeypatch):
    """`${hydra:...}` resolves only in a live run: that leaf stays as text, while the saved
    config's other interpolations (`${pkg_data:...}`, `${oc.env:...}`) still resolve."""
    monkeypatch.delenv("ROOKWORLD_CPU_MATMUL", raising=False)
    cfg = OmegaConf.create(OmegaConf.to_yaml(compose([])))  # the interpolations as saved
    saved = OmegaConf.to_container(cfg)
    assert saved["data"]["train"].startswith("${pkg_data:") and saved["cpu_matmul"].startswith(
        "${oc.env:")
    a, b = tmp_path / "a", tmp_path / "b"
    for d, name in ((a, None), (b, "${hydra:job.name}")):
        (d / ".hydra").mkdir(parents=True)
        if name:
            cfg.run_name = name
        OmegaConf.save(cfg, d / ".hydra" / "config.yaml")
    side = diff.load_side(str(b))
    assert side.config["data"]["train"] == str(compose([]).data.train)
    assert side.config["cpu_matmul"] == "auto" and side.config["run_name"] == "${hydra:job.name}"
    d = diff.diff_dicts(diff.load_side(str(a)).config, side.config)
    assert d == {"added": [("run_name", "${hydra:job.name}")], "removed": [], "changed": []}
    # list elements too: each resolves, or keeps its text, on its own
    lists = OmegaConf.create({"seed": 3, "l": ["${seed}", "${hydra:job.num}", {"x": "${seed}"}],
                              "s": "${l}"})
    assert diff.resolve(lists) == {"seed": 3, "l": [3, "${hydra:job.num}", {"x": 3}],
                                   "s": [3, "${hydra:job.num}", {"x": 3}]}


def _resumed_run(path):
    """A run started with steps=2 and resumed twice, to 3 and then 5 steps: run_config.yaml
    holds steps 5, .hydra/ the first command's record (steps 2)."""
    run_dir = _fake_run(path, ["steps=2"])
    cfg = compose(["steps=2"])
    cfg.steps = 5
    OmegaConf.save(cfg, run_dir / "run_config.yaml")
    for name, steps in (("2026-01-02_09-00-00", 3), ("2026-01-02_10-00-00", 5)):
        (run_dir / ".hydra-resumes" / name).mkdir(parents=True)
        (run_dir / ".hydra-resumes" / name / "overrides.yaml").write_text(
            yaml.safe_dump([f"resume={run_dir}", f"steps={steps}"]))
    return run_dir


def test_a_resumed_run_shows_its_steps_and_the_resume_overrides(tmp_path):
    run_dir = _resumed_run(tmp_path / "run")
    text = diff.main(["defaults", str(run_dir)])
    assert "~ steps" in text and "45 -> 5" in text  # run_config.yaml, not .hydra's steps 2
    assert "+ resume: steps  5" in text and "+ steps          2" in text  # the last resume's
    assert (f"   resumed: python -m rookworld.train resume={run_dir} steps=3\n"
            f"   resumed: python -m rookworld.train resume={run_dir} steps=5\n") in text
    assert diff.load_side(str(run_dir)).all_overrides() == [
        "steps=2", "resume: steps=3", "resume: steps=5"]
    md = diff.main(["defaults", str(run_dir), "--format", "md"])
    assert f"  - resumed: `python -m rookworld.train resume={run_dir} steps=5`" in md
    assert "| `resume: steps` | - | `5` |" in md and "| `steps` | `45` | `5` |" in md
