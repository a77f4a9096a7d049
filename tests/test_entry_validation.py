"""`python -m rookworld.pretrain` and `python -m rookworld.evaluate` end a bad setting or
input as train does: one line `rookworld: ...` naming the key, exit code 1, no traceback,
and before the data or the model loads where the setting can be told from config."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rookworld.config import compose
from rookworld.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def _one_line(p: subprocess.CompletedProcess, *words: str) -> None:
    """Exit 1 with the `rookworld:` line naming words as the last of stderr, no traceback."""
    assert p.returncode == 1, p.stderr[-2000:]
    assert "Traceback" not in p.stderr, p.stderr[-2000:]
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("rookworld: ") and all(w in last for w in words), last


def _cli(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"rookworld.{module}", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("setting, words", [
    ("lr=-1", ("lr must be", "> 0", "-1")),
    ("batch_size=0", ("batch_size must be", ">= 1")),
    pytest.param("device=cuda", ("device=cuda", "no CUDA device"),
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present")),
])
def test_pretrain_refuses_a_bad_setting_in_one_line_before_reading_data(tmp_path, setting,
                                                                        words):
    """data.train names no file: a refusal after the data read would name the data."""
    p = _cli("pretrain", f"out_dir={tmp_path / 'run'}",
             f"data.train={tmp_path / 'missing.jsonl'}", setting, cwd=ROOT)
    _one_line(p, *words)
    assert not (tmp_path / "run" / "parent.json").exists()  # no model was loaded


@pytest.mark.parametrize("setting, key", [
    ("steps=0", "steps"), ("batch_size=0", "batch_size"),
    ("checkpoint_every=-1", "checkpoint_every"), ("lr=0", "lr"), ("lr=-1", "lr"),
    ("min_lr=-0.1", "min_lr"), ("warmup_steps=-1", "warmup_steps"),
    ("curve_every=-1", "curve_every"), ("curve_per_task=-1", "curve_per_task"),
    ("data.eval_per_task=-1", "data.eval_per_task"), ("device=gpu", "device"),
    ("sampler.top_p=0", "sampler.top_p"),
    ("reward.malformed_penalty=-1", "reward.malformed_penalty"),
    ("strength.puzzles=-1", "strength.puzzles"),
])
def test_pretrain_checks_its_settings_by_key(setting, key):
    from rookworld.pretrain import check_settings

    check_settings(compose(["checkpoint_every=0", "curve_every=0"], "pretrain"))  # 0s allowed
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        check_settings(compose([setting, "strength=fast"] if "strength" in setting
                               else [setting], "pretrain"))


def test_pretrain_with_checkpoint_every_0_saves_at_the_end_only(tmp_path, synthetic_data,
                                                               monkeypatch):
    """checkpoint_every=0 means what it means in train: one checkpoint, at the end."""
    from rookworld import pretrain

    saved, real_save = [], pretrain.save_state
    monkeypatch.setattr(pretrain, "save_state", lambda out, policy, opt, step, elapsed: (
        saved.append(step), real_save(out, policy, opt, step, elapsed)))
    train, held_out = synthetic_data
    pretrain.run(compose([f"out_dir={tmp_path / 'run'}", f"data.train={train}",
                          f"data.eval={held_out}", "data.external_eval=null",
                          "model.n_layer=1", "model.n_embd=32", "model.n_head=2",
                          "steps=3", "batch_size=2", "warmup_steps=1", "checkpoint_every=0",
                          "curve_every=0", "data.eval_per_task=1", "sampler.max_new_tokens=4",
                          "sampler.per_task.A.max_new_tokens=4"], "pretrain"))
    assert saved == [3]
    state = torch.load(tmp_path / "run" / "checkpoint" / "state.pt", weights_only=True)
    assert state["step"] == 3 and (tmp_path / "run" / "model").is_dir()


@pytest.mark.parametrize("args, words", [
    (["against={tmp}/nope.json"], ("against=", "nope.json")),
    (["model.path=/nonexistent/checkpoints/step-000045/model"],
     ("model.path=", "does not exist")),
    # a hub id passes the path check and fails as it loads: the reward must fail first
    (["reward.malformed_penalty=-1", "model.path=nobody/nothing"],
     ("reward.malformed_penalty=-1",)),
    # data.eval names no file: these are refused before the data is read
    (["suite=strength", "strength.puzzles=-1", "data.eval={tmp}/missing.jsonl"],
     ("strength.puzzles",)),
    (["data.eval_per_task=-1", "data.eval={tmp}/missing.jsonl"],
     ("data.eval_per_task must be", ">= 0")),
    (["sampler.top_p=0", "data.eval={tmp}/missing.jsonl"], ("sampler.top_p",)),
])
def test_evaluate_refuses_a_bad_setting_or_input_in_one_line(tmp_path, args, words):
    p = _cli("evaluate", *(a.format(tmp=tmp_path) for a in args), cwd=tmp_path)
    _one_line(p, *words)
    assert "held_out" not in p.stdout  # nothing was measured


def test_evaluate_checks_its_settings_before_the_model():
    from rookworld.evaluate import check_settings

    check_settings(compose([], "evaluate"))
    for setting, key in (("data.eval_per_task=-1", r"data\.eval_per_task"),
                         ("sampler.top_p=0", r"sampler\.top_p"), ("suite=both", "suite"),
                         ("strength.puzzles=-1", r"strength\.puzzles")):
        with pytest.raises(ConfigError, match=key):
            check_settings(compose([setting, "suite=all"] if "strength" in setting
                                   else [setting], "evaluate"))
