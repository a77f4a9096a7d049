"""Data parallelism: `torchrun --nproc_per_node K -m rookworld.train ...`.

Every rank draws the same prompts (draws are a pure function of seed and step),
samples and scores its contiguous share of them (so every group stays on one
rank), and trains on its own rows through DistributedDataParallel, which
averages gradients; loss weights are shares of the GLOBAL normaliser, so the
step equals a one-process step on the union of the rows. Rewards are gathered
so advantages and metrics see the whole batch; rank 0 alone logs, evaluates and
writes checkpoints. Backend: gloo on CPU, nccl on CUDA (device cuda:LOCAL_RANK).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor


@dataclass(frozen=True)
class DistContext:
    """rank/world: this process and the number of processes; device: where this
    rank's model lives."""

    rank: int
    world: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard(self, items: list) -> list:
        """This rank's contiguous share of items (len(items) must divide by world)."""
        if len(items) % self.world:
            raise ValueError(f"{len(items)} prompts per step do not split over {self.world} "
                             f"ranks; make prompts_per_step a multiple of {self.world}")
        k = len(items) // self.world
        return items[self.rank * k:(self.rank + 1) * k]

    def all_gather(self, x: Tensor) -> Tensor:
        """[n, ...] on every rank (same n) -> [world * n, ...] in rank order."""
        parts = [torch.empty_like(x) for _ in range(self.world)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts)

    def all_reduce(self, x: Tensor, op: str = "sum") -> Tensor:
        y = x.clone()
        dist.all_reduce(y, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op])
        return y

    def average_gradients(self, params, bucket_bytes: int = 1 << 25) -> None:
        """Replace each parameter's .grad by its mean over the ranks (gradients computed
        outside DistributedDataParallel's forward, e.g. from a `fast_gpt2.tape.Tape`), in flat
        buckets of about bucket_bytes: one all-reduce each, not one a tensor. Every rank
        must pass the same parameters; a missing .grad counts as zeros."""
        params = [p for p in params if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        bucket: list = []
        size = 0
        for i, p in enumerate(params):
            bucket.append(p.grad)
            size += p.grad.nbytes
            if size >= bucket_bytes or i == len(params) - 1:
                flat = torch.cat([g.reshape(-1) for g in bucket])
                dist.all_reduce(flat, op=dist.ReduceOp.SUM)
                flat /= self.world
                offset = 0
                for g in bucket:
                    g.copy_(flat[offset:offset + g.numel()].view_as(g))
                    offset += g.numel()
                bucket, size = [], 0

    def combine_metrics(self, m: dict) -> dict:
        """Each rank's float metrics -> one dict, the same on every rank: the mean over
        the ranks that report a key (the maximum for keys ending in _max)."""
        parts: list = [None] * self.world
        dist.all_gather_object(parts, m)
        out = {}
        for k in dict.fromkeys(k for part in parts for k in part):
            vals = [float(part[k]) for part in parts if k in part]
            out[k] = max(vals) if k.endswith("_max") else sum(vals) / len(vals)
        return out

    def all_gather_list(self, items: list) -> list:
        """Each rank's list -> their concatenation in rank order, on every rank."""
        parts: list = [None] * self.world
        dist.all_gather_object(parts, list(items))
        return [x for part in parts for x in part]

    def sum_floats(self, d: dict) -> dict:
        """{name: float} with the same keys on every rank -> sums over ranks."""
        keys = sorted(d)
        total = self.all_reduce(torch.tensor([float(d[k]) for k in keys], dtype=torch.float64,
                                             device=self.device))
        return {k: float(v) for k, v in zip(keys, total.cpu())}


def launched_by_torchrun() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def init(device: str = "cpu") -> DistContext | None:
    """Join the process group torchrun set up (gloo on CPU, nccl on CUDA); None when
    not launched with more than one process."""
    if not launched_by_torchrun():
        return None
    cuda = str(device).startswith("cuda")
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    return context(device)


def context(device: str = "cpu") -> DistContext:
    """The context of an initialised process group; on CUDA each rank takes
    cuda:LOCAL_RANK."""
    dev = torch.device("cpu")
    if str(device).startswith("cuda"):
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", dist.get_rank())))
        torch.cuda.set_device(dev)
    return DistContext(dist.get_rank(), dist.get_world_size(), dev)


def barrier(ctx: DistContext | None) -> None:
    if ctx is not None:
        dist.barrier()
