"""The runtime set-up makes the process-wide choices and describes what is in effect."""

import json
import multiprocessing as mp
import sys

import pytest
import torch

from rookworld import runtime
from rookworld.backends.fast_gpt2 import matmul
from rookworld.memory import peak_rss_mb


@pytest.fixture
def restored(monkeypatch):
    """Whatever the test sets, the matrix library and the allocator record come back."""
    monkeypatch.setattr(matmul, "CPU_MATMUL", matmul.CPU_MATMUL)
    monkeypatch.setattr(runtime, "_ALLOCATOR", dict(runtime._ALLOCATOR))


def test_setup_sets_the_matrix_library_and_describes_it(restored, monkeypatch):
    want = "onednn" if matmul.ONEDNN else "blas"
    chosen = runtime.setup(want)
    assert matmul.CPU_MATMUL == chosen["cpu_matmul"] == want
    assert chosen["threads"] == torch.get_num_threads() and chosen["allocator"] == {}
    assert isinstance(chosen["native_kernels"], bool)
    json.dumps(chosen)  # runtime.json
    monkeypatch.setenv("ROOKWORLD_CPU_MATMUL", "blas")
    assert runtime.setup()["cpu_matmul"] == "blas"  # no setting: the environment's
    with pytest.raises(ValueError, match="cpu_matmul"):
        runtime.setup("openblas")


def test_choose_allocator_records_its_choices(restored, monkeypatch):
    kept = []
    monkeypatch.setattr(runtime, "keep_freed_heap", lambda: kept.append(1) or True)
    cpu = torch.device("cpu")
    assert runtime.choose_allocator("auto", 10, cpu) == 0 and kept == [1]
    assert runtime.describe()["allocator"]["keep_freed_heap"] is True
    assert runtime.choose_allocator("auto", runtime.AUTO_MMAP_MIN_PARAMS, cpu) == 1024
    assert runtime.describe()["allocator"]["keep_freed_heap"] is None and kept == [1]
    assert runtime.choose_allocator(512, 10, torch.device("meta")) == 0  # CPU only
    with pytest.raises(ValueError, match="mmap_threshold_kib"):
        runtime.choose_allocator(-1, 10, cpu)


def test_setup_starts_a_new_allocator_record(restored):
    """Choices made before setup (an earlier run in this process) are not reported as this
    run's."""
    runtime.choose_allocator(0, 10, torch.device("cpu"))  # 0: glibc left alone
    assert runtime.describe()["allocator"]["mmap_threshold_kib"] == 0
    assert runtime.setup("blas")["allocator"] == {}


def _child_peak(conn) -> None:
    from rookworld.memory import peak_rss_mb

    conn.send(peak_rss_mb())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM is Linux's")
def test_peak_rss_is_the_process_own_not_its_parents():
    """A spawned child's peak is its own: ru_maxrss would start at the parent's (the
    benchmarks' workers are such children)."""
    held = torch.ones(400 * 2**20 // 4)  # 400 MiB in the parent while the child runs
    parent, child = mp.get_context("spawn").Pipe()
    proc = mp.get_context("spawn").Process(target=_child_peak, args=(child,))
    proc.start()
    own = parent.recv()
    proc.join(timeout=60)
    assert peak_rss_mb() > 400 and own < 350, (peak_rss_mb(), own)
    del held


def test_peak_memory_follows_the_run_device_not_the_machine(monkeypatch):
    """On a machine with a GPU, a CPU run's `mem/peak_mb` is its RSS, a CUDA run's the GPU
    memory allocated on its device."""
    from rookworld.memory import peak_memory_mb

    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated",
                        lambda device=None: asked.append(device) or 7 * 2**20)
    assert peak_memory_mb(torch.device("cpu")) == peak_rss_mb() != 7
    assert peak_memory_mb("cuda:1") == 7 and asked == [torch.device("cuda:1")]
