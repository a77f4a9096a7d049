"""Shared pytest setup.

Hypothesis profiles: "dev" (default, 200 examples per property, fast enough
for every run) and "ci" (1,000 examples, no deadline, within CI's time for the property
tests of test_engine, test_fuzz and test_rewards_properties): select with
HYPOTHESIS_PROFILE=ci.

Stockfish: the `stockfish` fixture skips a test when no binary is installed (modules take
it with pytestmark = pytest.mark.usefixtures("stockfish")), and `engine_pool` hands out
EnginePools shared by a module's tests.
"""

import importlib.util
import os
from pathlib import Path

from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=200, deadline=None)
settings.register_profile("ci", max_examples=1000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


import json  # noqa: E402
import random  # noqa: E402

import chess  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="session")
def _data_cache(tmp_path_factory):
    """Validated data is cached in a directory of this pytest run (subprocesses too),
    not in the user's ~/.cache."""
    os.environ.setdefault("ROOKWORLD_DATA_CACHE", str(tmp_path_factory.mktemp("data-cache")))


def _synthetic_rows(n_games: int, seed: int) -> list[dict]:
    """P and A samples from random games; P evals are made up (mechanics tests only)."""
    from rookworld.chess_tasks import env_sample, policy_sample

    rng, rows = random.Random(seed), []
    for _ in range(n_games):
        board, hist = chess.Board(), []
        for _ in range(rng.randint(4, 30)):
            legal = list(board.legal_moves)
            if not legal:
                break
            mv = rng.choice(legal)
            hist.append(mv.uci())
            rows.append(env_sample(board.fen(), mv.uci(), hist[-10:]).to_json())
            moves = [m.uci() for m in rng.sample(legal, min(5, len(legal)))]
            evals = [round(rng.uniform(-3, 3), 2) for _ in moves]
            rows.append(policy_sample(board.fen(), moves, evals, "synthetic").to_json())
            board.push(mv)
    return rows


@pytest.fixture(scope="session")
def synthetic_data(tmp_path_factory):
    """(train.jsonl, eval.jsonl) paths of a small synthetic data set."""
    d = tmp_path_factory.mktemp("data")
    rows = _synthetic_rows(30, seed=0)
    for name, part in (("train.jsonl", rows[:-40]), ("eval.jsonl", rows[-40:])):
        (d / name).write_text("".join(json.dumps(r) + "\n" for r in part))
    return str(d / "train.jsonl"), str(d / "eval.jsonl")


# float32 products: the mechanics tests compare paths to float32 rounding on every host
# (autocast=auto is bf16 on CPUs where bf16 products are faster; tests/test_low_precision.py)
TINY = ["model=tiny_random", "model.n_layer=2", "model.n_embd=32", "model.n_head=2",
        "model.n_positions=320", "logger=none", "autocast=off", "strength=none"]


@pytest.fixture
def tiny_overrides(synthetic_data):
    """Overrides for a seconds-long CPU run on a tiny random model and synthetic data."""
    train, held_out = synthetic_data
    # both tasks in every run, so that the mechanics tests cover P and A
    return TINY + [f"data.train={train}", f"data.eval={held_out}", "data.eval_per_task=4",
                   "task_mix=mixed", "steps=2", "prompts_per_step=2", "num_generations=2",
                   "sampler.max_new_tokens=24", "sampler.per_task.A.max_new_tokens=24"]


@pytest.fixture(params=["fast_gpt2", "hf"])
def backend(request) -> list[str]:
    """The override for each backend on the same tiny GPT-2 (hf runs transformers' copy of
    it, `to_transformers()`), for the tests that are not about the fast path."""
    return [f"backend={request.param}"]


@pytest.fixture
def spread_rewards(monkeypatch):
    """A random model's rewards all tie (no advantages): the engine's scores plus a spread by
    completion length, for the tests that need an update to move the weights."""
    import torch

    from rookworld import engine as engine_mod
    real_score = engine_mod.GRPOEngine.score

    def varied(self, rows, texts, step):
        rewards, scored = real_score(self, rows, texts, step)
        return rewards + torch.tensor([len(t) % 5 / 10 for t in texts]), scored

    monkeypatch.setattr(engine_mod.GRPOEngine, "score", varied)


@pytest.fixture(params=["onednn", "blas", "mkl"])
def cpu_matmul(request, monkeypatch):
    """Runs a test with each CPU matrix library (`forward_matmul.CPU_MATMUL`); modules take
    it with pytestmark = pytest.mark.usefixtures("cpu_matmul")."""
    from rookworld.backends.fast_gpt2 import matmul as forward_matmul

    if request.param != "blas" and not forward_matmul.ONEDNN:
        pytest.skip("torch built without oneDNN")
    monkeypatch.setattr(forward_matmul, "CPU_MATMUL", request.param)
    monkeypatch.setattr(forward_matmul, "BLAS_DNN_MIN_ROWS", 8)  # both sides of it in these sizes
    return request.param


@pytest.fixture(scope="session")
def stockfish() -> str:
    """The Stockfish binary EnginePool runs (find_engine); the test is skipped when none is
    installed."""
    from rookworld.chess_tasks.stockfish_pool import find_engine

    try:
        return find_engine()
    except FileNotFoundError:
        pytest.skip("no stockfish installed")


@pytest.fixture(scope="module")
def engine_pool(stockfish):
    """engine_pool(processes=1, depth=6, ...): an EnginePool with those settings (EnginePool's
    arguments), one per settings shared by the module's tests and closed after them. A test
    that kills or closes its engines builds its own."""
    from rookworld.chess_tasks.stockfish_pool import EnginePool

    pools = {}

    def get(**settings):
        key = tuple(sorted(settings.items()))
        if key not in pools:
            pools[key] = EnginePool(path=stockfish, **settings)
        return pools[key]
    yield get
    for pool in pools.values():
        pool.close()


@pytest.fixture(scope="session")
def experiment_script():
    """Loads a script under experiments/ as a module: experiment_script("learning/trl_arm.py")."""
    root = Path(__file__).resolve().parents[1] / "experiments"

    def load(relative: str):
        path = root / relative
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    return load
