"""Secrets out of everything a run prints or writes.

Three kinds of secret are masked wherever text leaves the process (console and
log lines, saved configs, the metrics file, outcome and error files, the W&B
run config):

- the password of a URL: `postgresql+psycopg://u:s3cret@host/db` ->
  `postgresql+psycopg://u:REDACTED@host/db` (user and host stay, for debugging);
- the value of a key whose name says it is a secret (`password`, `api_key`,
  `token`, `secret`, `credentials`, ... at the end of the name), in `key=value`,
  `key: value` and JSON `"key": "value"` text and in config mappings;
- the literal value of a secret environment variable (WANDB_API_KEY, HF_TOKEN,
  any variable whose name says it is a secret), wherever it appears.

    >>> redact("hydra.sweeper.storage=postgresql+psycopg://u:s3cret@127.0.0.1/db")
    'hydra.sweeper.storage=postgresql+psycopg://u:REDACTED@127.0.0.1/db'
    >>> redact_config({"logger": {"api_key": "abc123", "max_new_tokens": 160}})
    {'logger': {'api_key': 'REDACTED', 'max_new_tokens': 160}}

Where it is wired: `RedactFilter` on Hydra's console and file log handlers
(conf/train.yaml), `RedactSavedConfig` (a Hydra callback) rewrites the run's
.hydra/*.yaml and the sweep's multirun.yaml as a job starts, `redact_config` on
the config handed to loggers (W&B), `redact` on metrics rows, outcome.json,
error.txt and on every ConfigError message.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

from .files import atomic_write_text

MASK = "REDACTED"  # a plain word: stays valid YAML, JSON string content and URL text
# A name that ends in one of these words names a secret (max_new_tokens does not: "tokens").
_WORDS = (r"(?:password|passwd|secret|token|api_?key|apikey|access_?key|private_?key"
          r"|secret_?key|credentials?|auth)")
SECRET_NAME = re.compile(rf"(?:.*[^a-z])?{_WORDS}$", re.IGNORECASE)
# Environment variables that hold secrets although their names do not say so.
SECRET_ENV = ("OPTUNA_STORAGE", "DATABASE_URL", "PGPASSWORD")
# Hydra escapes ':' in override strings it prints and saves (`postgresql\://u\:pw@h`).
_URL_PASSWORD = re.compile(r"(?P<head>\b[a-z][a-z0-9+.\-]*\\?://[^:/@\s'\"\\]*\\?:)"
                           r"(?P<pw>[^@/\s'\"]+)(?=@)", re.IGNORECASE)
_KEY_VALUE = re.compile(rf"(?P<key>[\w.\-]*{_WORDS})(?P<sep>['\"]?\s*[=:]\s*)"
                        r"(?P<q>['\"]?)(?P<val>[^\s'\",}\]]+)", re.IGNORECASE)
_NOT_SECRET = {MASK, "null", "none", "~", "true", "false"}  # YAML/JSON non-values stay
_NUMBER = re.compile(r"[-+]?\d+(\.\d*)?([eE][-+]?\d+)?")
_MIN_ENV_SECRET = 6  # shorter environment values are too likely to occur by chance


def _env_secrets() -> list[str]:
    """Values of secret environment variables, longest first."""
    vals = {v for k, v in os.environ.items()
            if (k in SECRET_ENV or SECRET_NAME.match(k)) and len(v) >= _MIN_ENV_SECRET}
    return sorted(vals, key=len, reverse=True)


def _mask_key_value(m: re.Match) -> str:
    val = m.group("val")
    if (val.lower() in _NOT_SECRET or val.startswith(("${", MASK))
            or not SECRET_NAME.match(m.group("key"))):
        return m.group(0)
    q = m.group("q") or ('"' if _NUMBER.fullmatch(val) else "")  # a bare number: keep JSON valid
    return f"{m.group('key')}{m.group('sep')}{q}{MASK}{q if not m.group('q') else ''}"


def redact(text: str) -> str:
    """`text` with URL passwords, secret-named values and secret environment
    values replaced by `MASK`."""
    if not isinstance(text, str) or not text:
        return text
    for value in _env_secrets():
        text = text.replace(value, MASK)
    text = _URL_PASSWORD.sub(lambda m: m.group("head") + MASK, text)
    return _KEY_VALUE.sub(_mask_key_value, text)


def redact_config(obj: Any) -> Any:
    """A copy of a plain config (dicts, lists, scalars) with secret-named keys'
    values masked and every string passed through `redact`."""
    if isinstance(obj, dict):
        return {k: (MASK if isinstance(k, str) and SECRET_NAME.match(k)
                    and isinstance(v, str) and v else redact_config(v)) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(redact_config(v) for v in obj)
    return redact(obj) if isinstance(obj, str) else obj


def redact_file(path: Path) -> bool:
    """Rewrite a text file with its secrets masked (atomically); True if it changed."""
    path = Path(path)
    if not path.is_file():
        return False
    text = path.read_text()
    clean = redact(text)
    if clean == text:
        return False
    atomic_write_text(path, clean)
    return True


class RedactFilter(logging.Filter):
    """A logging filter that masks secrets in every record's message (Hydra's
    `hydra.job_logging` / `hydra.hydra_logging` handlers use it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        clean = redact(msg)
        if clean != msg:
            record.msg, record.args = clean, None
        return True


class RedactSavedConfig(Callback):
    """Hydra callback: as a job starts, mask secrets in the files Hydra has just
    saved (.hydra/config.yaml, hydra.yaml, overrides.yaml) and in the sweep's
    multirun.yaml. Hydra writes them before `on_job_start`; this runs before
    any training code."""

    def on_job_start(self, config, **kwargs) -> None:
        hc = config.hydra
        if hc.output_subdir is not None:
            out = Path(hc.runtime.output_dir) / hc.output_subdir
            for name in ("config.yaml", "hydra.yaml", "overrides.yaml"):
                redact_file(out / name)
        if hc.mode is not None and hc.mode.name == "MULTIRUN":
            redact_file(Path(hc.sweep.dir) / "multirun.yaml")

    def on_multirun_end(self, config, **kwargs) -> None:
        for f in Path(config.hydra.sweep.dir).glob("*.yaml"):
            redact_file(f)


def _leaves(obj, prefix: str = ""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, f"{prefix}{k}.")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _leaves(v, f"{prefix}[{i}].")
    else:
        yield prefix[:-1].replace(".[", "["), obj


def restore_redacted(saved, current) -> list[str]:
    """Resume helper: for every value of the saved (redacted) config `saved` that
    holds `MASK`, take the value of the same key from `current` (the config of the
    command that resumes, which carries the secret again). Both are OmegaConf
    configs; `saved` is updated in place. Returns the keys still masked."""
    from omegaconf import OmegaConf

    missing = []
    for key, value in _leaves(OmegaConf.to_container(saved, resolve=False)):
        if not (isinstance(value, str) and MASK in value):
            continue
        fresh = OmegaConf.select(current, key, default=None)
        if isinstance(fresh, str) and MASK not in fresh:
            OmegaConf.update(saved, key, fresh, merge=False)
        else:
            missing.append(key)
    return missing
