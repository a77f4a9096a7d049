"""Where Optuna studies live: any SQLAlchemy URL (SQLite by default, PostgreSQL for
several workers), opened with Optuna's public RDBStorage."""

from __future__ import annotations

import random
import time
import warnings
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import optuna
import sqlalchemy
import sqlalchemy.exc
from omegaconf import OmegaConf

SQLITE_TIMEOUT_S = 60  # how long a SQLite writer waits for a lock held by a parallel job
HEARTBEAT_S = 30  # a running trial's job records a heartbeat this often (sweep.heartbeat_s)
GRACE_S = 180  # a RUNNING trial whose last heartbeat is older than this is dead (sweep.grace_s)
CREATE_RETRIES = 5  # attempts at creating Optuna's tables when workers race to do it
# What a lost race to create the tables raises (PostgreSQL: duplicate pg_type row or table).
_RACE = (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError,
         optuna.exceptions.StorageInternalError)


def open_storage(url: str, grace_s: int = GRACE_S) -> optuna.storages.RDBStorage:
    """An RDB storage for `url` (tables created if missing) with Optuna's heartbeat on
    (interval HEARTBEAT_S, grace period grace_s); SQLite waits for locks instead of
    failing at once."""
    kwargs = {"connect_args": {"timeout": SQLITE_TIMEOUT_S}} if url.startswith("sqlite") else {}
    for attempt in range(CREATE_RETRIES):
        try:
            with warnings.catch_warnings():  # the heartbeat is an "experimental" Optuna argument
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(url, engine_kwargs=kwargs,
                                                  heartbeat_interval=HEARTBEAT_S,
                                                  grace_period=grace_s)
        except _RACE:
            if attempt == CREATE_RETRIES - 1:
                raise
            time.sleep(0.2 + random.random())
    raise AssertionError("unreachable")


@contextmanager
def study_lock(storage: optuna.storages.RDBStorage, study_name: str) -> Iterator[None]:
    """Hold a lock on `study_name` across processes, so that a read of the study and the
    writes that follow it are not interleaved with another worker's: a PostgreSQL advisory
    lock (released when the block ends or its connection drops); no lock on other
    databases (SQLite serves one sweep process at a time)."""
    if storage.engine.dialect.name != "postgresql":
        yield
        return
    key = zlib.crc32(f"rookworld-study:{study_name}".encode())
    with storage.engine.connect() as conn:
        conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), {"k": key})
        conn.commit()
        try:
            yield
        finally:
            conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), {"k": key})
            conn.commit()


_HELD: dict[str, int] = {}  # SQLite database path -> this process's open lock file


class StudyInUse(RuntimeError):
    """Another live sweep process holds this SQLite study."""


def hold_sqlite_study(db_path: str) -> None:
    """Take `<db_path>.lock` for this process (an exclusive flock, which the kernel releases
    when the process ends, however it ends): SQLite serves one sweep process at a time, and
    a start of the sweep fails every RUNNING trial without a live job of its own as dead,
    which is only right when no other sweep process is alive. Raises StudyInUse when another
    process holds it."""
    import fcntl
    import os

    path = str(Path(db_path).resolve())
    if path in _HELD:
        return
    fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StudyInUse(
            f"another sweep process is running on the SQLite study {path} (it holds "
            f"{path}.lock): SQLite serves one sweep process at a time. Wait for it to end, "
            "or give every worker a PostgreSQL study (sweep.storage=postgresql+psycopg://..., "
            "docs/guides/sweeps.md)") from None
    _HELD[path] = fd


def release_sqlite_study(db_path: str) -> None:
    """Give back what hold_sqlite_study took (nothing when this process holds nothing)."""
    import os

    fd = _HELD.pop(str(Path(db_path).resolve()), None)
    if fd is not None:
        os.close(fd)


def study_storage(storage: str | None, study_name: str) -> str:
    """${study_storage:${sweep.storage},${hydra.sweeper.study_name}}: the sweeper's storage.

    storage null -> SQLite at multirun/<study_name>/optuna.db; a path -> SQLite there
    (absolute, its directory created: the sweeper opens the study before any job runs);
    a URL (anything with '://') -> itself, after Optuna's tables exist in it, so that
    workers started together on a fresh database do not race to create them.
    """
    if storage is None or "://" not in str(storage):
        p = Path(storage or Path("multirun") / study_name / "optuna.db").expanduser().resolve()
        p.parent.mkdir(parents=True, exist_ok=True)
        storage = f"sqlite:///{p}"
    open_storage(storage).engine.dispose()
    return storage


if not OmegaConf.has_resolver("study_storage"):
    OmegaConf.register_resolver("study_storage", study_storage)
