"""Processes that read the same data file at once, each from an empty validated-data cache
(parallel sweep trials, test workers): the wall time until all have their samples, with the
cache's lock (the first validates, the others wait and read its entry) and without it
(`--no-lock`: each validates on its own, as they all missed).

    python benchmarks/bench_data_cache.py [--procs 2] [--file rookworld/assets/data/train.jsonl.gz]
    python benchmarks/bench_data_cache.py --no-lock
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

READ = """
import sys
from rookworld.data import cache, loaders
if sys.argv[2] == "no-lock":
    import contextlib
    cache._turn = lambda entry: contextlib.nullcontext()
print(len(loaders.load_samples(sys.argv[1]).samples))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--file", default="rookworld/assets/data/train.jsonl.gz")
    ap.add_argument("--no-lock", action="store_true")
    args = ap.parse_args()
    mode = "no-lock" if args.no_lock else "lock"
    with tempfile.TemporaryDirectory() as root:
        env = {**os.environ, "ROOKWORLD_DATA_CACHE": root}
        t0 = time.perf_counter()
        procs = [subprocess.Popen([sys.executable, "-c", READ, args.file, mode], env=env,
                                  stdout=subprocess.PIPE, text=True) for _ in range(args.procs)]
        counts = [p.communicate()[0].strip() for p in procs]
        wall = time.perf_counter() - t0
    print(f"{mode}: {args.procs} processes read {args.file} ({counts[0]} samples each) in "
          f"{wall:.1f} s")


if __name__ == "__main__":
    main()
