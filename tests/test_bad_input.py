"""Bad input gets a clear message before any model loads, and leaves nothing half-written.

Config: a table of wrong types, out-of-range values, unknown options and conflicts,
each asserting that the message names the key (tests/test_train.py::BAD holds 11
more). Data: invalid FENs, illegal moves, wrong field counts, empty files, binary
junk, all-defective sets. Environment: Stockfish missing or not executable, model
path missing, run directory not writable.
"""

import functools
import json
import os
import random
import stat
import subprocess
import sys

import chess
import pytest
from hydra.errors import HydraException

from rookworld import policy as policy_mod
from rookworld.config import ConfigError, compose
from rookworld.train import build_parts, resolve_resume, run

# (overrides, the key the message must name)
CONFIG_CASES = [
    # out of range
    (["optim.lr=-0.001"], "optim.lr"),
    (["num_generations=0"], "num_generations"),
    (["batch_size=3"], "batch_size"),  # num_generations=8 does not divide 3
    (["batch_size=1"], "batch_size"),
    (["sampler.top_p=0"], "sampler.top_p"),
    (["sampler.top_p=-0.1"], "sampler.top_p"),
    (["+sampler.per_task.A.top_p=2"], "sampler.per_task.A.top_p"),
    (["sampler.top_k=-1"], "sampler.top_k"),
    (["sampler.max_new_tokens=0"], "sampler.max_new_tokens"),
    (["steps=0"], "steps"),
    (["prompts_per_step=0"], "prompts_per_step"),
    (["seed=-1"], "seed"),
    (["micro_batch=-2"], "micro_batch"),
    (["release_memory=often"], "release_memory"),
    (["micro_batch=fast"], "micro_batch"),
    (["micro_batch_tokens=0"], "micro_batch_tokens"),
    (["mmap_threshold_kib=-1"], "mmap_threshold_kib"),
    (["mmap_threshold_kib=big"], "mmap_threshold_kib"),
    (["recompute_activations=maybe"], "recompute_activations"),
    (["rollout_tape_mib=-1"], "rollout_tape_mib"),
    (["rollout_tape_mib=auto"], "rollout_tape_mib"),
    (["eval_every=-1"], "eval_every"),
    (["reference.sync_alpha=0"], "reference.sync_alpha"),
    (["reference.sync_every=-1"], "reference.sync_every"),
    (["algorithm.num_iterations=0"], "algorithm.num_iterations"),
    (["data.eval_per_task=-1"], "data.eval_per_task"),
    (["guard.kl.threshold=-1"], "guard.kl.threshold"),
    (["guard.kl.window=0"], "guard.kl.window"),
    (["guard.nan.lr_backoff=2"], "guard.nan.lr_backoff"),
    (["optim.grad_clip=-1"], "optim.grad_clip"),
    (["optim.betas=[1.5,0.9]"], "optim.betas"),
    (["optim.weight_decay=-1"], "optim.weight_decay"),
    (["optim.eps=0"], "optim.eps"),
    (["optim.schedule.warmup_steps=-1"], "optim.schedule.warmup_steps"),
    (["optim=adamw_cosine", "optim.schedule.min_ratio=2", "steps=50"], "optim.schedule.min_ratio"),
    (["kl=adaptive", "kl.target=-1"], "kl.target"),
    (["task_mix.p_share=1.5"], "task_mix.p_share"),
    (["sweep.replicas=0"], "sweep.replicas"),
    (["examples_to_log=-1"], "examples_to_log"),
    (["sampler.temperature=0"], "sampler.temperature"),  # greedy groups carry no signal
    (["+sampler.per_task.P.temperature=0"], "sampler.per_task.P.temperature"),
    (["model.n_head=3"], "model.n_head"),  # 256 wide: 3 heads do not divide it
    (["reward=graduated_curriculum", "reward.steps=0"], "reward.steps"),
    (["optim=adamw_cosine", "steps=5"], "optim.schedule.warmup_steps"),  # warmup 10 > 5 steps
    # wrong types
    (["optim.lr=abc"], "optim.lr"),
    (["optim.lr=null"], "optim.lr"),
    (["num_generations=2.5"], "num_generations"),
    (["steps=1.5"], "steps"),
    (["checkpoint_every=x"], "checkpoint_every"),
    (["sampler.temperature=abc"], "sampler.temperature"),
    (["kl.beta=abc"], "kl.beta"),
    (["model.n_layer=true"], "model.n_layer"),
    (["dry_run=maybe"], "dry_run"),
    (["reference.enabled=maybe"], "reference.enabled"),
    (["sweep.failed_objective=abc"], "sweep.failed_objective"),
    (["reward=engine", "reward.pool.depth=deep"], "reward.pool.depth"),
    # unknown options, groups and keys
    (["data.on_defect=ignore"], "data.on_defect"),
    (["device=tpu"], "device"),
    (["reference.device=gpu"], "reference.device"),
    (["guard.kl.estimator=k7"], "guard.kl.estimator"),
    (["logger=wandb", "logger.wandb.mode=foo"], "logger.wandb.mode"),
    (["kl=foo"], "kl"),
    (["model=foo"], "model"),
    (["foo=1"], "foo"),
    (["+optim.foo=1"], "optim.foo"),
    (["+sampler.per_task.Q={top_p: 0.5}"], "sampler.per_task"),
    (["task_mix=phased", "task_mix.phases=[]"], "task_mix.phases"),
    # conflicts
    (["kl=adaptive", "reference.enabled=false"], "reference.enabled"),
    (["kl=warmup_fixed", "reference.enabled=false"], "reference.enabled"),
    (["kl=none", "reference.enabled=false"], "guard.kl"),  # the KL guard needs the reference
]


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if any model is built or loaded (the stand-ins keep the real
    functions' names and signatures, so config checks see the real callables)."""
    def refusing(fn):
        @functools.wraps(fn)
        def refuse(*a, **k):
            raise AssertionError("a model was loaded before the bad input was reported")
        return refuse
    for name in ("build_random", "load_pretrained", "load_embedded"):
        monkeypatch.setattr(policy_mod, name, refusing(getattr(policy_mod, name)))


@pytest.mark.parametrize("overrides,key", CONFIG_CASES, ids=[" ".join(o) for o, _ in CONFIG_CASES])
def test_bad_config_names_the_key_before_any_model(overrides, key, tiny_overrides, no_model,
                                                   tmp_path):
    base = [o for o in tiny_overrides if not o.startswith("model.")] \
        if any(o.startswith(("model.", "model=")) for o in overrides) else tiny_overrides
    run_dir = tmp_path / "run"
    with pytest.raises((ConfigError, ValueError, HydraException)) as err:
        run(compose(base + overrides), run_dir)
    message = str(err.value)
    assert key in message, message
    assert not run_dir.exists() or not any(run_dir.iterdir())  # nothing half-written


@pytest.mark.parametrize("overrides,key", [
    (["guard.kl.window=0"], "guard.kl.window"), (["guard.nan.lr_backoff=2"], "lr_backoff"),
    (["guard.kl.threshold=abc"], "guard"), (["+guard.kl.foo=1"], "foo"),
    (["guard.nan=null"], "guard.nan"), (["guard=null"], "guard"),
    (["prompt_filter=null"], "prompt_filter.oversample=1"), (["anchor=null"], "anchor.coef=0")])
def test_guards_and_switched_off_parts_are_config_errors(overrides, key, tiny_overrides,
                                                         no_model, tmp_path):
    """A config error (one line from the CLI), never the guard's own ValueError or a later
    AttributeError on a part set to null."""
    with pytest.raises(ConfigError, match=key):
        run(compose(tiny_overrides + overrides), tmp_path / "run")


def test_completions_that_outgrow_the_models_positions_stop_before_any_sampling(
        tiny_overrides, tmp_path):
    """Refused before the first evaluation, naming the key that sets the task's budget, and
    with nothing recorded: the same command with the setting fixed runs in the directory."""
    over = [o for o in tiny_overrides if not o.startswith("sampler.max_new_tokens")]
    with pytest.raises(ConfigError, match=r"^sampler.max_new_tokens=400 \(task P\).*320 "
                                          "positions"):
        run(compose(over + ["sampler.max_new_tokens=400"]), tmp_path)
    assert not (tmp_path / "metrics.jsonl").exists()  # not even the first evaluation ran
    assert not (tmp_path / "outcome.json").exists()
    with pytest.raises(ConfigError, match=r"^sampler.per_task.A.max_new_tokens=400 \(task A"):
        run(compose(over + ["sampler.max_new_tokens=24",
                            "sampler.per_task.A.max_new_tokens=400"]), tmp_path)
    fixed = run(compose(over + ["sampler.max_new_tokens=24"]), tmp_path)
    assert fixed.outcome.status == "success"


def test_the_reference_conflict_message_says_how_to_fix(tiny_overrides):
    with pytest.raises(ConfigError, match="set reference.enabled=true, or kl=none guard.kl=null"):
        build_parts(compose(tiny_overrides + ["kl=fixed", "reference.enabled=false"]))


def test_the_cli_prints_the_key_and_exits_nonzero_without_outputs(tmp_path):
    out = subprocess.run([sys.executable, "-m", "rookworld.train", "model=tiny_random",
                          "sampler.top_p=0", f"hydra.run.dir={tmp_path / 'run'}"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "sampler.top_p must be in (0, 1]" in out.stderr
    made = {p.name for p in (tmp_path / "run").iterdir()}
    assert made <= {".hydra", "train.log"}  # only Hydra's own record of the command


def test_resume_of_a_missing_run_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="resume=.*no run there"):
        resolve_resume(compose(["model=tiny_random", f"resume={tmp_path / 'nothing'}"]))


# ------------------------------------------------------------------------- data

def _p_line(fen, moves, evals, best=None):
    """A RookWorld-text P line (columns padded as in the public data)."""
    best = best or moves[max(range(len(evals)), key=evals.__getitem__)]
    return ("P: " + fen.ljust(90) + "M: " + " ".join(moves).ljust(30) + "E: "
            + " ".join(map(str, evals)).ljust(40) + "B: " + best)


START = chess.STARTING_FEN
GOOD_P = _p_line(START, ["e2e4", "d2d4"], [0.3, 0.2])
GOOD_A = f"A: {START}+e2e4+e2e4+" \
         "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1+0.001+0+0"
DEFECTIVE = {  # defect class the loader reports -> lines showing it
    "bad_fen": [_p_line("rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNX w KQkq - 0 1",
                        ["e2e4"], [0.1]),
                GOOD_A.replace("RNBQKBNR w", "RNBQKBN w")],
    "illegal_move": [_p_line(START, ["e2e5", "d2d4"], [0.3, 0.2])],
    "eval_count": [_p_line(START, ["e2e4", "d2d4"], [0.3])],
    "unparseable": [
        "P: " + START,  # no M:/E:/B: fields
        f"A: {START}+e2e4+e2e4",  # 3 fields, no completion
        f"A: {START}+e2e4+e2e4+x+y+z+w+v",  # too many fields
        "just some words", "\x00\x01\x02\xff junk",
    ],
    "bad_history": [GOOD_A.replace("+e2e4+e2e4+", "+e2e4+d2d4+")],
}


def _write(path, lines):
    path.write_text("".join(x + "\n" for x in lines))
    return str(path)


def _run_with_train(tmp_path, tiny_overrides, train: str, extra=()):
    overrides = [o for o in tiny_overrides if not o.startswith("data.train=")]
    return run(compose(overrides + [f"data.train={train}", *extra]), tmp_path / "run")


@pytest.mark.parametrize("defect", sorted(DEFECTIVE))
def test_all_defective_training_data_is_an_error_naming_the_defect(defect, tiny_overrides,
                                                                   tmp_path, no_model):
    train = _write(tmp_path / "train.txt", DEFECTIVE[defect])
    with pytest.raises(ConfigError, match="no usable rows") as err:
        _run_with_train(tmp_path, tiny_overrides, train)
    assert train in str(err.value) and defect in str(err.value)
    assert not (tmp_path / "run" / "data_report.json").exists()
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


BROKEN_GZIP = pytest.param(b"\x1f\x8b\x08\x00junk that is not gzip", id="broken gzip")


@pytest.mark.parametrize("content", [b"", b"\n\n   \n", bytes(random.Random(0).randbytes(4096)),
                                     BROKEN_GZIP], ids=["empty", "blank lines", "binary junk",
                                                        "broken gzip"])
def test_empty_or_junk_files_are_errors_naming_the_file(content, tiny_overrides, tmp_path,
                                                        no_model):
    path = tmp_path / "train.jsonl.gz" if content.startswith(b"\x1f\x8b") else tmp_path / "t.txt"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as err:
        _run_with_train(tmp_path, tiny_overrides, str(path))
    assert str(path) in str(err.value)


def test_missing_data_file_is_an_error(tiny_overrides, tmp_path, no_model):
    with pytest.raises(ConfigError, match="does not exist"):
        _run_with_train(tmp_path, tiny_overrides, str(tmp_path / "nope.jsonl"))


def test_defective_rows_are_counted_and_reported_and_the_rest_used(tiny_overrides, tmp_path,
                                                                   capsys):
    lines = [GOOD_P, GOOD_A] + [x for v in DEFECTIVE.values() for x in v]
    train = _write(tmp_path / "train.txt", lines)
    result = _run_with_train(tmp_path, tiny_overrides, train, ["dry_run=true"])
    assert result.outcome.reason == "dry run"
    report = json.loads((tmp_path / "run" / "data_report.json").read_text())
    got = report["sources"][train]
    assert got["rows"] == len(lines) and got["kept"] == 2
    assert got["dropped"] == len(lines) - 2
    for defect, rows in DEFECTIVE.items():
        assert got["defects"][defect] >= len(rows), defect
    assert report["train"] == {"P": 1, "A": 1}
    assert "bad_fen" in capsys.readouterr().out  # printed too


def test_the_report_counts_positions_in_both_splits_whatever_their_move_counters(
        tiny_overrides, tmp_path):
    later = START.replace(" 0 1", " 4 9")  # the same position after moves that went back
    train = _write(tmp_path / "train.txt", [GOOD_P, GOOD_A])
    held_out = _write(tmp_path / "eval.txt", [_p_line(later, ["e2e4", "d2d4"], [0.3, 0.2]),
                                               GOOD_A])
    _run_with_train(tmp_path, tiny_overrides, train, ["dry_run=true", f"data.eval={held_out}"])
    report = json.loads((tmp_path / "run" / "data_report.json").read_text())
    assert report["positions_in_both_splits"] == 1  # the start position, by both tasks


def test_defective_eval_split_alone_is_an_error(tiny_overrides, tmp_path, no_model):
    bad = _write(tmp_path / "eval.txt", DEFECTIVE["illegal_move"])
    overrides = [o for o in tiny_overrides if not o.startswith("data.eval=")]
    with pytest.raises(ConfigError, match="eval.txt"):
        run(compose(overrides + [f"data.eval={bad}"]), tmp_path / "run")


def test_a_task_the_mix_needs_but_the_data_lacks_is_an_error(tiny_overrides, tmp_path, no_model):
    train = _write(tmp_path / "train.txt", [GOOD_A])
    with pytest.raises(ConfigError, match=r"task_mix needs task\(s\) \['P'\]"):
        _run_with_train(tmp_path, tiny_overrides, train)


# ------------------------------------------------------------------ environment

def test_stockfish_missing_names_the_path_and_the_install_command(tiny_overrides, tmp_path,
                                                                  no_model):
    with pytest.raises((ConfigError, FileNotFoundError), match="apt-get install -y stockfish") \
            as err:
        run(compose(tiny_overrides + ["reward=engine", "+reward.pool.path=/nonexistent/sf"]),
            tmp_path / "run")
    assert "/nonexistent/sf" in str(err.value)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_stockfish_not_executable(tiny_overrides, tmp_path, no_model):
    fake = tmp_path / "stockfish"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(stat.S_IRUSR | stat.S_IWUSR)
    with pytest.raises((ConfigError, FileNotFoundError), match="not executable"):
        run(compose(tiny_overrides + ["reward=engine", f"+reward.pool.path={fake}"]),
            tmp_path / "run")


def test_engine_that_is_not_an_engine(tiny_overrides, tmp_path, no_model):
    fake = tmp_path / "stockfish"
    fake.write_text("#!/bin/sh\necho not a chess engine\n")
    fake.chmod(0o755)
    with pytest.raises(ConfigError, match="EngineReward: engine process died unexpectedly"):
        run(compose(tiny_overrides + ["reward=engine", f"+reward.pool.path={fake}"]),
            tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("model", [["model=rookworld_lm_124m", "model.path=/nonexistent/model"],
                                   ["model=embedded", "model.path=/nonexistent/model"],
                                   ["model=rookworld_lm_124m", "model.path=./no/such/dir"]])
def test_model_path_missing_is_reported_before_loading(model, tiny_overrides, tmp_path, no_model):
    base = [o for o in tiny_overrides if not o.startswith("model")]
    with pytest.raises(ConfigError, match="model.path=.* does not exist"):
        run(compose(base + model), tmp_path / "run")


def test_run_directory_blocked_by_a_file(tiny_overrides, tmp_path, no_model):
    (tmp_path / "file").write_text("in the way")
    with pytest.raises(ConfigError, match="run directory .* is not writable"):
        run(compose(tiny_overrides), tmp_path / "file" / "run")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through permission bits")
def test_run_directory_without_write_permission(tiny_overrides, tmp_path, no_model):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(ConfigError, match="not writable"):
            run(compose(tiny_overrides), ro / "run")
    finally:
        ro.chmod(0o700)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
def test_device_cuda_without_cuda_is_refused_naming_the_key(tiny_overrides):
    with pytest.raises(ConfigError, match=r"^device=cuda: .*no CUDA device.*use cpu"):
        build_parts(compose([*tiny_overrides, "device=cuda"]))
    with pytest.raises(ConfigError, match=r"^reference.device=cuda:1: .*no CUDA device"):
        build_parts(compose([*tiny_overrides, "reference.device=cuda:1"]))


@pytest.mark.parametrize("arg", ["eval_per_task=0", "+eval_per_task=3"])
def test_a_misplaced_key_names_the_right_one(arg):
    from rookworld.config import check_argv
    with pytest.raises(SystemExit, match="eval_per_task is data.eval_per_task"):
        check_argv(["model=embedded", arg])
    check_argv(["data.eval_per_task=0"])  # the right key passes


def test_a_key_added_with_plus_is_warned_about_with_the_nearest_names():
    from omegaconf import OmegaConf

    from rookworld.config import unread_additions
    cfg = OmegaConf.create({"optim": {"lr": 1e-4, "lrr": 1e-4, "weight_decay": 0.0}, "x": 1})
    warnings = unread_additions(cfg, ["optim.lr=1e-3", "+optim.lrr=1e-4", "++x=2"])
    assert warnings == ["+optim.lrr adds a key that no default config has; nothing reads it "
                        "unless its component takes it; did you mean optim.lr?"]


def test_a_plus_key_the_run_checks_is_read_is_not_warned_about(tiny_overrides):
    from rookworld.config import unread_additions

    added = ["+sampler.per_task.P.temperature=0.9", "+reward.pool.path=/usr/games/stockfish"]
    cfg = compose(tiny_overrides + ["reward=engine", *added])
    assert unread_additions(cfg, added) == []


@pytest.mark.parametrize("overrides, warned", [
    ([], False),  # legal_moves: legality only, which move credit carries
    (["reward=graduated"], True),
    (["reward=engine"], True),
    (["reward.policy_weights.top5=0.5"], True),
    (["reward=graduated", "algorithm.credit=sequence"], False),
    (["reward=continuous", "algorithm=dapo"], False)])  # DAPO's credit is sequence
def test_a_reward_that_scores_the_moves_is_warned_about_under_move_credit(overrides, warned):
    """Move credit gives the moves' characters their legality's advantage, so a reward's
    best-move or top-5 judgement reaches only the other tokens: the run says so."""
    from rookworld.config import unreached_reward
    warnings = unreached_reward(compose(overrides))
    assert bool(warnings) == warned
    assert all("algorithm.credit=sequence" in w for w in warnings)


def test_a_missing_external_set_is_reported(tiny_overrides, tmp_path, capsys):
    from omegaconf import OmegaConf

    from rookworld.evaluate import measure
    from rookworld.policy import build_random
    base = compose(tiny_overrides)
    cfg = OmegaConf.create({"sampler": base.sampler, "reward": base.reward,
                            "data": {"eval_per_task": 1,
                                     "external_eval": str(tmp_path / "missing.txt")}})
    from rookworld.data.load import read_samples
    held_out = read_samples(base.data.eval)
    policy = build_random(n_layer=1, n_embd=32, n_head=2, n_positions=320)
    assert "external" not in measure(policy, cfg, held_out)
    assert "missing.txt: no such file; the external ROOK set is skipped" in capsys.readouterr().out


@pytest.mark.parametrize("model", ["embedded", "rookworld_lm_124m", "hf"])
def test_a_model_directory_without_its_tokenizer_names_the_file(model, tiny_overrides,
                                                                tmp_path):
    """A copy of the shipped model less tokenizer.json: one ConfigError naming the directory
    and the file, not transformers' request for sentencepiece or tiktoken."""
    import shutil

    shutil.copytree(policy_mod.EMBEDDED_DIR, tmp_path / "model")
    (tmp_path / "model" / "tokenizer.json").unlink()
    base = [o for o in tiny_overrides if not o.startswith("model")]
    with pytest.raises(ConfigError, match=f"no tokenizer in {tmp_path / 'model'}: "
                                          "tokenizer.json is missing") as err:
        run(compose(base + [f"model={model}", f"model.path={tmp_path / 'model'}"]),
            tmp_path / "run")
    assert "sentencepiece" not in str(err.value)
