"""DistributedDataParallel on CPU (gloo, 2 processes): each rank samples its half of the
prompts; after a step the ranks hold identical weights, equal to a one-process step on
the union of their rows."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rookworld import distributed
from rookworld.batch import Batch, merge_rollouts
from rookworld.config import compose
from rookworld.data.load import read_samples
from rookworld.rewards.base import Reward, Scored
from rookworld.train import build_engine, build_parts

WORLD = 2


class DistinctCharsReward(Reward):
    """Varies within groups on a random model (mechanics only)."""

    range = (0.0, 6.0)

    def __call__(self, sample, completion):
        return Scored(len(set(completion)) / 16, {"distinct": float(len(set(completion)))})


def _engine(overrides, ctx=None):
    cfg = compose(overrides)
    parts = build_parts(cfg)
    torch.manual_seed(cfg.seed)
    engine = build_engine(cfg, parts, DistinctCharsReward(), dist=ctx)
    train = read_samples(cfg.data.train)
    pools = {t: [s for s in train if s.task == t] for t in "PA"}
    return cfg, parts, engine, pools


def _rank(rank: int, init_file: str, overrides: list[str], out: str,
          per_rank: list[list[str]]) -> None:
    torch.set_num_threads(1)  # two ranks on two cores: no oversubscribed thread pools
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=WORLD)
    try:
        cfg, parts, engine, pools = _engine(overrides + per_rank[rank],
                                            distributed.context("cpu"))
        steps = []
        for step in range(2):
            b = engine.rollout(parts.task_mix.draw(pools, cfg.prompts_per_step, step, cfg.seed),
                               step)
            r = b.rollout
            steps.append({"rollout": r, "temps": b.temperature, "rewards": b.rewards,
                          "adv": b.advantages, "loss_mask": b.loss_mask, "ref": b.ref_logprobs,
                          "metrics": engine.update(b, step), "rollout_metrics": b.metrics,
                          "params": [p.detach().clone() for p in engine.model.parameters()]})
        torch.save(steps, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _pad(t: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(t, (0, width - t.shape[1]))


def _union(cfg, parts_by_rank, engine) -> Batch:
    """One batch holding every rank's rows, in rank order (the global prompt order)."""
    n = sum(p["rollout"].completion_ids.shape[0] for p in parts_by_rank)
    offsets, rows = [0], []
    for p in parts_by_rank:
        k = p["rollout"].completion_ids.shape[0]
        rows.append((list(range(offsets[-1], offsets[-1] + k)), p["rollout"]))
        offsets.append(offsets[-1] + k)
    r = merge_rollouts(rows, n, engine.policy.eos_id)
    t = r.completion_ids.shape[1]
    cat = lambda key: torch.cat([p[key] for p in parts_by_rank])  # noqa: E731
    return Batch([], r, [], cat("temps"), cat("rewards"), cat("adv"),
                 torch.cat([_pad(p["loss_mask"], t) for p in parts_by_rank]),
                 torch.cat([_pad(p["ref"], t) for p in parts_by_rank]))


@pytest.fixture
def overrides(tiny_overrides):
    # token mean: the global normaliser matters. Adam's eps at 1e-2: with the default 1e-8
    # the first step is lr * sign(g), which turns float rounding of a near-zero gradient
    # into a full lr of difference; with 1e-2 a step is smooth in g and comparable.
    return tiny_overrides + ["prompts_per_step=4", "num_generations=3", "optim.lr=1e-2",
                             "optim.eps=1e-2", "sampler.temperature=1.5", "micro_batch=4",
                             "kl=fixed", "algorithm=dapo"]


@pytest.mark.slow  # two spawned processes: ~20-40 s on two cores; CI runs it with -m slow
# ranks replay their rollout's tape / run DDP's forward / one rank's tape did not fit (every
# rank then runs the forward: a tape's gradient average and DDP's reducer do not pair)
@pytest.mark.parametrize("tapes_mib", [(512, 512), (0, 0), (512, 0)])
def test_two_ranks_equal_one_process_on_the_union(overrides, tmp_path, tapes_mib):
    per_rank = [[f"rollout_tape_mib={mib}"] for mib in tapes_mib]
    mp.spawn(_rank, args=(str(tmp_path / "rdzv"), overrides, str(tmp_path), per_rank),
             nprocs=WORLD)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    for step in range(2):
        a, b = ranks[0][step], ranks[1][step]
        assert all(torch.equal(x, y) for x, y in zip(a["params"], b["params"])), step
        for key in ("metrics", "rollout_metrics"):  # the same numbers on every rank (not timings)
            assert {k: v for k, v in a[key].items() if not k.startswith("time/")} == \
                {k: v for k, v in b[key].items() if not k.startswith("time/")}
        # each rank sampled its own half: 2 prompts x 3 rows, different prompts
        assert a["rollout"].completion_ids.shape[0] == 6
        assert a["metrics"]["optim/rollout_forward_reused"] == float(min(tapes_mib) > 0)
        assert not torch.equal(a["rollout"].prompt_ids, b["rollout"].prompt_ids)

    # one process, same initial weights, stepping on the union of both ranks' rows
    cfg, parts, engine, pools = _engine(overrides)
    for step in range(2):
        union = _union(cfg, [ranks[r][step] for r in range(WORLD)], engine)
        m = engine.update(union, step)  # the union has no tape: the policy's forward runs
        assert m["optim/rollout_forward_reused"] == 0.0
        ddp = ranks[0][step]
        for k in ("loss/total", "loss/policy", "loss/kl", "kl/k3", "optim/grad_norm"):
            assert m[k] == pytest.approx(ddp["metrics"][k], rel=1e-4, abs=1e-7), (step, k)
        for p, q in zip(engine.model.parameters(), ddp["params"]):
            assert torch.allclose(p.detach(), q, atol=1e-6, rtol=1e-5), step
        # rewards were gathered: whole-step reward mean on every rank
        assert ddp["rollout_metrics"]["reward/mean"] == pytest.approx(float(union.rewards.mean()))


def test_shard_rejects_prompts_that_do_not_split():
    ctx = distributed.DistContext(rank=1, world=2, device=torch.device("cpu"))
    assert ctx.shard([1, 2, 3, 4]) == [3, 4]
    with pytest.raises(ValueError, match="prompts_per_step a multiple of 2"):
        ctx.shard([1, 2, 3])


@pytest.mark.slow
def test_torchrun_cli_trains_and_only_rank_zero_writes(tiny_overrides, tmp_path):
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    run_dir = tmp_path / "run"
    cmd = [torchrun, "--standalone", "--nproc_per_node", "2", "-m", "rookworld.train",
           *tiny_overrides, "prompts_per_step=2", f"hydra.run.dir={run_dir}",
           "prompt_filter.oversample=1.5"]  # 3 drawn prompts' greedy scores over 2 ranks
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = (run_dir / "metrics.jsonl").read_text().splitlines()
    steps = [r for r in rows if '"reward/mean"' in r]
    assert len(steps) == 2  # one row per step, written once (rank 0), not once per rank
    assert all('"filter/greedy_reward_kept"' in r for r in steps)
    assert (run_dir / "outcome.json").exists()
