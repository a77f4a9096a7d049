"""Engine processes end with their owner: EnginePool.close, EngineReward.close, and a
training run with reward=engine that exits by itself, on success or on an error."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import chess
import chess.engine
import pytest

from rookworld.chess_tasks.stockfish_pool import EnginePool
from rookworld.config import ConfigError, compose
from rookworld.rewards import CurriculumReward, EngineReward, GraduatedReward
from rookworld.train import run

pytestmark = pytest.mark.usefixtures("stockfish")


def processes(field: int, value: int, name: str | None = None) -> set[int]:
    """Pids of the running processes (zombies excluded) whose /proc/PID/stat field after
    the name (0: state, 1: parent, 3: sid, as setsid sets it) is value, and whose name is name if
    given."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        comm, rest = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:]
        fields = rest.split()
        if int(fields[field]) == value and fields[0] != "Z" and name in (None, comm):
            found.add(int(stat.parent.name))
    return found


def stockfish_children(pid: int) -> set[int]:
    return processes(1, pid, "stockfish")


def running(pid: int) -> bool:
    """Whether pid runs (a zombie has ended; only its parent has not reaped it)."""
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def engine_threads(pids) -> list[str]:
    """python-chess's event-loop threads of these engine processes, waiting up to 5 s for
    them to end."""
    names = [f"(pid={p})" for p in pids]
    deadline = time.monotonic() + 5
    while True:
        left = [t.name for t in threading.enumerate() if any(n in t.name for n in names)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def test_close_is_idempotent_and_ends_processes_and_threads():
    pool = EnginePool(processes=2, depth=3)
    pids = pool.pids()
    assert len(pool.analyse(chess.STARTING_FEN).moves) == 5
    pool.close()
    pool.close()
    assert not any(running(p) for p in pids)
    assert engine_threads(pids) == []
    with pytest.raises(chess.engine.EngineTerminatedError):
        pool.analyse("8/8/8/8/8/8/4k3/K6R w - - 0 1")  # not cached: needs an engine


def test_close_ends_a_busy_engine_without_restarting_it():
    pool = EnginePool(processes=1, depth=40)  # a search that outlasts the test
    before = stockfish_children(os.getpid())
    got = {}

    def search():
        try:
            got["a"] = pool.analyse(chess.STARTING_FEN)
        except Exception as e:  # noqa: BLE001 - the test inspects what the search raised
            got["e"] = e

    worker = threading.Thread(target=search)
    worker.start()
    time.sleep(0.5)
    pool.close(timeout=2.0)
    worker.join(60)  # a depth-40 search left running would outlast this by far
    assert not worker.is_alive(), "close() left the busy search running"
    assert isinstance(got.get("e"), chess.engine.EngineTerminatedError), got
    assert pool.restarts == 0
    assert not stockfish_children(os.getpid()) - (before - set(pool.pids()))
    assert not running(pool.pids()[0])


def test_close_ends_a_killed_engine():
    pool = EnginePool(processes=1, depth=3)
    (pid,) = pool.pids()
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    closer = threading.Thread(target=pool.close)
    closer.start()
    closer.join(60)
    assert not closer.is_alive(), "close() hangs on a killed engine"
    assert not running(pid) and engine_threads([pid]) == []


def test_engine_reward_close_ends_its_pool_also_inside_a_curriculum():
    reward = CurriculumReward(EngineReward(EnginePool(processes=1, depth=3)),
                              GraduatedReward(), steps=10)
    pids = reward.start.pool.pids()
    reward.at(5).close()  # at() shares the pool; closing it is the owner's part
    reward.close()
    reward.close()
    assert not any(running(p) for p in pids)


def _script(body: str, tmp_path: Path, timeout: float = 60):
    """Runs a Python script; returns (exit code, the stockfish pids it started)."""
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(body))
    return _watch([sys.executable, str(path)], tmp_path, timeout)


def _watch(argv, cwd, timeout: float):
    """Runs argv under a sid of its own (setsid), noting its stockfish children
    while it runs; returns (exit code, those pids, its output) once it exits and fails if
    any process under that id outlives it. One still running at `timeout` seconds is
    killed and fails."""
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    out, seen = [], set()
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read()))
    reader.start()
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        seen |= stockfish_children(proc.pid)
        time.sleep(0.05)
    if proc.poll() is None:
        left = processes(3, proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        reader.join()
        pytest.fail(f"still running after {timeout} s, with {sorted(left)} (stockfish: "
                    f"{sorted(seen)}):\n" + out[0][-3000:])
    reader.join()
    left = processes(3, proc.pid)
    if left:
        os.killpg(proc.pid, signal.SIGKILL)
    assert not left, f"processes outlived the run: {sorted(left)}\n" + out[0][-3000:]
    return proc.returncode, seen, out[0]


def test_a_pool_left_open_does_not_keep_python_running(tmp_path):
    code, seen, out = _script("""
        from rookworld.chess_tasks.stockfish_pool import EnginePool
        pool = EnginePool(processes=2, depth=3)
        print("pids", *pool.pids(), flush=True)
    """, tmp_path)
    assert code == 0, out
    pids = {int(p) for p in out.split("pids", 1)[1].split()}
    assert seen <= pids
    assert not any(running(p) for p in pids)


def test_an_exception_after_the_pool_started_ends_its_engines(tmp_path):
    code, seen, out = _script("""
        from rookworld.chess_tasks.stockfish_pool import EnginePool
        pool = EnginePool(processes=1, depth=3)
        print("pids", *pool.pids(), flush=True)
        raise RuntimeError("the run fails")
    """, tmp_path)
    assert code == 1 and "the run fails" in out, out
    pids = {int(p) for p in out.split("pids", 1)[1].split("Traceback")[0].split()}
    assert not any(running(p) for p in pids)


def test_train_run_ends_its_engines_before_returning(tiny_overrides, tmp_path):
    before = stockfish_children(os.getpid())
    cfg = compose([*tiny_overrides, "reward=engine", "reward.pool.depth=4", "steps=1",
                   "eval_every=0"])
    assert run(cfg, tmp_path / "ok").outcome.status == "success"
    assert stockfish_children(os.getpid()) <= before
    bad = compose([*cfg_overrides(tiny_overrides, "data.train", tmp_path / "missing.jsonl"),
                   "reward=engine", "reward.pool.depth=4"])
    with pytest.raises(ConfigError, match="missing.jsonl"):
        run(bad, tmp_path / "bad")
    assert stockfish_children(os.getpid()) <= before


def cfg_overrides(overrides, key: str, value) -> list[str]:
    """overrides with key set to value."""
    return [o for o in overrides if not o.startswith(f"{key}=")] + [f"{key}={value}"]


def _train(args, cwd, timeout: float = 180):
    return _watch([sys.executable, "-m", "rookworld.train", "reward=engine",
                   "reward.pool.depth=4", *args], cwd, timeout)


def test_train_with_the_engine_reward_exits_and_ends_stockfish(tiny_overrides, tmp_path):
    code, seen, out = _train([*tiny_overrides, "steps=1", "eval_every=0",
                              f"hydra.run.dir={tmp_path}/run"], tmp_path)
    assert code == 0, out[-3000:]
    assert "outcome=success" in out
    assert seen, "the run started no stockfish: the test watches nothing"
    assert not any(running(p) for p in seen)


def test_train_failing_after_the_engine_started_ends_stockfish(tiny_overrides, tmp_path):
    # the data is read after the reward is built
    over = cfg_overrides(tiny_overrides, "data.train", tmp_path / "missing.jsonl")
    code, seen, out = _train([*over, f"hydra.run.dir={tmp_path}/run"], tmp_path)
    assert code == 1 and "missing.jsonl" in out, out[-3000:]
    assert not any(running(p) for p in seen)


@pytest.mark.slow
def test_the_documented_engine_run_exits_by_itself(tmp_path):
    """The embedded model, bundled data: `python -m rookworld.train reward=engine steps=1
    prompts_per_step=2 num_generations=2 data.eval_per_task=2 eval_every=0`, without the
    strength suite (whose engines test_strength_suite follows)."""
    code, seen, out = _watch([sys.executable, "-m", "rookworld.train", "reward=engine",
                              "steps=1", "prompts_per_step=2", "num_generations=2",
                              "data.eval_per_task=2", "eval_every=0", "logger=none",
                              "strength=none",  # the suite's own engines: test_strength_suite
                              f"hydra.run.dir={tmp_path}/run"], tmp_path, timeout=600)
    assert code == 0, out[-3000:]
    assert seen and not any(running(p) for p in seen)
