"""Where Optuna studies live: any SQLAlchemy URL (SQLite by default, PostgreSQL for
several workers), opened with Optuna's public RDBStorage."""

from __future__ import annotations

from pathlib import Path

import optuna
from omegaconf import OmegaConf

SQLITE_TIMEOUT_S = 60  # how long a SQLite writer waits for a lock held by a parallel job


def sqlite_url(path: str) -> str:
    """${sqlite_url:multirun/study/optuna.db} -> 'sqlite:////abs/multirun/study/optuna.db';
    creates the parent directory (the sweeper opens the study before any job runs)."""
    p = Path(path).expanduser().resolve()
    p.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{p}"


if not OmegaConf.has_resolver("sqlite_url"):
    OmegaConf.register_resolver("sqlite_url", sqlite_url)


def open_storage(url: str) -> optuna.storages.RDBStorage:
    """An RDB storage for `url`; SQLite waits for locks instead of failing at once."""
    kwargs = {"connect_args": {"timeout": SQLITE_TIMEOUT_S}} if url.startswith("sqlite") else {}
    return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
