"""One GRPO step, side by side: rookworld's engine and TRL's GRPOTrainer on this CPU or a GPU.

    .venv/bin/python benchmarks/bench_grpo.py --shape small          # 4 x 8 x 64, 4 layers/256
    .venv/bin/python benchmarks/bench_grpo.py --shape gpt2-small     # 2 x 8 x 64, 12 layers/768
    python benchmarks/bench_grpo.py --device cuda --shape gpt2-small --prompts 8 \
        --tokens 144 --backend fast_gpt2,hf                          # both backends and TRL

On a GPU (`--device cuda`) both run with bf16 autocast where the device has it
(`--autocast auto`; rookworld's fast_gpt2 backend runs float32 only, so its job runs
with autocast off), each step ends with a device synchronise, and every line also
carries the peak GPU memory allocated (`gpu_peak_mb`).

Both get the same model, prompts and settings (benchmarks/grpo_step_workers.py, which also
names each implementation's phases).

Each implementation runs in its own process, so each peak RSS is its own (VmHWM,
`rookworld.memory.peak_rss_mb`: ru_maxrss would count the parent's peak at the spawn); the
parent tells them to take one step in turn (warm-up steps first, then the
measured ones, alternating so that machine drift hits both alike), then prints
one JSON line per implementation: median step seconds, completion tokens per
second, peak RSS, median phase times, and the speed ratio; plus a matmul
calibration (GFLOP/s of a fixed fp32 matmul) taken before and after.

`flop_bound_s` is the naive step's FLOPs (every row runs prompt + completion:
sampling 2, reference 2, policy forward + backward 6 FLOPs per parameter per
token, plus attention) at the calibrated matmul rate; `flop_efficiency` is
flop_bound_s / median_step_s (above 1 means the step does less work than the
naive one: rookworld runs each prompt once per group).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import time

from grpo_step_workers import (
    ABLATIONS,
    ALGORITHMS,
    PHASES,
    rookworld_worker,
    step_prompts,
    trl_worker,
)

SHAPES = {
    "small": dict(n_layer=4, n_embd=256, n_head=4, prompts=4),
    "gpt2-small": dict(n_layer=12, n_embd=768, n_head=12, prompts=2),
}
VOCAB = 96  # build_char_tokenizer(): 95 printable characters + <|endoftext|>


def calibrate(size: int = 2048, reps: int = 10) -> float:
    """Median GFLOP/s of a [size, size] x [size, size] float32 matmul (torch's threads)."""
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - t0)
    return 2 * size ** 3 / statistics.median(times) / 1e9



def naive_step_flops(a, prompt_tokens_per_row: float) -> float:
    """FLOPs of a step in which every row runs its prompt and completion (s tokens)
    through the sampler, the reference and the policy: 5 forward-equivalents (sample 1,
    reference 1, policy forward 1 + backward 2) of 2 FLOPs per matmul parameter per
    token, plus causal attention (QK^T and AV: 2 s^2 C FLOPs per layer per row)."""
    n = a.prompts * a.generations
    s = prompt_tokens_per_row + a.tokens
    matmul_params = 12 * a.n_layer * a.n_embd ** 2 + VOCAB * a.n_embd  # blocks + lm_head
    return 5 * n * (2 * matmul_params * s + 2 * a.n_layer * s * s * a.n_embd)


def summarise(name, a, rows, final_rss, cal, flop_bound_s) -> dict:
    step = statistics.median(r["step_s"] for r in rows)
    return {
        "impl": name, "shape": {k: getattr(a, k) for k in ("n_layer", "n_embd", "n_head")},
        "prompts": a.prompts, "generations": a.generations, "tokens": a.tokens, "beta": a.beta,
        "warmup": a.warmup, "steps": len(rows), "median_step_s": round(step, 4),
        "step_s": [round(r["step_s"], 4) for r in rows],
        "completion_tokens_per_s": round(statistics.median(r["tokens"] for r in rows) / step, 1),
        "peak_rss_mb": round(max(final_rss, *(r["rss_mb"] for r in rows)), 1),
        "device": a.device, "autocast": a.autocast, "backend": a.backend if name != "trl" else None,
        "gpu_peak_mb": max((r.get("gpu_peak_mb") or 0 for r in rows), default=0) or None,
        "phases": {k: round(statistics.median(r[k] for r in rows), 4) for k in PHASES},
        "phase_s": {k: [round(r[k], 3) for r in rows] for k in PHASES if k != "score_s"},
        "flop_bound_s": round(flop_bound_s, 4), "flop_efficiency": round(flop_bound_s / step, 3),
        "calibration_gflops": cal,
    } | ({"micro_batch": a.micro_batch, "micro_batches": rows[0]["micro_batches"],
          "mmap_threshold_kib": a.mmap_threshold_kib,
          "recompute_activations": a.recompute_activations,
          "rollout_tape_mib": a.rollout_tape_mib, "rollout_forward_reused": rows[0]["reused"]}
         if "micro_batches" in rows[0] else {})


def job_args(a, backend: str):
    """This run's arguments for one rookworld job: its backend, and autocast off for
    fast_gpt2 (float32 only)."""
    import copy

    own = copy.copy(a)
    own.backend = backend
    if backend == "fast_gpt2":
        own.autocast = "off"
    return own


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="small")
    p.add_argument("--prompts", type=int, help="P (default: 4 small, 2 gpt2-small)")
    p.add_argument("--generations", type=int, default=8, help="G")
    p.add_argument("--tokens", type=int, default=64, help="L, forced completion length")
    p.add_argument("--beta", type=float, default=0.04)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--warmup", type=int, default=1, help="unmeasured steps per implementation")
    p.add_argument("--steps", type=int, default=5, help="measured steps per implementation")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-positions", type=int, default=384)
    p.add_argument("--micro-batch", default="auto",
                   help="rookworld micro_batch: auto (the training default), "
                        "0 = the whole batch, N rows")
    p.add_argument("--release-memory", action="store_true",
                   help="rookworld release_memory=true (trim the heap between phases)")
    p.add_argument("--mmap-threshold-kib", default="auto",
                   help="rookworld mmap_threshold_kib: auto (the training default) or KiB "
                        "(glibc, during the update: large blocks returned to the OS when "
                        "freed; 0 = glibc's default)")
    p.add_argument("--recompute-activations", action="store_true",
                   help="rookworld recompute_activations=true (layer norms and GELUs "
                        "recomputed in backward: less memory, slower update)")
    p.add_argument("--rollout-tape-mib", type=int, default=256,
                   help="rookworld rollout_tape_mib: the update differentiates the rollout's "
                        "kept forward when it fits in this many MiB (0 = runs its own)")
    p.add_argument("--impl", choices=["both", "rookworld", "trl"], default="both")
    p.add_argument("--backend", default="auto",
                   help="rookworld's policy backend: auto (fast_gpt2 on CPU, hf on a GPU), "
                        "fast_gpt2, hf, or a comma list (one rookworld job each, named "
                        "rookworld:<backend>)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N, for both implementations")
    p.add_argument("--autocast", default="auto", choices=["auto", "bf16", "off"],
                   help="mixed precision for both (auto: bf16 on a GPU that has it)")
    p.add_argument("--ablate", action="store_true",
                   help="rookworld only: each optimisation off alone (ABLATIONS), side by side")
    p.add_argument("--algorithms", action="store_true",
                   help="rookworld only: GRPO, RLOO and PPO (value head, critic model) side "
                        "by side (ALGORITHMS): the critic's step time and peak memory")
    p.add_argument("--only", default="",
                   help="with --ablate: comma-separated ABLATIONS indices to run beside the "
                        "defaults (memory: each variant is a process holding its model)")
    p.add_argument("--trl-gradient-checkpointing", action="store_true",
                   help="TRL's GRPOConfig default; off by default here (faster TRL)")
    a = p.parse_args()
    shape = SHAPES[a.shape]
    a.n_layer, a.n_embd, a.n_head = shape["n_layer"], shape["n_embd"], shape["n_head"]
    a.prompts = a.prompts or shape["prompts"]

    cal_before = calibrate()
    ctx = mp.get_context("spawn")
    workers, ready = {}, {}
    if a.ablate:
        keep = {0, *(int(i) for i in a.only.split(",") if i)} if a.only else None
        jobs = [(name, rookworld_worker, (tuple(extra), env))
                for i, (name, extra, env) in enumerate(ABLATIONS) if keep is None or i in keep]
    elif a.algorithms:
        jobs = [(name, rookworld_worker, (tuple(extra), {})) for name, extra in ALGORITHMS]
    else:
        backends = a.backend.split(",")
        jobs = [("rookworld" if len(backends) == 1 else f"rookworld:{b}", rookworld_worker,
                 (), job_args(a, b)) for b in backends if a.impl in ("both", "rookworld")]
        jobs += [("trl", trl_worker, (), job_args(a, "hf"))] if a.impl in ("both", "trl") else []
    # the data check runs here once, where it may use worker processes (the workers are
    # daemonic: no children of their own); the workers get the drawn prompts
    prompts = step_prompts(job_args(a, a.backend.split(",")[0]))
    job_a = {}
    for name, fn, more, *own in jobs:
        job_a[name] = own[0] if own else a
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=fn, args=(job_a[name], child, prompts, *more), daemon=True)
        proc.start()
        child.close()  # the worker's end: a worker that dies then ends recv() with EOFError
        workers[name] = (proc, parent)
        # one set-up at a time: rookworld measures its matrix library at import, and
        # neither should start beside the other's model building
        ready[name] = parent.recv()
    rows = {name: [] for name in workers}
    names = list(workers)
    for i in range(a.warmup + a.steps):
        for name in names if i % 2 == 0 else names[::-1]:
            workers[name][1].send("step")
            r = workers[name][1].recv()
            if i >= a.warmup:
                rows[name].append(r)
    final = {}
    for name, (proc, conn) in workers.items():
        conn.send("stop")
        final[name] = conn.recv()["rss_mb"]
        proc.join(timeout=60)
    cal = {"before": round(cal_before, 1), "after": round(calibrate(), 1)}
    first = next((n for n in rows if n != "trl"), None)
    prompt_tokens = (statistics.mean(r["prompt_tokens"] for r in rows[first])
                     / (a.prompts * a.generations)) if first else 70.0
    flop_bound_s = naive_step_flops(a, prompt_tokens) / (statistics.mean(cal.values()) * 1e9)
    print(json.dumps({"calibration_gflops": cal, "matmul": "2048x2048x2048 fp32",
                      "checksums": {k: v["checksum"] for k, v in ready.items()},
                      "threads": {k: v["threads"] for k, v in ready.items()},
                      "prompt_tokens_per_row": round(prompt_tokens, 1)}))
    out = {name: summarise(name, job_a[name], rows[name], final[name], cal, flop_bound_s)
           for name in rows}
    if a.ablate or a.algorithms:  # each variant against the defaults, step time and peak RSS
        base = out[(ABLATIONS if a.ablate else ALGORITHMS)[0][0]]
        for line in out.values():
            line["step_vs_defaults"] = round(line["median_step_s"] / base["median_step_s"], 3)
            line["step_vs_defaults_paired"] = round(statistics.median(
                r["step_s"] / b["step_s"] for r, b in zip(rows[line["impl"]],
                                                          rows[base["impl"]])), 3)
            line["rss_vs_defaults"] = round(line["peak_rss_mb"] / base["peak_rss_mb"], 3)
    elif "trl" in out and len(out) > 1:
        for name in (n for n in out if n != "trl"):
            ours = out[name]
            ours["speedup_vs_trl"] = round(out["trl"]["median_step_s"] / ours["median_step_s"], 3)
            # each round ran all back to back: the median of per-round ratios is the
            # figure least moved by drift in the machine's speed during the run
            ours["speedup_vs_trl_paired"] = round(statistics.median(
                t["step_s"] / r["step_s"] for r, t in zip(rows[name], rows["trl"])), 3)
            ours["rss_ratio_vs_trl"] = round(ours["peak_rss_mb"] / out["trl"]["peak_rss_mb"], 3)
            if ours["gpu_peak_mb"] and out["trl"]["gpu_peak_mb"]:
                ours["gpu_mem_ratio_vs_trl"] = round(
                    ours["gpu_peak_mb"] / out["trl"]["gpu_peak_mb"], 3)
        out["trl"]["speedup_vs_trl"] = 1.0
    for line in out.values():
        print(json.dumps(line))


if __name__ == "__main__":
    main()
