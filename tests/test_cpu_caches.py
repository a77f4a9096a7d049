"""Importing rookworld bounds oneDNN's and ideep's caches of compiled CPU products, so a
run whose tensor shapes change every step does not grow its memory with each new shape."""

import os
import subprocess
import sys

import pytest
import torch

import rookworld

CACHES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")

# RSS growth (MB) over 200 products of distinct row counts through fast_gpt2.matmul.linear
GROWTH = """
import torch, rookworld.backends.fast_gpt2.matmul as f, rookworld.runtime
rookworld.runtime.setup()  # the library ROOKWORLD_CPU_MATMUL names
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
w, b = torch.randn(256, 768), torch.zeros(768)
with torch.no_grad():
    for m in range(100, 110):  # warm-up: first products, thread pools
        f.linear(torch.randn(m, 256), w, b)
    r0 = rss()
    for m in range(200, 400):
        f.linear(torch.randn(m, 256), w, b)
print(rss() - r0)
"""


def _run(code: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in CACHES
             and k != "DNNL_PRIMITIVE_CACHE_CAPACITY"}
    out = subprocess.run([sys.executable, "-c", code], env=clean | env, capture_output=True,
                         text=True, check=True)
    return out.stdout.strip()


def test_import_sets_both_capacities_and_keeps_the_users():
    show = f"import rookworld, os; print([os.environ.get(k) for k in {CACHES!r}])"
    n = str(rookworld.CPU_KERNEL_CACHE)
    assert _run(show) == str([n, n])
    assert _run(show, LRU_CACHE_CAPACITY="3") == str([n, "3"])
    # oneDNN's older name for its capacity is the user's choice too
    assert _run(show, DNNL_PRIMITIVE_CACHE_CAPACITY="7") == str([None, n])


@pytest.mark.skipif(not (torch.backends.mkldnn.is_available()
                         and hasattr(torch.ops.mkldnn, "_linear_pointwise")),
                    reason="no oneDNN in this torch build")
@pytest.mark.slow  # memory measured in child processes: relative, but still host-sensitive
def test_memory_stays_flat_over_many_product_shapes():
    env = {"ROOKWORLD_CPU_MATMUL": "onednn"}
    bounded = float(_run(GROWTH, **env))
    unbounded = float(_run(GROWTH, **env, ONEDNN_PRIMITIVE_CACHE_CAPACITY="1024",
                           LRU_CACHE_CAPACITY="1024"))
    assert unbounded > 2 * bounded, (bounded, unbounded)  # the bound is what keeps it flat
