"""Loggers: console lines, the examples file, and W&B in offline mode read back for real;
then the report and the config diff on that same training run."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rookworld.guards import Outcome
from rookworld.loggers import (
    ConsoleLogger,
    ExamplesFile,
    WandbLogger,
    fmt_duration,
    format_eval,
)


@pytest.mark.parametrize("seconds,text", [(0, "0s"), (8.4, "8s"), (59.6, "1m00s"),
                                          (75, "1m15s"), (3725, "1h02m")])
def test_fmt_duration(seconds, text):
    assert fmt_duration(seconds) == text


def test_format_eval_groups_by_task_reward_first():
    m = {"eval/A/format": 1.0, "eval/A/reward": 0.25, "eval/P/legal": 0.5,
         "eval/reward": 0.125, "time/eval_s": 75.0}
    assert format_eval(m) == ("eval/reward=0.125 | A: format=1 reward=0.25 | P: legal=0.5 "
                              "| 1m15s")


def test_format_eval_prints_the_interval_of_each_figure_it_has_an_error_for():
    m = {"eval/P/best_legal": 0.25, "eval_se/P/best_legal": 0.0194, "eval/P/legal": 0.5,
         "eval_n/P": 500}
    # 1.96 * 0.0194 = 0.038; no error logged for legal: no interval
    assert format_eval(m) == "P: best_legal=0.25±0.038 legal=0.5"


def test_console_lines_every_n_steps_last_step_and_evals(capsys):
    lg = ConsoleLogger(every=2, keys=["reward/mean", "kl/value"])
    lg.start("RUN", {"steps": 5})
    lg.log({"eval/reward": -0.3, "eval/P/reward": -0.3}, -1)
    for step in range(5):
        lg.log({"reward/mean": 0.5 * step, "kl/value": 0.01, "loss/policy": 1.0}, step)
    lg.finish(Outcome("kl_failure", 4, "kl/k3 mean 2 > 1"), {})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "[rookworld] run directory: RUN"
    assert lines[1] == "[eval before training] eval/reward=-0.3 | P: reward=-0.3"
    assert lines[2] == "[step 0/5] reward/mean=0  kl/value=0.01"  # no rate before step 1
    assert lines[3].startswith("[step 2/5 ") and " eta " in lines[3]
    assert lines[3].endswith("] reward/mean=1  kl/value=0.01")
    assert lines[4].startswith("[step 4/5 ") and "eta 0s]" in lines[4]  # the last step
    assert lines[5] == "[rookworld] outcome: kl_failure at step 4 (kl/k3 mean 2 > 1)"
    assert len(lines) == 6  # steps 1 and 3 skipped; loss/policy is not among the keys


def test_examples_file_appends_rows_with_their_step(tmp_path):
    lg = ExamplesFile()
    lg.start(tmp_path, {})
    row = {"task": "P", "prompt": "P: x ", "completion": "M: ", "reference": "M: a", "reward": 0.2}
    lg.log_examples([row], -1)
    lg.log_examples([], 0)
    lg.log_examples([row | {"reward": 0.4}], 1)
    rows = [json.loads(x) for x in (tmp_path / "examples.jsonl").read_text().splitlines()]
    assert rows == [{"step": -1, **row}, {"step": 1, **row, "reward": 0.4}]


def test_wandb_mode_is_checked():
    with pytest.raises(ValueError, match=r"logger\.wandb\.mode"):
        WandbLogger(mode="sometimes")


def _isolate_wandb(monkeypatch, tmp_path, mode):
    monkeypatch.setenv("WANDB_MODE", mode)
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb_home" / var.lower()))
    monkeypatch.setenv("WANDB_SILENT", "true")


def test_wandb_disabled_writes_no_run(monkeypatch, tmp_path):
    _isolate_wandb(monkeypatch, tmp_path, "disabled")
    lg = WandbLogger(mode="offline")  # WANDB_MODE wins
    lg.start(tmp_path, {"steps": 1})
    lg.log({"reward/mean": 1.0}, 0)
    lg.finish(Outcome("success", 1), {"objective": 1.0})
    assert not list(tmp_path.glob("wandb/offline-run-*"))


def _wandb_cli() -> str:
    exe = Path(sys.executable).with_name("wandb")
    return str(exe) if exe.exists() else shutil.which("wandb")


def _leet(run_path: Path, *flags) -> str:
    out = subprocess.run([_wandb_cli(), "leet", "inspect", *flags, str(run_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture
def wandb_run(tiny_overrides, tmp_path, monkeypatch):
    """A real `python -m rookworld.train logger=wandb` run with WANDB_MODE=offline."""
    _isolate_wandb(monkeypatch, tmp_path, "offline")
    run_dir = tmp_path / "run"
    out = subprocess.run([sys.executable, "-m", "rookworld.train", *tiny_overrides,
                          "logger=wandb", "eval_every=1", "examples_to_log=2",
                          "logger.wandb.tags=[test,tiny]", "logger.wandb.group=tests",
                          f"hydra.run.dir={run_dir}"],
                         env=dict(os.environ, HYDRA_FULL_ERROR="1"), cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return run_dir, out.stdout


def test_wandb_offline_run_reads_back_and_report_and_diff_run_on_it(wandb_run, capsys):
    run_dir, stdout = wandb_run
    assert "[eval before training] eval/reward=" in stdout and "[step 1/2 " in stdout
    (offline,) = run_dir.glob("wandb/offline-run-*")
    outcome = json.loads((run_dir / "outcome.json").read_text())

    records = [json.loads(x) for x in _leet(offline, "--json").splitlines()]
    history = [r["history"]["item"] for r in records if r["type"] == "history"]
    evals = [h for h in history if "eval/reward" in h]
    steps = [h for h in history if "reward/mean" in h]
    assert [h["step"] for h in evals] == [-1, 0, 1]  # before training, then every step
    assert [h["step"] for h in steps] == [0, 1]
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [h["reward/mean"] for h in steps] == pytest.approx(
        [m["reward/mean"] for m in metrics if "reward/mean" in m])
    tables = [h for h in history if h.get("eval/examples._type") == "table-file"]
    assert [h["step"] for h in tables] == [-1, 0, 1]
    table = json.loads((offline / "files" / tables[-1]["eval/examples.path"]).read_text())
    assert table["columns"] == ["step", "task", "prompt", "completion", "reference", "reward"]
    assert len(table["data"]) == 4  # examples_to_log=2 per task, two tasks

    summary = json.loads(_leet(offline, "--summary", "--json"))
    s = summary["summary"]
    assert s["outcome/status"] == "success" and s["outcome/step"] == 2
    assert s["objective"] == pytest.approx(outcome["objective"])
    for k, v in outcome["final_eval"].items():
        assert s[f"final/{k}"] == pytest.approx(v)
    assert s["initial/eval/reward"] == pytest.approx(outcome["initial_eval"]["eval/reward"])
    assert summary["state"] == "finished" and summary["project"] == "rookworld"
    assert sorted(summary["tags"]) == ["test", "tiny"]
    assert summary["config"]["num_generations"] == 2 and summary["config"]["model"]["n_embd"] == 32
    assert summary["config"]["backend"] == "fast_gpt2"  # what `auto` chose, as run_config.yaml

    sync = subprocess.run([_wandb_cli(), "sync", "--dry-run", str(offline)],
                          capture_output=True, text=True, timeout=120)
    assert "Would sync 1 run(s)" in sync.stdout + sync.stderr

    from rookworld import diff, report
    md = report.write_report(run_dir).read_text()
    assert "- Outcome: **success** at step 2" in md and "| `logger` | `wandb` |" in md
    assert "Greedy completions at the last evaluation (step 1)" in md
    for name in ("overview", "reward", "kl", "entropy", "clip", "eval"):
        assert (run_dir / "report" / f"{name}.png").stat().st_size > 10_000, name
    text = diff.main([str(run_dir)])
    assert text.startswith("A: defaults\nB: ") and "+ logger" in text
    assert "~ model._target_" in text and "rookworld.policy.build_random" in text
