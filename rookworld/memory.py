"""The process's peak memory, as train's metrics (`mem/peak_mb`) and the benchmarks read it."""

from __future__ import annotations

import resource
import sys

import torch


def peak_memory_mb(device: torch.device | str = "cpu") -> float:
    """The peak of what a run on `device` holds (MiB): GPU memory allocated on a CUDA
    device, else the process's peak RSS (a CPU run on a machine with a GPU included)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return peak_rss_mb()


def peak_rss_mb() -> float:
    """This process's own peak resident memory (MiB): Linux's VmHWM. Not ru_maxrss, which
    Linux carries across exec: a spawned child's would start at its parent's peak."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    kib = 1024 if sys.platform == "darwin" else 1  # ru_maxrss: bytes on macOS, else KiB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / kib / 1024
