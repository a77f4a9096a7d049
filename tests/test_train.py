"""The config tree and the `python -m rookworld.train` entry point, end to end on CPU."""

import json
import math
import os
import re
import subprocess
import sys

import pytest
import yaml
from hydra.errors import HydraException

from rookworld.config import CONF_DIR, ConfigError, compose
from rookworld.held_out import t95
from rookworld.train import build_parts, run

GROUPS = ["model", "reward", "algorithm", "kl", "optim", "sampler", "task_mix", "logger", "data"]
OPTIONS = [(g, f.stem) for g in GROUPS for f in sorted((CONF_DIR / g).glob("*.yaml"))]


@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_composes_and_builds_before_the_model(group, option, request):
    if option == "engine":
        request.getfixturevalue("stockfish")  # skips without Stockfish
    cfg = compose([f"{group}={option}"])
    if (group, option) == ("model", "hf"):  # its config and weights are checked here too
        with pytest.raises(ConfigError, match="model.path is not set"):
            build_parts(cfg)
        return
    parts = build_parts(cfg)  # validates and builds everything but the model and reward
    assert set(parts.sampling) == {"P", "A"}
    if group == "reward":
        from rookworld.config import instantiate
        reward = instantiate(cfg.reward)
        assert hasattr(reward, "at")
        pool = getattr(reward, "pool", None)
        if pool is not None:
            pool.close()  # no Stockfish child left running at interpreter exit


def test_every_yaml_key_is_commented():
    missing = []
    for path in CONF_DIR.rglob("*.yaml"):
        block = None  # the indent of a key whose value is a block scalar (| or >): its text
        for i, line in enumerate(path.read_text().splitlines(), 1):
            s = line.strip()
            indent = len(line) - len(line.lstrip())
            if block is not None and (not s or indent > block):
                continue  # a line of the block's text, not a key
            block = None
            if re.search(r":\s*[|>][-+]?\s*(#.*)?$", line):
                block = indent
            if not s or s.startswith(("#", "-", "_target_:")) or s == "{}" or ":" not in s:
                continue
            if "#" not in line and not s.endswith(":"):
                missing.append(f"{path.relative_to(CONF_DIR)}:{i}: {s}")
    assert missing == []


BAD = [
    (["sampler.temperature=-1"], "sampler.temperature"),
    (["num_generations=1"], "num_generations"),
    (["steps=-3"], "steps"),
    (["steps=abc"], "steps"),
    (["optim.lr=0"], "optim.lr"),
    (["sampler.top_p=1.5"], "sampler.top_p"),
    (["batch_size=12", "num_generations=5"], "num_generations"),
    (["kl.beta=-1"], "kl.beta"),
    (["reference.enabled=false"], "reference.enabled"),
    (["zero_variance=sometimes"], "zero_variance"),
    (["algorithm=ppo", "zero_variance=drop"], "zero_variance=drop"),
    (["sweep.failed_objective=-inf"], "sweep.failed_objective"),
    (["sweep.objective=reward/mean"], "sweep.objective"),
    (["sweep.objective=eval/strength/puzzles_first", "strength=none"], "sweep.objective"),
    (["+sweep.heartbeat_s=30", "+sweep.grace_s=40"], "sweep.grace_s"),
    (["algorithm.kl_estimator=k9"], "algorithm.kl_estimator"),
    (["guard.kl.estimator=full_reverse"], "guard.kl.estimator=full_reverse needs both models"),
]


@pytest.mark.parametrize("overrides,key", BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_values_fail_before_any_model_naming_the_key(overrides, key):
    # a value of the wrong type fails as Hydra composes (the schema), a bad value at build
    with pytest.raises((ConfigError, ValueError, HydraException), match=key.replace(".", r"\.")):
        build_parts(compose(overrides))


def test_run_in_process_writes_metrics_checkpoint_and_outcome(tiny_overrides, tmp_path):
    result = run(compose(tiny_overrides), tmp_path)
    assert result.outcome.status == "success"
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in steps] == [0, 1]
    for key in ("reward/mean", "kl/value", "kl/coef", "loss/policy", "policy/entropy",
                "time/step_s", "groups/zero_variance_share", "optim/lr", "sample/len_mean"):
        assert key in steps[0], key
    assert (tmp_path / "checkpoints" / "latest").exists()
    outcome = json.loads((tmp_path / "outcome.json").read_text())
    assert outcome["status"] == "success" and "eval/reward" in outcome["final_eval"]
    chosen = json.loads((tmp_path / "runtime.json").read_text())  # the process-wide choices
    assert chosen["cpu_matmul"] in ("onednn", "blas", "mkl") and chosen["threads"] >= 1
    assert chosen["allocator"]["mmap_threshold_kib"] == "auto"
    assert set(chosen["kernel_caches"]) == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"}


def test_the_change_table_uses_the_paired_interval_of_the_same_samples(tiny_overrides,
                                                                        tmp_path):
    # the embedded model at its full completion lengths, so that per-sample scores differ
    # (a random model fails every sample)
    over = [o for o in tiny_overrides if not o.startswith(("model", "sampler"))]
    run(compose(over + ["model=embedded", "optim.lr=5e-4", "data.eval_per_task=12"]), tmp_path)
    rows = [json.loads(x) for x in (tmp_path / "eval_samples.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [-1, 1]
    start, end = rows[0]["values"]["eval/reward"], rows[1]["values"]["eval/reward"]
    diffs = [b - a for a, b in zip(start, end)]
    assert len(diffs) == 24 and any(diffs)
    mean = sum(diffs) / len(diffs)
    se = (sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1) / len(diffs)) ** 0.5
    first, last = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()
                   if "eval/reward" in x]
    assert last["eval_dse/reward"] == pytest.approx(se)
    assert se < math.hypot(first["eval_se/reward"], last["eval_se/reward"])
    table = (tmp_path / "eval_before_after.md").read_text()
    # Student's t of the 24 pairs (both tasks' samples), as every figure of the table
    assert last["eval_n/reward"] == 24
    assert f"| {mean:+.3f} ± {t95(24) * se:.3f} |" in table.split("| eval/reward |")[1]


def test_run_stopped_by_the_kl_guard_says_so_above_its_eval_table(tiny_overrides, tmp_path):
    over = [o for o in tiny_overrides if not o.startswith(("steps=", "eval_every="))]
    # weight decay moves the policy even when every group's rewards tie (zero advantages)
    result = run(compose(over + ["steps=3", "eval_every=0", "optim.lr=1e-2",
                                 "optim.weight_decay=0.1", "guard.kl.threshold=1e-9",
                                 "guard.kl.window=1"]), tmp_path)
    assert result.outcome.status == "kl_failure"
    table = (tmp_path / "eval_before_after.md").read_text()
    assert f"the run stopped (kl_failure at step {result.outcome.step})" in table
    assert "before any evaluation after the start" in table  # eval_every=0: only the start


def _cli(args, cwd, timeout=300):
    env = dict(os.environ, HYDRA_FULL_ERROR="1")
    return subprocess.run([sys.executable, "-m", "rookworld.train", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_cli_kl_warmup_fixed_reward_graduated(tiny_overrides, tmp_path):
    out = _cli(["kl=warmup_fixed", "reward=graduated", *tiny_overrides,
                f"hydra.run.dir={tmp_path}/run"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = tmp_path / "run"
    for f in (".hydra/config.yaml", ".hydra/overrides.yaml", "metrics.jsonl", "outcome.json",
              "checkpoints/latest"):
        assert (run_dir / f).exists(), f
    overrides = yaml.safe_load((run_dir / ".hydra/overrides.yaml").read_text())
    assert "kl=warmup_fixed" in overrides and "reward=graduated" in overrides


def test_cli_multirun_comma_separated_values(tiny_overrides, tmp_path):
    out = _cli(["-m", "seed=0,1", *tiny_overrides, "steps=1",
                f"hydra.sweep.dir={tmp_path}/multi"], cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    for job in ("0", "1"):
        assert (tmp_path / "multi" / job / "outcome.json").exists()


def test_cli_help_and_cfg_job(tmp_path):
    out = _cli(["--help"], cwd=tmp_path)
    assert out.returncode == 0 and "kl: adaptive, fixed, linear_warmup, none, warmup_fixed" \
        in out.stdout
    out = _cli(["--cfg", "job", "kl=warmup_fixed"], cwd=tmp_path)
    assert out.returncode == 0
    cfg = yaml.safe_load(out.stdout)
    assert cfg["kl"]["_target_"] == "rookworld.kl_schedule.WarmupFixedKL"
    assert cfg["num_generations"] >= 2


def test_cli_bad_value_exits_nonzero_naming_the_key(tmp_path):
    out = _cli(["num_generations=1", "model=tiny_random"], cwd=tmp_path)
    assert out.returncode != 0 and "num_generations" in out.stderr


def test_evaluate_refuses_an_out_it_cannot_write_before_measuring(tmp_path):
    """out= under a file (no folder can be made there): exit 1 naming out=, at once."""
    (tmp_path / "file").write_text("")
    out = subprocess.run([sys.executable, "-m", "rookworld.evaluate",
                          f"out={tmp_path}/file/result.json"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 1 and "out=" in out.stderr and "Traceback" not in out.stderr
    assert "held_out" not in out.stdout  # nothing was measured


@pytest.mark.slow
def test_evaluate_against_an_earlier_file_prints_the_paired_change(synthetic_data, tmp_path):
    """Two evaluations of the embedded model, the second with P completions cut short (so
    its P answers fail), print the change with the paired interval of the same samples,
    and write only their `out` files (no log file in the working directory; a missing
    folder of `out` made)."""
    common = ["-m", "rookworld.evaluate", f"data.eval={synthetic_data[1]}",
              "data.eval_per_task=8", "data.external_eval=null"]
    first = subprocess.run([sys.executable, *common, f"out={tmp_path}/a.json"],
                           capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    second = subprocess.run([sys.executable, *common, "+sampler.per_task.P.max_new_tokens=40",
                             f"out={tmp_path}/later/b.json", f"against={tmp_path}/a.json"],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "later"]  # nothing else
    assert [p.name for p in (tmp_path / "later").iterdir()] == ["b.json"]
    a, b = (json.loads((tmp_path / f).read_text())["per_sample"]["held_out"]["eval/P/reward"]
            for f in ("a.json", "later/b.json"))
    diffs = [y - x for x, y in zip(a, b)]
    mean = sum(diffs) / len(diffs)
    se = (sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1) / len(diffs)) ** 0.5
    assert len(diffs) == 8 and mean < 0 and se > 0
    assert f"| eval/P/reward | {sum(a) / 8:.3f} ± " in second.stdout
    # the change over 8 held-out samples: Student's t with 7 degrees of freedom, 2.365
    assert f"| {mean:+.3f} ± {2.365 * se:.3f} |" in second.stdout.split("| eval/P/reward |")[1]
