"""Security: secrets never leak; configs cannot run arbitrary code; loading a
checkpoint or a model never unpickles arbitrary objects."""

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from omegaconf import OmegaConf

from rookworld.config import ConfigError, compose, instantiate
from rookworld.redact import MASK, RedactFilter, redact, redact_config, restore_redacted
from rookworld.train import build_parts, run

PG_URL = "postgresql+psycopg://u:s3cret@127.0.0.1/db"
WANDB_KEY = "0123456789abcdef0123456789abcdef01234567"  # a made-up 40-hex W&B key

# ---------------------------------------------------------------- redaction

LEAKS = [  # text, the secret that must be gone, what must stay
    (f"hydra.sweeper.storage={PG_URL}", "s3cret", "postgresql+psycopg://u:REDACTED@127.0.0.1/db"),
    (f"sweep.storage={PG_URL}", "s3cret", "u:REDACTED@"),
    # as Hydra's launcher prints and saves an override: ':' escaped
    ("sweep.storage=postgresql+psycopg\\://u\\:s3cret@127.0.0.1\\:5432/db", "s3cret",
     "postgresql+psycopg\\://u\\:REDACTED@127.0.0.1\\:5432/db"),
    ("mysql://root:p%40ss@db.example:3306/x", "p%40ss", "root:REDACTED@db.example:3306"),
    ("redis://:tok3n@cache:6379/0", "tok3n", "redis://:REDACTED@cache"),
    ("https://x-access-token:ghp_AbC123@github.com/o/r.git", "ghp_AbC123", "github.com/o/r"),
    (f"WANDB_API_KEY={WANDB_KEY}", WANDB_KEY, "WANDB_API_KEY=REDACTED"),
    ("logger.wandb.api_key=abc123xyz", "abc123xyz", "api_key=REDACTED"),
    ("  password: hunter2", "hunter2", "password: REDACTED"),
    ('{"hf_token": "hf_abcdef", "step": 3}', "hf_abcdef", '"hf_token": "REDACTED", "step": 3'),
    ('{"token": 123456}', "123456", '"token": "REDACTED"'),  # stays valid JSON
    ("client_secret = 'shh-its-secret'", "shh-its-secret", "client_secret = 'REDACTED'"),
    ("AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI", "wJalrXUtnFEMI", "AWS_SECRET_ACCESS_KEY=REDACTED"),
]

KEPT = [  # text that holds no secret and must come out unchanged
    "max_new_tokens: 160",
    '{"time/tokens_per_s": 123.4, "sample/tokens": 77.0}',
    "sqlite:////work/main/multirun/grpo_stability/optuna.db",
    "postgresql+psycopg://rookworld@127.0.0.1:5432/rookworld",  # user, no password
    "http://host:8080/path@v2",
    "api_key: null",
    "api_key: ${oc.env:WANDB_API_KEY}",  # an interpolation names the secret, does not hold it
    "author: someone",
    "P: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1 M: e2e4 E: 0.3 B: e2e4",
]


@pytest.mark.parametrize("text,secret,kept", LEAKS, ids=[x[1] for x in LEAKS])
def test_redact_masks_the_secret_and_keeps_the_rest(text, secret, kept):
    out = redact(text)
    assert secret not in out and kept in out, out
    assert redact(out) == out  # idempotent


@pytest.mark.parametrize("text", KEPT)
def test_redact_leaves_text_without_secrets_alone(text):
    assert redact(text) == text


def test_secret_environment_values_are_masked_anywhere(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", WANDB_KEY)
    monkeypatch.setenv("OPTUNA_STORAGE", PG_URL)
    text = f"wandb: logging in with {WANDB_KEY} to {PG_URL}"
    out = redact(text)
    assert WANDB_KEY not in out and "s3cret" not in out and out.count(MASK) == 2


def test_redacted_yaml_and_json_stay_loadable():
    cfg = {"sweep": {"storage": PG_URL}, "db": {"password": "hunter2", "port": 5432},
           "logger": {"wandb": {"api_key": WANDB_KEY, "project": "rookworld"}},
           "sampler": {"max_new_tokens": 160}, "tags": [f"url={PG_URL}"]}
    for dump, load in ((yaml.safe_dump, yaml.safe_load), (json.dumps, json.loads)):
        back = load(redact(dump(cfg)))
        assert back == redact_config(cfg)
    clean = redact_config(cfg)
    assert clean["db"] == {"password": MASK, "port": 5432}
    assert clean["logger"]["wandb"] == {"api_key": MASK, "project": "rookworld"}
    assert clean["sweep"]["storage"] == "postgresql+psycopg://u:REDACTED@127.0.0.1/db"
    assert clean["sampler"] == {"max_new_tokens": 160} and "s3cret" not in clean["tags"][0]


def test_resume_takes_masked_values_from_the_resuming_command():
    saved = OmegaConf.create(redact_config({"sweep": {"storage": PG_URL}, "db": {"password": "x1"},
                                            "seed": 3}))
    current = OmegaConf.create({"sweep": {"storage": PG_URL}, "seed": 0})
    assert restore_redacted(saved, current) == ["db.password"]  # not given again: stays masked
    assert saved.sweep.storage == PG_URL and saved.seed == 3


def test_log_filter_masks_messages_and_their_arguments(caplog):
    log = logging.getLogger("rookworld.test_security")
    caplog.handler.addFilter(RedactFilter())
    with caplog.at_level(logging.INFO):
        log.info("Storage: %s", PG_URL)
        log.info(f"api_key={WANDB_KEY}")
    text = caplog.text
    assert "s3cret" not in text and WANDB_KEY not in text and text.count(MASK) == 2


def test_config_error_messages_are_masked(tiny_overrides):
    with pytest.raises(ConfigError) as err:
        build_parts(compose(tiny_overrides + [f"device={PG_URL}"]))
    assert "device" in str(err.value) and "s3cret" not in str(err.value)


def _files_holding(root: Path, secrets: list[str]) -> list[str]:
    hits = []
    for f in root.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            hits += [f"{f.relative_to(root)}: {s}" for s in secrets if s.encode() in data]
    return hits


def test_no_secret_in_console_logs_saved_configs_metrics_or_wandb(tiny_overrides, tmp_path):
    """A real run through the CLI with a storage URL carrying a password, a secret
    config key and a W&B API key in the environment, logging to W&B (offline)."""
    secrets = ["s3cret", "hunter2secret", WANDB_KEY]
    env = dict(os.environ, WANDB_MODE="offline", WANDB_API_KEY=WANDB_KEY, OMP_NUM_THREADS="1",
               HYDRA_FULL_ERROR="1", WANDB_SILENT="true")
    run_dir = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, "-m", "rookworld.train", *tiny_overrides, "steps=1", "logger=wandb",
         f"+sweep.storage={PG_URL}", "+db.password=hunter2secret", f"hydra.run.dir={run_dir}",
         "hydra.job_logging.root.level=DEBUG"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    console = out.stdout + out.stderr
    assert not [s for s in secrets if s in console]
    assert _files_holding(run_dir, secrets) == []
    saved = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())
    assert saved["sweep"]["storage"] == "postgresql+psycopg://u:REDACTED@127.0.0.1/db"
    assert saved["db"]["password"] == MASK
    assert list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))  # W&B did write its run
    assert (run_dir / "metrics.jsonl").stat().st_size > 0 and (run_dir / "train.log").exists()


# ------------------------------------------------- configs cannot run code

EVIL_TARGETS = [
    ("model._target_=os.system", "outside the execution whitelist"),
    ("model._target_=subprocess.run", "outside the execution whitelist"),
    ("model._target_=builtins.eval", "outside the execution whitelist"),
    ("model._target_=torch.load", "outside the execution whitelist"),
    ("optim.schedule._target_=os.system", "outside the execution whitelist"),
    ("+logger.console._target_=os.system", "outside the execution whitelist"),
    # a project module that imports os: the name passes a prefix match, its object does not
    ("model._target_=rookworld.run_dir.os.system", "does not name a callable of the project"),
    ("model._target_=rookworld.train.torch.load", "does not name a callable of the project"),
]


@pytest.mark.parametrize("override,message", EVIL_TARGETS, ids=[o for o, _ in EVIL_TARGETS])
def test_targets_outside_the_project_are_refused_naming_the_key(override, message, tmp_path,
                                                                tiny_overrides):
    marker = tmp_path / "pwned"
    overrides = [o for o in tiny_overrides if not o.startswith("model.")] + [override]
    key = override.lstrip("+").split("=")[0]
    with pytest.raises(ConfigError, match=message) as err:
        run(compose(overrides), tmp_path / "run")
    assert key in str(err.value) and not marker.exists()


@pytest.mark.parametrize("target", ["os.system", "rookworld.run_dir.os.system",
                                    "subprocess.getoutput", "builtins.exec"])
def test_hydra_instantiate_itself_refuses_outside_the_whitelist(target, tmp_path):
    """The execution whitelist is the boundary even when validate() is bypassed."""
    marker = tmp_path / "pwned"
    node = OmegaConf.create({"_target_": target, "_args_": [f"touch {marker}"]})
    with pytest.raises(ConfigError):
        instantiate(node)
    assert not marker.exists()


def test_cli_refuses_os_system_and_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    out = subprocess.run(
        [sys.executable, "-m", "rookworld.train", "model._target_=os.system",
         f"+model.command=touch {marker}", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "outside the execution whitelist" in out.stderr
    assert not marker.exists()


def test_a_hydra_callback_outside_the_whitelist_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    out = subprocess.run(
        [sys.executable, "-m", "rookworld.train", "model=tiny_random", "dry_run=true",
         "+hydra.callbacks.evil._target_=os.system",
         f"+hydra.callbacks.evil.command=touch {marker}",
         f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and not marker.exists()
    assert "os.system" in out.stderr


# ------------------------------------------------------ nothing unpickled

class Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_checkpoint_state_is_refused(tiny_overrides, tmp_path):
    from rookworld.run_dir import load_checkpoint, save_checkpoint
    from rookworld.train import build_engine
    cfg = compose(tiny_overrides)
    engine = build_engine(cfg, build_parts(cfg), instantiate(cfg.reward))
    ckpt = save_checkpoint(tmp_path, 1, engine, {})
    marker = tmp_path / "pwned"
    torch.save({"next_step": 1, "engine": Payload(marker)}, ckpt / "state.pt")
    with pytest.raises(ValueError, match="refusing to unpickle"):
        load_checkpoint(ckpt, engine)
    assert not marker.exists()


def _model_dir(tmp_path: Path) -> Path:
    from rookworld.policy import build_random, save_policy
    d = tmp_path / "model"
    save_policy(build_random(n_layer=1, n_embd=16, n_head=2, n_positions=64), d)
    return d


def test_model_weights_come_from_safetensors_only(tmp_path):
    """A directory holding only a pickled pytorch_model.bin is refused, unread."""
    from rookworld.policy import load_pretrained
    d = _model_dir(tmp_path)
    marker = tmp_path / "pwned"
    (d / "model.safetensors").unlink()
    torch.save({"weights": Payload(marker)}, d / "pytorch_model.bin")
    with pytest.raises(OSError):
        load_pretrained(str(d))
    assert not marker.exists()


def test_a_pickle_beside_safetensors_is_ignored(tmp_path):
    from rookworld.policy import load_pretrained
    d = _model_dir(tmp_path)
    marker = tmp_path / "pwned"
    torch.save({"weights": Payload(marker)}, d / "pytorch_model.bin")
    policy = load_pretrained(str(d))
    assert policy.model.config.n_embd == 16 and not marker.exists()


@pytest.mark.parametrize("loader", ["load_pretrained", "load_hf"])
def test_remote_code_in_a_model_directory_is_not_run(tmp_path, loader):
    """A config whose auto_map names a module in the directory loads as plain GPT-2, through
    rookworld's own loader and through transformers' (model=hf), and the module never runs."""
    from rookworld.backends.hub import load_hf
    from rookworld.policy import load_pretrained
    d = _model_dir(tmp_path)
    marker = tmp_path / "pwned"
    (d / "evil.py").write_text(f"import os\nos.system('touch {marker}')\n"
                               "from transformers import GPT2LMHeadModel as Evil\n")
    config = json.loads((d / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "evil.Evil"}
    (d / "config.json").write_text(json.dumps(config))
    load = {"load_pretrained": load_pretrained, "load_hf": load_hf}[loader]
    policy = load(str(d))
    assert type(policy.model).__module__.split(".")[0] in {"rookworld", "transformers"}
    assert policy.model.config.n_embd == 16
    assert not marker.exists()


# ------------------------------------------- a sweep on PostgreSQL with a password

@pytest.fixture
def postgres_url(tmp_path):
    """ROOKWORLD_PG_URL, or a throwaway server from scripts/start_postgres.sh (trust auth:
    any password is accepted, so a URL with one is a real, working URL)."""
    url = os.environ.get("ROOKWORLD_PG_URL")
    if url:
        yield url
        return
    script = Path(__file__).parents[1] / "scripts" / "start_postgres.sh"
    start = subprocess.run(["bash", str(script)], capture_output=True, text=True)  # in /tmp
    if start.returncode != 0:
        if os.environ.get("ROOKWORLD_REQUIRE_PG"):  # CI: never skip
            pytest.fail(f"no PostgreSQL: {start.stderr.strip()[-200:]}")
        pytest.skip(f"no PostgreSQL: {start.stderr.strip()[-200:]}")
    stop = start.stderr.rsplit("stop it with: ", 1)[-1].strip()
    try:
        yield start.stdout.strip()
    finally:
        subprocess.run(stop, shell=True, capture_output=True)


@pytest.mark.slow
@pytest.mark.postgres
def test_sweep_storage_password_never_leaks(postgres_url, tiny_overrides, tmp_path):
    import optuna
    head, tail = postgres_url.split("://", 1)
    user, host = tail.split("@", 1)
    url = f"{head}://{user.split(':')[0]}:s3cret@{host}"  # the server ignores the password
    study = f"leak{os.getpid()}"
    env = dict(os.environ, HYDRA_FULL_ERROR="1", OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, "-m", "rookworld.train", "-m", "hparams_search=grpo_stability",
         *tiny_overrides, "steps=1", "batch_size=4", "hydra.sweeper.n_trials=1",
         "hydra.sweeper.params=null", f"sweep.storage={url}",
         f"hydra.sweeper.study_name={study}", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    console = out.stdout + out.stderr
    assert "Storage: " in console and "s3cret" not in console
    assert ":REDACTED@127.0.0.1" in console  # the Storage: line, user and host kept
    assert _files_holding(tmp_path / "sweep", ["s3cret"]) == []
    trials = optuna.load_study(study_name=study, storage=url).trials
    assert [t.state.name for t in trials] == ["COMPLETE"]
