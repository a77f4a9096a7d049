"""The process's runtime set-up: every process-wide choice, made once and recorded.

The entry points (`train`, `pretrain`, `evaluate`, the benchmarks) call `setup` once before
they build a model; it picks the CPU matrix library (`fast_gpt2.matmul.set_cpu_matmul`) and
returns `describe()`: that library, the oneDNN/ideep kernel cache capacities, the thread
count and whether the native kernels run. `choose_allocator` (from `train.build_engine`, once
the model's size is known) makes the glibc allocator choices and adds them to the record,
which train writes to the run directory (`runtime.json`).

One choice cannot wait for `setup`: oneDNN reads its cache capacities when it builds its
first product, so importing rookworld sets them (`rookworld.CPU_KERNEL_CACHE`, a value
already in the environment wins); `describe` reports the values in effect.

The glibc helpers below are process-wide; the engine only switches the mmap threshold
around each update (`mmap_threshold_during`) to the value `choose_allocator` returned.
"""

from __future__ import annotations

import ctypes
import functools
import os
from contextlib import contextmanager

import torch

from . import CPU_KERNEL_CACHE, KERNEL_CACHE_VARIABLES
from .backends.fast_gpt2 import matmul, native

_ALLOCATOR: dict = {}  # the allocator choices `choose_allocator` made


def setup(cpu_matmul: str | None = None) -> dict:
    """Make this process's choices before any model is built and return them (`describe`).
    cpu_matmul: a `fast_gpt2.matmul.CPU_MATMUL_CHOICES` setting; None reads
    ROOKWORLD_CPU_MATMUL (default auto). Raises ValueError for an unknown library."""
    if cpu_matmul is None:
        cpu_matmul = os.environ.get("ROOKWORLD_CPU_MATMUL", "auto")
    matmul.set_cpu_matmul(cpu_matmul)
    _ALLOCATOR.clear()
    return describe()


def use_cpu_matmul(name: str) -> str:
    """Switch the matrix library (a resumed run keeps its checkpoints'); returns it."""
    return matmul.set_cpu_matmul(name)


def describe() -> dict:
    """The process-wide choices in effect: a JSON-ready dict."""
    return {"cpu_matmul": matmul.CPU_MATMUL, "onednn": matmul.ONEDNN,
            "threads": torch.get_num_threads(),
            "native_kernels": native.library() is not None,
            "kernel_cache_default": CPU_KERNEL_CACHE,
            "kernel_caches": {k: os.environ.get(k) for k in KERNEL_CACHE_VARIABLES},
            "allocator": dict(_ALLOCATOR)}


def choose_allocator(setting: int | str, n_params: int, device: torch.device) -> int:
    """The glibc choices for a model of n_params parameters on device under the
    mmap_threshold_kib setting: returns the update's mmap threshold (KiB, 0 = leave glibc
    alone; `update_mmap_threshold`), and under auto a CPU model below AUTO_MMAP_MIN_PARAMS
    keeps freed heap memory (`keep_freed_heap`). Both are recorded for `describe`."""
    kib = update_mmap_threshold(setting, n_params) if device.type == "cpu" else 0
    kept = None
    if device.type == "cpu" and setting == "auto" and not kib:
        kept = keep_freed_heap()
    _ALLOCATOR.update({"mmap_threshold_kib": setting, "update_mmap_kib": kib,
                       "rollout_mmap_kib": ROLLOUT_MMAP_KIB if kib else None,
                       "keep_freed_heap": kept,
                       "keep_trim_kib": KEEP_TRIM_KIB if kept else None})
    return kib


@functools.cache
def _glibc(name: str):
    """A glibc function by name, or None without glibc."""
    try:
        return getattr(ctypes.CDLL("libc.so.6"), name)
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> None:
    """Hand freed heap pages back to the OS (glibc malloc_trim). The engine calls it between
    phases when release_memory is set: resident memory between phases then follows the
    live tensors, at the price of faulting the pages in again: a slower step, so it is off
    by default. A no-op without glibc."""
    trim = _glibc("malloc_trim")
    if trim:
        trim(0)


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def set_mmap_threshold(kib: int) -> bool:
    """Serve heap blocks of at least `kib` KiB from their own mappings, handed back to the
    OS when freed (glibc mallopt M_MMAP_THRESHOLD; this also stops glibc raising the
    threshold as it goes, which it does up to 32 MiB). Process-wide; the engine sets it
    around each update (`GRPOEngine.update`). Returns whether it was applied (never for
    kib <= 0, nor without glibc)."""
    mallopt = _glibc("mallopt")
    return bool(kib > 0 and mallopt and mallopt(M_MMAP_THRESHOLD, kib * 1024))


ROLLOUT_MMAP_KIB = 32 * 1024  # glibc's own ceiling for its moving threshold (64-bit)
AUTO_MMAP_KIB, AUTO_MMAP_MIN_PARAMS = 1024, 50_000_000
M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter
KEEP_TRIM_KIB = 64 * 1024


def keep_freed_heap() -> bool:
    """Serve heap blocks under ROLLOUT_MMAP_KIB from the heap and keep up to KEEP_TRIM_KIB
    of freed memory at its top for reuse instead of handing it back to the OS (glibc
    mallopt M_MMAP_THRESHOLD and M_TRIM_THRESHOLD; process-wide). `choose_allocator` does
    this for models under AUTO_MMAP_MIN_PARAMS when mmap_threshold_kib is auto: with glibc's
    moving thresholds a small model's step faults in thousands of fresh pages that these
    reuse, for a faster step at no higher peak RSS (benchmarks/README.md, ablations).
    Returns whether glibc took both."""
    mallopt = _glibc("mallopt")
    return bool(mallopt and mallopt(M_MMAP_THRESHOLD, ROLLOUT_MMAP_KIB * 1024)
                and mallopt(M_TRIM_THRESHOLD, KEEP_TRIM_KIB * 1024))


@contextmanager
def mmap_threshold_during(kib: int):
    """Set the mmap threshold to kib KiB for the block, then back to ROLLOUT_MMAP_KIB (also
    when the block raises); kib 0 leaves glibc alone."""
    if not kib:
        yield
        return
    set_mmap_threshold(kib)
    try:
        yield
    finally:
        set_mmap_threshold(ROLLOUT_MMAP_KIB)


def update_mmap_threshold(setting: int | str, n_params: int) -> int:
    """The mmap threshold (KiB) the engine sets for its updates; 0 = leave glibc alone.

    With glibc's moving threshold, the update's freed activations and gradients stay
    resident as heap holes beside the weights, reference and optimiser state, which raises a
    GPT-2-small process's peak RSS. 1024 KiB during the update only (the
    rollout at 32 MiB, where glibc's threshold ends up anyway) hands those blocks back,
    at the price of faulting fresh pages in (a cost that varies by host). A small model's
    update pays that price for no saving that matters, so auto is 1024 from
    AUTO_MMAP_MIN_PARAMS up, else 0; applying the threshold to the whole process instead
    of the update slows the whole step. Figures: benchmarks/README.md."""
    if setting == "auto":
        return AUTO_MMAP_KIB if n_params >= AUTO_MMAP_MIN_PARAMS else 0
    if isinstance(setting, bool) or not isinstance(setting, int) or setting < 0:
        raise ValueError(f"mmap_threshold_kib must be auto or an integer >= 0, got {setting!r}")
    return setting
