"""`python -m rookworld.pretrain`: the unmasked causal forward it trains with, its
compute curve, checkpoint and export, on a tiny model and synthetic data."""

import errno
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import GPT2Config as HFConfig
from transformers import GPT2LMHeadModel as HFModel

from rookworld.config import pkg_data
from rookworld.gpt2 import GPT2Config, GPT2LMHeadModel
from rookworld.model_card import code_commit, model_card
from rookworld.pretrain import data_record, get_lr, read_curve

ROOT = Path(__file__).resolve().parents[1]


def test_unmasked_forward_is_causal_and_equals_transformers():
    shape = dict(vocab_size=50, n_positions=40, n_embd=32, n_layer=2, n_head=2)
    torch.manual_seed(3)
    ours = GPT2LMHeadModel(GPT2Config(**shape)).init_weights_().eval()
    theirs = HFModel(HFConfig(**shape)).eval()
    theirs.load_state_dict(ours.state_dict(), strict=False)
    ids = torch.randint(0, 50, (3, 12), generator=torch.Generator().manual_seed(0))
    plain = ours(input_ids=ids).logits
    masked = ours(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    torch.testing.assert_close(plain, masked, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(plain, theirs(input_ids=ids).logits, atol=1e-5, rtol=1e-5)
    later = ids.clone()
    later[:, 6:] = 7  # a change after position 5 leaves positions 0..5 as they were
    torch.testing.assert_close(ours(input_ids=later).logits[:, :6], plain[:, :6])


TINY = ("model.n_layer=1", "model.n_embd=32", "model.n_head=2")


def _pretrain(out: Path, train: str, held_out: str, *extra: str, model=TINY):
    cmd = [sys.executable, "-m", "rookworld.pretrain", f"out_dir={out}", f"data.train={train}",
           f"data.eval={held_out}", "data.external_eval=/nonexistent", *model,
           "batch_size=4", "warmup_steps=1",
           "data.eval_per_task=4", "curve_per_task=3", "sampler.max_new_tokens=8",
           "sampler.per_task.A.max_new_tokens=8", *extra]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True, timeout=300)


def test_pretrain_writes_its_curve_and_resumes_exactly(tmp_path, synthetic_data):
    train, held_out = synthetic_data
    _pretrain(tmp_path / "straight", train, held_out, "steps=4", "curve_every=2",
              "checkpoint_every=2", f"export_to={tmp_path / 'export'}")
    card = (tmp_path / "export" / "MODEL_CARD.md").read_text()
    assert "![compute curve](curve.png)" in card and "| 1 | 4 | 16 |" in card
    assert (tmp_path / "export" / "curve.png").stat().st_size > 10_000
    curve = read_curve(tmp_path / "straight" / "curve.jsonl")
    assert [r["step"] for r in curve] == [2, 4] and [r["samples"] for r in curve] == [8, 16]
    assert all(0.0 <= r["eval/P/format"] <= 1.0 and "eval_se/P/format" in r for r in curve)
    report = json.loads((tmp_path / "straight" / "pretrain_report.json").read_text())
    assert report["steps"] == 4 and "eval/A/fen_exact" in report["eval"]["held_out"]
    # the same schedule stopped after 2 steps by its step budget, then continued to 4
    _pretrain(tmp_path / "split", train, held_out, "steps=4", "curve_every=0",
              "checkpoint_every=2", "stop_at=2")
    _pretrain(tmp_path / "split", train, held_out, "steps=4", "curve_every=0",
              "checkpoint_every=2")
    a = GPT2LMHeadModel.from_pretrained(tmp_path / "straight" / "model").state_dict()
    b = GPT2LMHeadModel.from_pretrained(tmp_path / "split" / "model").state_dict()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def _pretrain_run(out: Path, train: str, held_out: str, *extra: str):
    """_pretrain without check: the completed process, for the runs that must fail."""
    cmd = [sys.executable, "-m", "rookworld.pretrain", f"out_dir={out}", f"data.train={train}",
           f"data.eval={held_out}", "data.external_eval=/nonexistent", *TINY,
           "batch_size=4", "warmup_steps=1", "data.eval_per_task=4", "curve_every=0",
           "sampler.max_new_tokens=8", "sampler.per_task.A.max_new_tokens=8", "strength=none",
           *extra]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def _log_steps(out: Path) -> list[int]:
    return [json.loads(x)["step"] for x in (out / "pretrain_log.jsonl").read_text().splitlines()]


def test_pretrain_faults_end_in_a_message_and_lose_no_checkpoint(tmp_path, synthetic_data):
    """A kill between the checkpoint swap's two renames, a kill that left log rows past the
    checkpoint and a torn line, a damaged checkpoint, another model shape, and weights
    blown up: each resumes from the whole checkpoint or stops with one line naming it."""
    train, held_out = synthetic_data
    out = tmp_path / "run"
    p = _pretrain_run(out, train, held_out, "steps=6", "checkpoint_every=2", "stop_at=4")
    assert p.returncode == 0, p.stderr[-2000:]
    # killed mid-swap: only the moved-aside copy is left; rows of steps 5-6 and a torn line
    # were logged after it
    (out / "checkpoint").rename(out / ".checkpoint.old")
    with open(out / "pretrain_log.jsonl", "a") as f:
        f.write('{"step": 5, "loss": 1.0}\n{"step": 6, "loss": 1.0}\n{"step": 7, "lo')
    p = _pretrain_run(out, train, held_out, "steps=6", "checkpoint_every=2")
    assert p.returncode == 0 and "resuming from step 4" in p.stdout, p.stderr[-2000:]
    assert _log_steps(out) == [1, 2, 3, 4, 5, 6]
    assert (out / "checkpoint" / "manifest.json").exists()
    assert not (out / ".checkpoint.old").exists()
    # damaged weights are named, not trained on
    weights = out / "checkpoint" / "model" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2:len(data) // 2 + 64] = b"\xff" * 64
    weights.write_bytes(bytes(data))
    p = _pretrain_run(out, train, held_out, "steps=8", "checkpoint_every=2")
    assert p.returncode == 1 and "model.safetensors does not match its manifest" in p.stderr
    assert "resume=false" in p.stderr
    # another model shape: one line, no traceback
    other = tmp_path / "other"
    assert _pretrain_run(other, train, held_out, "steps=2", "checkpoint_every=2").returncode == 0
    p = _pretrain_run(other, train, held_out, "steps=4", "model.n_embd=64")
    assert p.returncode == 1 and "does not fit this model" in p.stderr
    assert "Traceback" not in p.stderr
    # weights blown up: the run stops at the non-finite loss and keeps its checkpoint
    blown = tmp_path / "blown"
    p = _pretrain_run(blown, train, held_out, "steps=6", "checkpoint_every=1", "lr=1e12",
                      "grad_clip=1e12")
    assert p.returncode == 1 and "the loss is nan" in p.stderr.lower(), p.stderr[-2000:]
    assert not (blown / "model").exists()


def _tiny_state(out: Path):
    """A tiny policy, its optimiser and run settings, and a checkpoint of step 2 in out."""
    from rookworld.policy import build_random
    from rookworld.pretrain import SETTINGS, save_state

    policy = build_random(n_layer=1, n_embd=16, n_head=2, n_positions=32)
    opt = torch.optim.AdamW(policy.model.parameters())
    settings = {"lr": 1e-3, "seed": 0}
    (out / SETTINGS).write_text(json.dumps(settings))
    save_state(out, policy, opt, 2, 1.0)
    return policy, opt, settings


def _enforce_fail(obj, f, *args, **kwargs):  # what torch.save raises when the disk is full
    Path(f).write_bytes(b"PK\x03\x04 cut short")
    raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")


def _safetensors_full(tensors, filename, metadata=None):
    from safetensors import SafetensorError
    Path(filename).write_bytes(b"cut short")
    raise SafetensorError("Error while serializing: I/O error: No space left on device "
                          "(os error 28)")


def _manifest_full(path, text):
    raise OSError(errno.ENOSPC, "No space left on device", str(path))


@pytest.mark.parametrize(("target", "fault", "named"), [
    ("torch.save", _enforce_fail, "unexpected pos 704 vs 598"),
    ("rookworld.gpt2.save_file", _safetensors_full, "No space left on device (os error 28)"),
    ("rookworld.run_dir.atomic_write_text", _manifest_full, "No space left on device: "),
], ids=["state", "weights", "manifest"])
def test_a_full_disk_while_checkpointing_removes_the_copy_and_keeps_the_last(tmp_path,
                                                                            monkeypatch, target,
                                                                            fault, named):
    """Whichever library's write the disk refuses: one line naming its error and the way on,
    the partial copy removed, the previous checkpoint whole and resumable."""
    from rookworld.pretrain import resume_state, save_state
    from rookworld.run_dir import verify

    policy, opt, settings = _tiny_state(tmp_path)
    before = (tmp_path / "checkpoint" / "manifest.json").read_text()
    monkeypatch.setattr(target, fault)
    with pytest.raises(SystemExit) as err:
        save_state(tmp_path, policy, opt, 4, 2.0)
    message = str(err.value)
    assert message.startswith("rookworld: pretrain: writing the checkpoint of step 4 into "
                              f"{tmp_path} failed (") and "\n" not in message, message
    assert named in message and "MB free there" in message
    assert "the previous checkpoint" in message and "is intact" in message
    assert message.endswith("Free space, then run the same command again with resume=true to "
                            "continue")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "run_settings.json"]
    assert verify(tmp_path / "checkpoint") is None
    assert (tmp_path / "checkpoint" / "manifest.json").read_text() == before
    monkeypatch.undo()
    assert resume_state(tmp_path, policy, opt, settings) == (2, 1.0)


def _pretrain_wrapped(wrapper: Path, out: Path, train, held_out):
    """Four tiny pretraining steps, checkpoints at 2 and 4, run through `wrapper` (a script
    that patches a write, then runs rookworld.pretrain as __main__)."""
    args = [f"out_dir={out}", f"data.train={train}", f"data.eval={held_out}",
            "data.external_eval=/nonexistent", *TINY, "batch_size=4", "warmup_steps=1",
            "data.eval_per_task=4", "curve_every=0", "sampler.max_new_tokens=8",
            "sampler.per_task.A.max_new_tokens=8", "strength=none", "steps=4",
            "checkpoint_every=2"]
    return subprocess.run([sys.executable, str(wrapper), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_a_full_disk_at_a_pretrain_checkpoint_ends_in_one_line_and_the_rerun_resumes(
        tmp_path, synthetic_data):
    """The command line: torch's own error at the second checkpoint's state file, one line
    and exit code 1; the same command again continues from the first checkpoint."""
    train, held_out = synthetic_data
    out = tmp_path / "run"
    wrapper = tmp_path / "full_disk.py"
    wrapper.write_text(
        "import runpy, sys\nfrom pathlib import Path\nimport torch\nreal = torch.save\n"
        "def save(obj, f, *a, **k):\n"
        "    if str(f).endswith('state.pt') and obj.get('step') == 4:\n"
        "        Path(f).write_bytes(b'PK cut short')\n"
        "        raise RuntimeError('[enforce fail at inline_container.cc:672] . unexpected "
        "pos 704 vs 598')\n"
        "    return real(obj, f, *a, **k)\n"
        "torch.save = save\n"
        "runpy.run_module('rookworld.pretrain', run_name='__main__', alter_sys=True)\n")
    p = _pretrain_wrapped(wrapper, out, train, held_out)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("rookworld: pretrain: writing the checkpoint of step 4") and \
        "unexpected pos 704 vs 598" in last and "resume=true" in last, last
    assert not (out / ".checkpoint.tmp").exists() and not (out / "model").exists()
    assert torch.load(out / "checkpoint" / "state.pt", weights_only=True)["step"] == 2
    p = _pretrain_run(out, train, held_out, "steps=4", "checkpoint_every=2")
    assert p.returncode == 0 and "resuming from step 2" in p.stdout, p.stderr[-2000:]
    assert _log_steps(out) == [1, 2, 3, 4]


def test_a_full_disk_while_logging_ends_pretrain_in_one_line_and_the_rerun_resumes(
        tmp_path, synthetic_data):
    """The log's third row meets a full disk (after the step-2 checkpoint): one line naming
    the file and resume=true, exit 1; the same command again continues from step 2."""
    train, held_out = synthetic_data
    out = tmp_path / "run"
    wrapper = tmp_path / "full_log.py"
    wrapper.write_text(
        "import builtins, errno, runpy\nreal = builtins.open\n"
        "class Full:\n"
        "    def __init__(self, f):\n        self.f, self.n = f, 0\n"
        "    def write(self, s):\n        self.n += 1\n"
        "        if self.n == 3:\n"
        "            raise OSError(errno.ENOSPC, 'No space left on device', self.f.name)\n"
        "        return self.f.write(s)\n"
        "    def __getattr__(self, k):\n        return getattr(self.f, k)\n"
        "def opened(file, mode='r', *a, **k):\n    f = real(file, mode, *a, **k)\n"
        "    return Full(f) if str(file).endswith('pretrain_log.jsonl') and 'a' in mode else f\n"
        "builtins.open = opened\n"
        "runpy.run_module('rookworld.pretrain', run_name='__main__', alter_sys=True)\n")
    p = _pretrain_wrapped(wrapper, out, train, held_out)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith(f"rookworld: pretrain: writing {out / 'pretrain_log.jsonl'} failed "
                           "(No space left on device)") and "resume=true" in last, last
    p = _pretrain_run(out, train, held_out, "steps=4", "checkpoint_every=2")
    assert p.returncode == 0 and "resuming from step 2" in p.stdout, p.stderr[-2000:]
    assert _log_steps(out) == [1, 2, 3, 4]


def test_a_rerun_with_other_settings_is_refused_naming_them(tmp_path, synthetic_data):
    """The checkpoint records the settings that shape the run: a rerun under another lr and
    seed (or data) is refused with one line naming them, and changes nothing; time budget,
    stop, checkpoint and curve settings may change."""
    train, held_out = synthetic_data
    out = tmp_path / "run"
    p = _pretrain_run(out, train, held_out, "steps=4", "checkpoint_every=2", "stop_at=2")
    assert p.returncode == 0, p.stderr[-2000:]
    log = (out / "pretrain_log.jsonl").read_text()
    state = (out / "checkpoint" / "state.pt").read_bytes()
    [record] = (out / "hydra").glob("*/.hydra/overrides.yaml")  # the first command's
    kept = record.read_text()
    p = _pretrain_run(out, train, held_out, "steps=4", "checkpoint_every=2", "lr=2e-3",
                      "seed=1")
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith(f"rookworld: pretrain: {out} holds a run (step 2) made with other "
                           "settings: seed=0 (this command: 1); lr=0.001 (this command: 0.002). "
                           "Continue it with the checkpoint's values, or start over with "
                           "resume=false or another out_dir"), last
    other = tmp_path / "other.jsonl"  # the training rows less the last: other data
    other.write_text("".join(Path(train).read_text().splitlines(keepends=True)[:-1]))
    p = _pretrain_run(out, str(other), held_out, "steps=4", "checkpoint_every=2")
    assert p.returncode == 1 and "data.train=" in p.stderr and str(other) in p.stderr
    assert (out / "pretrain_log.jsonl").read_text() == log  # nothing changed
    assert (out / "checkpoint" / "state.pt").read_bytes() == state
    assert record.read_text() == kept  # each command's record beside, not over, the first
    p = _pretrain_run(out, train, held_out, "steps=4", "checkpoint_every=1", "max_minutes=30",
                      "curve_every=2", "curve_per_task=2", "data.eval_per_task=2")
    assert p.returncode == 0 and "resuming from step 2" in p.stdout, p.stderr[-2000:]
    assert _log_steps(out) == [1, 2, 3, 4]
    lrs = [json.loads(x)["lr"] for x in (out / "pretrain_log.jsonl").read_text().splitlines()]
    assert lrs == pytest.approx([get_lr(s, SimpleNamespace(lr=1e-3, min_lr=1e-4,
                                                           warmup_steps=1, steps=4))
                                 for s in range(4)])


@pytest.mark.slow  # two pretraining stages and an export: ~25 s
def test_a_stage_from_an_exported_model_continues_its_lineage(tmp_path, synthetic_data):
    train, held_out = synthetic_data
    first, second = tmp_path / "first", tmp_path / "second"
    _pretrain(tmp_path / "a", train, held_out, "steps=2", "curve_every=2",
              f"export_to={first}")
    for _ in range(2):  # the second call resumes the finished stage and exports it again
        _pretrain(tmp_path / "b", train, held_out, "steps=4", "curve_every=2",
                  f"export_to={second}", model=("model=embedded", f"model.path={first}"))
    lineage = json.loads((second / "training.json").read_text())
    assert [s["stage"] for s in lineage["stages"]] == [1, 2]
    assert lineage["stages"][0]["start"] == "random weights"
    assert lineage["stages"][1]["start"] == "stage 1's weights"
    assert "model=embedded" in lineage["stages"][1]["command"]
    sha = hashlib.sha256(Path(train).read_bytes()).hexdigest()
    assert [s["data"]["sha256"] for s in lineage["stages"]] == [sha, sha]
    # samples seen continue over the stages: 2 steps of 4, then 4 steps of 4
    assert [(r["stage"], r["samples"]) for r in lineage["curve"]] == [(1, 8), (2, 16), (2, 24)]
    card = (second / "MODEL_CARD.md").read_text()
    assert "1. From random weights: 2 steps" in card
    assert "2. From stage 1's weights: 4 steps" in card and "In all: 24 samples" in card


def test_a_stage_records_its_training_file_and_the_command_that_makes_it(tmp_path):
    train = tmp_path / "train.jsonl.gz"
    train.write_bytes(b"rows")
    want = {"path": str(train), "samples": 7, "sha256": hashlib.sha256(b"rows").hexdigest(),
            "made_by": None}
    assert data_record(str(train), 7) == want
    command = "python -m rookworld.data.generate n_games=3 out_dir=x"
    (tmp_path / "DATA_CARD.md").write_text(f"# RookWorld data\n\n    {command}\n\n- rows\n")
    record = data_record(str(train), 7)
    assert record == {**want, "made_by": command}
    stage = {"stage": 5, "start": "stage 4's weights", "steps": 2, "samples": 8, "minutes": 1.0,
             "command": "python -m rookworld.pretrain", "data": record, "commit": "abc1234"}
    older = {**stage, "stage": 4, "commit": None, "recorded_in": "def5678"}
    card = model_card(SimpleNamespace(curve_per_task=1, steps=2),
                      GPT2Config(vocab_size=50, n_positions=40, n_embd=32, n_layer=2, n_head=2),
                      {"eval": {"held_out": {}}, "parameters": 1000},
                      {"stages": [older, stage], "curve": []})
    assert (f"Data: `{train}`, 7 samples, sha256 `{want['sha256'][:16]}`, made by\n\n"
            f"       {command}") in card
    assert "threads, code of commit abc1234:" in card  # the code each stage trained with
    assert "threads, recorded in commit def5678:" in card
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                          capture_output=True).stdout.strip()
    assert code_commit().startswith(head) if head else code_commit() is None
    # a file shipped with the package is named relative to the package's parent
    assert (data_record(pkg_data("train.jsonl.gz"), 1)["path"]
            == "rookworld/assets/data/train.jsonl.gz")


def test_learning_rate_warms_up_then_decays_by_cosine_to_min_lr():
    cfg = SimpleNamespace(lr=1e-3, min_lr=1e-4, warmup_steps=10, steps=110)
    # warm-up lr * (step + 1) / warmup_steps, then min + (lr - min) * (1 + cos(pi * p)) / 2
    # with p the share of the decay done (0 at step 10, 1/2 at 60, 1 from 110 on)
    want = {0: 1e-4, 4: 5e-4, 9: 1e-3, 10: 1e-3, 60: 5.5e-4, 110: 1e-4, 500: 1e-4}
    assert {s: get_lr(s, cfg) for s in want} == pytest.approx(want)


def test_export_to_the_shipped_model_is_refused_unless_asked(tmp_path):
    from rookworld.errors import ConfigError
    from rookworld.policy import EMBEDDED_DIR
    from rookworld.pretrain import check_export_target

    with pytest.raises(ConfigError, match="replace_shipped=true"):
        check_export_target(str(EMBEDDED_DIR), replace_shipped=False)
    check_export_target(str(EMBEDDED_DIR), replace_shipped=True)
    check_export_target(str(tmp_path / "model"), replace_shipped=False)
    # the command line: refused before anything is read (a missing data file would fail
    # later, so a broken refusal still could not reach training or the export)
    before = {p.name: p.stat().st_mtime_ns for p in EMBEDDED_DIR.iterdir()}
    out = subprocess.run([sys.executable, "-m", "rookworld.pretrain",
                          "export_to=rookworld/assets/model", f"out_dir={tmp_path / 'run'}",
                          f"data.train={tmp_path / 'missing.jsonl'}",
                          f"hydra.run.dir={tmp_path / 'hydra'}"],
                         cwd=Path(__file__).resolve().parents[1], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode != 0 and "replace_shipped=true" in out.stderr, out.stderr[-2000:]
    assert {p.name: p.stat().st_mtime_ns for p in EMBEDDED_DIR.iterdir()} == before


def test_the_model_card_describes_gpt2_and_other_families():
    from transformers import LlamaConfig

    from rookworld.gpt2 import GPT2Config
    from rookworld.model_card import architecture

    gpt2 = architecture(GPT2Config(n_layer=4, n_embd=256, n_head=4, n_positions=384,
                                   vocab_size=96), 3_300_000)
    assert gpt2 == ("A character-level GPT-2 (4 layers, 256 wide, 4 heads, 3,300,000 parameters, "
                    "384 positions)")
    llama = architecture(LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                     max_position_embeddings=512, vocab_size=32000), 1000)
    assert llama == "A llama model (2 layers, 64 wide, 4 heads, 1,000 parameters, 512 positions)"


def test_a_llama_model_pretrains_and_exports_with_its_card(tmp_path, synthetic_data):
    from test_backends import _tiny_family

    train, held_out = synthetic_data
    _tiny_family("llama", tmp_path / "llama")
    _pretrain(tmp_path / "run", train, held_out, "steps=2", f"export_to={tmp_path / 'export'}",
              model=["model=hf", f"model.path={tmp_path / 'llama'}"])
    card = (tmp_path / "export" / "MODEL_CARD.md").read_text()
    assert "llama model (2 layers, 32 wide" in card
    assert (tmp_path / "export" / "config.json").exists()


@pytest.mark.usefixtures("stockfish")
def test_with_a_strength_suite_the_curve_and_the_card_carry_playing_strength(tmp_path,
                                                                            synthetic_data):
    train, held_out = synthetic_data
    _pretrain(tmp_path / "run", train, held_out, "steps=2", "curve_every=1",
              f"export_to={tmp_path / 'export'}", "strength=fast", "strength.puzzles=3",
              "strength.random_games=2", "strength.selfplay_games=1",
              "strength.acpl_positions=2", "strength.max_plies=4", "strength.acpl_depth=2")
    curve = read_curve(tmp_path / "run" / "curve.jsonl")
    assert [r["step"] for r in curve] == [1, 2]
    for r in curve:
        assert 0.0 <= r["eval/strength/puzzles_first"] <= 1.0
        assert "eval_se/strength/puzzles_first" in r and "eval/strength/selfplay_plies" in r
    report = json.loads((tmp_path / "run" / "pretrain_report.json").read_text())
    assert "eval/strength/random_score" in report["strength"]
    assert (tmp_path / "run" / "strength" / "final" / "strength.md").exists()
    card = (tmp_path / "export" / "MODEL_CARD.md").read_text()
    assert "| puzzles_first | " in card and "| puzzles_first | puzzles_illegal |" in card


def test_a_start_over_in_a_used_out_dir_records_its_own_starting_weights(tmp_path,
                                                                         synthetic_data):
    """resume=false in an out_dir that a run from the shipped model used: the export's
    lineage starts from this run's random weights, not from the shipped model's stages."""
    train, held_out = synthetic_data
    out, export = tmp_path / "run", tmp_path / "export"
    _pretrain(out, train, held_out, "steps=1", "curve_every=0", model=("model=embedded",))
    _pretrain(out, train, held_out, "steps=1", "curve_every=0", "resume=false",
              f"export_to={export}")
    lineage = json.loads((export / "training.json").read_text())
    assert [(s["stage"], s["start"]) for s in lineage["stages"]] == [(1, "random weights")]
    assert "1. From random weights: 1 steps" in (export / "MODEL_CARD.md").read_text()


def test_pretrain_relabels_or_drops_defective_rook_rows_as_data_on_defect_says(tmp_path,
                                                                               synthetic_data):
    from test_data import A_LINE, P_LINE  # P_LINE's B: is not its best move

    _, held_out = synthetic_data
    train = tmp_path / "rook.txt"
    train.write_text("\n".join([P_LINE, A_LINE] * 2) + "\n")
    p = _pretrain_run(tmp_path / "relabel", str(train), held_out, "steps=1",
                      "data.on_defect=relabel")
    assert p.returncode == 0, p.stderr[-2000:]
    report = json.loads((tmp_path / "relabel" / "pretrain_report.json").read_text())
    assert report["data"]["samples"] == 4
    p = _pretrain_run(tmp_path / "drop", str(train), held_out, "steps=1")  # drop by default
    assert p.returncode == 1 and "more than the 2 samples" in p.stderr, p.stderr[-2000:]


@pytest.mark.parametrize(("override", "message"), [
    ("max_minutes=null", "max_minutes must be a finite number > 0, got None"),
    ("max_minutes=-5", "max_minutes must be a finite number > 0, got -5"),
    ("max_minutes=0", "max_minutes must be"),
    ("max_minutes=abc", "max_minutes must be"),
    ("stop_at=0", "stop_at must be an integer >= 1 or null"),
    ("stop_at=1.5", "stop_at must be"),
    ("stop_at=true", "stop_at must be"),
    ("data.on_defect=ignore", "data.on_defect must be drop or relabel"),
])
def test_a_bad_time_budget_stop_or_defect_choice_is_named_before_loading(override, message):
    from rookworld.config import compose
    from rookworld.errors import ConfigError
    from rookworld.pretrain import check_settings

    with pytest.raises(ConfigError, match=message):
        check_settings(compose([override], config_name="pretrain"))


def test_good_time_budgets_and_stops_pass_the_checks():
    from rookworld.config import compose
    from rookworld.pretrain import check_settings

    for overrides in (["max_minutes=0.5", "stop_at=3"], ["max_minutes=40", "stop_at=null"],
                      ["data.on_defect=relabel"]):
        check_settings(compose(overrides, config_name="pretrain"))


def test_max_minutes_null_ends_pretrain_with_one_line(tmp_path):
    p = subprocess.run([sys.executable, "-m", "rookworld.pretrain", "max_minutes=null",
                        f"out_dir={tmp_path / 'run'}", f"hydra.run.dir={tmp_path / 'hydra'}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert p.stderr.strip().splitlines()[-1] == (
        "rookworld: max_minutes must be a finite number > 0, got None")
    assert not (tmp_path / "run").exists()  # stopped before anything was written


def test_a_stage_records_where_it_trained_with_its_autocast_dtype():
    from rookworld.pretrain import device_name

    cpu = torch.device("cpu")
    assert device_name(cpu, None) == "cpu"
    assert device_name(cpu, torch.bfloat16) == "cpu, bfloat16 autocast"


def test_settings_compare_by_the_checkpoints_keys_and_the_data_by_content():
    from rookworld.pretrain import changed_settings

    data = {"path": "a/train.jsonl", "sha256": "0" * 64}
    saved = {"lr": 1e-3, "model.n_embd": 32, "data.train": data}
    assert changed_settings({}, {"lr": 5.0}) == []  # a checkpoint that records none
    assert changed_settings(saved, {**saved, "data.train": {**data, "path": "b/x.jsonl"},
                                    "max_minutes": 9, "new_key": 1}) == []
    assert changed_settings(saved, {"lr": 0.001, "data.train": {**data, "sha256": "1" * 64}}) == [
        "model.n_embd=32 (this command: not set)",
        f"data.train=a/train.jsonl, sha256 {'0' * 12} (this command: a/train.jsonl, sha256 "
        f"{'1' * 12})"]

