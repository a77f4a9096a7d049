"""`python -m rookworld.pretrain` and `python -m rookworld.evaluate` end a bad setting or
input as train does: one line `rookworld: ...` naming the key, exit code 1, no traceback,
and before the data or the model loads where the setting can be told from config."""

import errno
import json
import os
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


def _tiny_evaluate(data: str, *extra: str):
    """The config of a seconds-long evaluation of a tiny random model on data."""
    return compose(["model=tiny_random", "model.n_layer=1", "model.n_embd=32", "model.n_head=2",
                    "model.n_positions=320", f"data.eval={data}", "data.eval_per_task=1",
                    "data.external_eval=null", "sampler.max_new_tokens=4",
                    "sampler.per_task.A.max_new_tokens=4", *extra], "evaluate")


@pytest.mark.parametrize("content, words", [
    ({"held_out": {"eval/reward": "x"}}, ("earlier.json", "held_out.eval/reward", "not a number")),
    ({"a": 1}, ("earlier.json", "none of the evaluation's sections", "held_out")),
])
def test_evaluate_refuses_an_against_file_that_out_did_not_write_before_the_data(
        tmp_path, content, words):
    """data.eval names no file: a refusal after the data read (and the model) would name it."""
    (tmp_path / "earlier.json").write_text(json.dumps(content))
    p = _cli("evaluate", f"against={tmp_path / 'earlier.json'}",
             f"data.eval={tmp_path / 'missing.jsonl'}", cwd=tmp_path)
    _one_line(p, *words)


@pytest.mark.parametrize("content, suite, words", [
    ({"held_out": {"eval/reward": None}}, "held_out", ("held_out.eval/reward is null",)),
    ({"held_out": {"eval/reward": True}}, "held_out", ("held_out.eval/reward is true",)),
    ({"held_out": {"eval_n/P": 2.5}}, "held_out", ("held_out.eval_n/P", "integer >= 0")),
    ({"held_out": [1]}, "held_out", ("held_out is list",)),
    ({"held_out": {}, "per_sample": {"held_out": {"eval/reward": [1, "x"]}}}, "held_out",
     ("per_sample.held_out.eval/reward holds \"x\"",)),
    ({"held_out": {}, "per_sample": {"held_out": {"eval/reward": [None]}}}, "held_out",
     ("per_sample.held_out.eval/reward holds null",)),
    ({"strength": {"eval/strength/acpl": 80}}, "held_out", ("strength only", "held_out")),
    ({"held_out": {"eval/reward": 0.5}}, "strength", ("held_out only", "strength")),
])
def test_evaluate_names_the_key_of_an_against_file_it_cannot_compare(tmp_path, content, suite,
                                                                      words):
    from rookworld.evaluate import read_against, suite_sections

    path = tmp_path / "earlier.json"
    path.write_text(json.dumps(content))
    with pytest.raises(ConfigError) as e:
        read_against(str(path), suite_sections(suite))
    assert str(path) in str(e.value) and all(w in str(e.value) for w in words), e.value


def test_evaluate_out_file_is_taken_by_against(tmp_path, synthetic_data, capsys):
    """What out= writes (nulls in the centipawn loss by position) reads back as against=."""
    from rookworld.evaluate import read_against, run

    run(_tiny_evaluate(synthetic_data[1], f"out={tmp_path / 'a.json'}"))
    earlier = json.loads((tmp_path / "a.json").read_text())
    earlier["per_sample"]["strength"] = {"eval/strength/acpl_by_position_masked": [None, 3.0]}
    (tmp_path / "a.json").write_text(json.dumps(earlier))
    assert read_against(str(tmp_path / "a.json"))["held_out"] == earlier["held_out"]
    run(_tiny_evaluate(synthetic_data[1], f"against={tmp_path / 'a.json'}"))
    assert "held_out: " in capsys.readouterr().out  # the before/after table


def test_evaluate_out_that_cannot_be_saved_says_the_figures_were_printed(
        tmp_path, synthetic_data, monkeypatch, capsys):
    """A full disk as out= is written: one line naming the path and the error, after the
    figures; the earlier file stays whole and no temporary file is left."""
    from rookworld import evaluate, files

    def full_disk(*_):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def write_on_a_full_disk(path, text):
        with monkeypatch.context() as m:
            m.setattr(os, "fsync", full_disk)
            files.atomic_write_text(path, text)

    out = tmp_path / "metrics.json"
    out.write_text("earlier\n")
    monkeypatch.setattr(evaluate, "atomic_write_text", write_on_a_full_disk)
    with pytest.raises(ConfigError, match=rf"out={out}: not saved \(.*No space left on device"
                                          r".*figures are printed above"):
        evaluate.run(_tiny_evaluate(synthetic_data[1], f"out={out}"))
    assert '"held_out"' in capsys.readouterr().out
    assert out.read_text() == "earlier\n" and os.listdir(tmp_path) == ["metrics.json"]


def test_evaluate_refuses_an_out_directory_in_one_line_before_the_data(tmp_path):
    p = _cli("evaluate", f"out={tmp_path}", f"data.eval={tmp_path / 'missing.jsonl'}",
             cwd=tmp_path)
    _one_line(p, f"out={tmp_path}", "a directory")


def test_evaluate_refuses_an_out_folder_it_cannot_write_before_the_data(tmp_path, monkeypatch):
    """A folder without write permission (made so by the failing file creation there, which a
    chmod cannot do for root)."""
    import tempfile

    from rookworld.evaluate import run

    def denied(*_, **__):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(tmp_path / "ro"))

    cfg = compose([f"out={tmp_path / 'ro' / 'metrics.json'}",
                   f"data.eval={tmp_path / 'missing.jsonl'}"], "evaluate")
    monkeypatch.setattr(tempfile, "mkstemp", denied)
    with pytest.raises(ConfigError, match=r"out=.*ro/metrics\.json: cannot write .*Permission"):
        run(cfg)
