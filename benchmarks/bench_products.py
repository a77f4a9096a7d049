"""bf16 against float32 matrix products on this CPU: what `autocast=auto` decides by rule.

    .venv/bin/python benchmarks/bench_products.py --threads 2

Times torch.matmul at the embedded model's update shape (4096 tokens x 256 x 768) and at
2048^3, float32 and bfloat16 alternating round by round, and prints one JSON line per
shape and dtype (median GFLOP/s) and one with the CPU's vendor and bf16 flags and the
choice `precision.products_dtype("auto", "cpu")` makes from them. The choice is a fixed
rule, not this timing; this script is how the rule's figures are measured.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from rookworld import precision

SHAPES = ((4096, 256, 768), (2048, 2048, 2048))


def gflops(a: torch.Tensor, b: torch.Tensor) -> float:
    start = time.perf_counter()
    a @ b
    return 2 * a.shape[0] * a.shape[1] * b.shape[1] / (time.perf_counter() - start) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    for m, k, n in SHAPES:
        pairs = {dt: (torch.randn(m, k).to(dt), torch.randn(k, n).to(dt))
                 for dt in (torch.float32, torch.bfloat16)}
        rates = {dt: [] for dt in pairs}
        for a, b in pairs.values():  # warm-up: kernels chosen, pages touched
            gflops(a, b)
        for _ in range(args.rounds):
            for dt, (a, b) in pairs.items():
                rates[dt].append(gflops(a, b))
        for dt, r in rates.items():
            print(json.dumps({"shape": [m, k, n], "dtype": str(dt).removeprefix("torch."),
                              "gflops_median": round(statistics.median(r), 1),
                              "threads": args.threads}))
    flags = set(precision.cpuinfo("flags").split())
    auto = precision.products_dtype("auto", "cpu")
    print(json.dumps({"vendor": precision.cpuinfo("vendor_id"),
                      "model": precision.cpuinfo("model name"),
                      "bf16_flags": sorted(flags & {"avx512_bf16", "amx_bf16", "amx_tile"}),
                      "auto_products": str(auto).removeprefix("torch.") if auto else "float32",
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
