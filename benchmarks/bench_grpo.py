"""One GRPO step, side by side: rookworld's engine and TRL's GRPOTrainer on this CPU or a GPU.

    .venv/bin/python benchmarks/bench_grpo.py --shape small          # 4 x 8 x 64, 4 layers/256
    .venv/bin/python benchmarks/bench_grpo.py --shape gpt2-small     # 2 x 8 x 64, 12 layers/768
    python benchmarks/bench_grpo.py --device cuda --shape gpt2-small --prompts 8 \
        --tokens 144 --backend fast_gpt2,hf                          # both backends and TRL

On a GPU (`--device cuda`) both run with bf16 autocast where the device has it
(`--autocast auto`; rookworld's fast_gpt2 backend runs float32 only, so its job runs
with autocast off), each step ends with a device synchronise, and every line also
carries the peak GPU memory allocated (`gpu_peak_mb`).

Both implementations get the same randomly initialised GPT-2 (`build_random`, the
character tokenizer, dropout 0, fp32), the same P prompts (the bundled training
data, drawn by the `policy_only` task mix with the same seed), the same P, G,
completion length L (forced: end-of-text is suppressed until L tokens), beta,
temperature 1.0, learning rate, grad clip, and one optimiser step per generation
batch. TRL loads the model from a local directory (no network).

Each implementation runs in its own process, so each peak RSS is its own (VmHWM,
`rookworld.memory.peak_rss_mb`: ru_maxrss would count the parent's peak at the spawn); the
parent tells them to take one step in turn (warm-up steps first, then the
measured ones, alternating so that machine drift hits both alike), then prints
one JSON line per implementation: median step seconds, completion tokens per
second, peak RSS, median phase times, and the speed ratio; plus a matmul
calibration (GFLOP/s of a fixed fp32 matmul) taken before and after.

TRL phases: sample_s = `_generate_single_turn` (HF generate), score_s = reward
functions, ref_s = no-grad log-prob passes (reference), update_s = the rest of
the step (policy forward, backward, optimiser). Known TRL 1.16 defect, measured
and not fixed here: its log-prob pass gives left-padded GPT-2 batches no
position_ids, so positions count the padding (~9 nats per sequence off).

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
import tempfile
import time

from rookworld.memory import peak_rss_mb

SHAPES = {
    "small": dict(n_layer=4, n_embd=256, n_head=4, prompts=4),
    "gpt2-small": dict(n_layer=12, n_embd=768, n_head=12, prompts=2),
}
VOCAB = 96  # build_char_tokenizer(): 95 printable characters + <|endoftext|>
PHASES = ("sample_s", "score_s", "ref_s", "update_s")


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


def overrides(a) -> list[str]:
    """The `python -m rookworld.train` overrides for this benchmark's step."""
    return ["model=tiny_random", f"model.n_layer={a.n_layer}", f"model.n_embd={a.n_embd}",
            f"model.n_head={a.n_head}", f"model.n_positions={a.n_positions}",
            f"model.seed={a.seed}", f"seed={a.seed}", "logger=none", "task_mix=policy_only",
            f"prompts_per_step={a.prompts}", f"num_generations={a.generations}",
            f"sampler.max_new_tokens={a.tokens}", f"sampler.min_new_tokens={a.tokens}",
            f"sampler.per_task.A.max_new_tokens={a.tokens}", "sampler.temperature=1.0",
            "kl=fixed", f"kl.beta={a.beta}", f"optim.lr={a.lr}", "optim.grad_clip=1.0",
            f"micro_batch={a.micro_batch}", "reward=graduated",
            f"release_memory={str(a.release_memory).lower()}",
            f"mmap_threshold_kib={a.mmap_threshold_kib}",
            f"recompute_activations={str(a.recompute_activations).lower()}",
            f"rollout_tape_mib={a.rollout_tape_mib}", f"backend={a.backend}",
            f"device={a.device}", f"autocast={a.autocast}"]


def job_config(a, extra: tuple = ()):
    """(config, reward) of this benchmark's step. Only the config and the reward are
    imported here, so the TRL process carries none of rookworld's engine (its
    matrix-library probe, kernels, sweep modules)."""
    from rookworld.config import compose, instantiate

    cfg = compose(overrides(a) + list(extra))
    return cfg, instantiate(cfg.reward)


def step_prompts(a) -> list[list]:
    """The P prompts of every step, `mix.draw(pools, P, s, seed)` from the bundled training
    data, drawn once in the parent and handed to each worker: the peak RSS of a worker is
    its implementation's, not that of 100,000 training samples as Python objects (about
    210 MiB, which both workers would otherwise hold alike)."""
    from rookworld.config import instantiate
    from rookworld.data_io import read_samples

    cfg, _ = job_config(a)
    train = read_samples(cfg.data.train)
    pools = {t: [s for s in train if s.task == t] for t in ("P", "A")}
    mix = instantiate(cfg.task_mix)
    return [mix.draw(pools, a.prompts, step, cfg.seed) for step in range(a.warmup + a.steps)]


def param_checksum(model) -> float:
    return float(sum(p.detach().double().sum() for p in model.parameters()))


def gpu_peak_mb(device: str) -> float | None:
    """Peak GPU memory allocated by this process (None on the CPU), after a synchronise."""
    import torch

    if not device.startswith("cuda"):
        return None
    torch.cuda.synchronize(device)
    return round(torch.cuda.max_memory_allocated(device) / 2 ** 20, 1)


# ---------------------------------------------------------------- rookworld
# --ablate: each optimisation switched off alone, every variant in its own process, all
# stepping in turn (name, config overrides, environment set before rookworld is imported)
ABLATIONS = (
    ("all on (defaults)", [], {}),
    ("native kernels off", [], {"ROOKWORLD_NATIVE": "0"}),
    ("rollout tape off", ["rollout_tape_mib=0"], {}),
    ("prompt not shared per group", [], {"ROOKWORLD_SHARE_PROMPTS": "0"}),
    ("transformers' GPT-2 (backend=hf)", ["backend=hf"], {}),
    ("allocator left to glibc", ["mmap_threshold_kib=0"], {}),
    ("matrix library: onednn for all", [], {"ROOKWORLD_CPU_MATMUL": "onednn"}),
    ("no micro-batching (whole batch)", ["micro_batch=0"], {}),
    ("decoding weights not packed", [], {"ROOKWORLD_PACK_BELOW_ROWS": "0"}),
    ("AdamW not fused (torch's default)", [], {"ROOKWORLD_FUSED_ADAMW": "0"}),
    ("kernel caches at torch's 1,024", [], {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024",
                                             "LRU_CACHE_CAPACITY": "1024"}),
)


def rookworld_worker(a, conn, prompts: list, extra: tuple = (), env: dict | None = None
                     ) -> None:
    import os

    os.environ.update(env or {})
    import torch

    from rookworld import runtime
    from rookworld.train import build_engine, build_parts

    cfg, reward = job_config(a, extra)
    parts = build_parts(cfg)  # validates the config, as `python -m rookworld.train` does
    runtime.setup(cfg.cpu_matmul)  # as train does, before the model
    torch.manual_seed(cfg.seed)
    engine = build_engine(cfg, parts, reward)
    conn.send({"checksum": param_checksum(engine.model), "threads": torch.get_num_threads()})
    step = 0
    while conn.recv() == "step":
        t0 = time.perf_counter()
        batch = engine.rollout(prompts[step], step)
        m = batch.metrics | engine.update(batch, step)
        gpu_mb = gpu_peak_mb(a.device)
        out = {"step_s": time.perf_counter() - t0, "gpu_peak_mb": gpu_mb, "tokens": m["sample/tokens"],
               "prompt_tokens": float(batch.rollout.prompt_mask.sum()),
               "micro_batches": m["optim/micro_batches"],
               "reused": bool(m["optim/rollout_forward_reused"]),
               **{k: m[f"time/{k}"] for k in PHASES}}
        out["rss_mb"] = peak_rss_mb()  # the process's, on a GPU too (gpu_peak_mb: the device's)
        conn.send(out)
        step += 1
    conn.send({"rss_mb": peak_rss_mb()})


# ---------------------------------------------------------------------- TRL
def trl_worker(a, conn, prompts: list) -> None:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rookworld import precision
    from rookworld.model import build_random, save_policy

    cfg, reward = job_config(a)
    steps = a.warmup + a.steps
    draws = [s for step_samples in prompts for s in step_samples]
    by_prompt = {s.prompt: s for s in draws}
    timers = dict.fromkeys(PHASES, 0.0)

    def reward_fn(prompts, completions, **kwargs):
        return [reward(by_prompt[p], c).score for p, c in zip(prompts, completions)]

    def timed(fn, phase_of):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                phase = phase_of()
                if phase:
                    timers[phase] += time.perf_counter() - t0
        return wrapper

    policy = build_random(a.n_layer, a.n_embd, a.n_head, a.n_positions, seed=a.seed)
    model_dir = tempfile.mkdtemp(prefix="bench_grpo_model_")
    save_policy(policy, model_dir)
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench_grpo_trl_"), use_cpu=a.device == "cpu",
        bf16=a.device != "cpu" and precision.autocast_dtype(a.autocast, a.device) is not None,
        fp16=False, seed=a.seed, max_steps=steps, per_device_train_batch_size=a.prompts * a.generations,
        num_generations=a.generations, max_completion_length=a.tokens, temperature=1.0,
        top_k=0, top_p=1.0, beta=a.beta, learning_rate=a.lr, lr_scheduler_type="constant",
        max_grad_norm=1.0, warmup_steps=0, num_iterations=1, disable_dropout=True,
        generation_kwargs={"min_new_tokens": a.tokens}, shuffle_dataset=False,
        gradient_checkpointing=a.trl_gradient_checkpointing, report_to=[], logging_steps=10_000,
        save_strategy="no", dataloader_num_workers=0, model_init_kwargs={"dtype": "float32"},
        disable_tqdm=True)
    trainer = GRPOTrainer(model=model_dir, reward_funcs=reward_fn, args=args,
                          train_dataset=Dataset.from_dict({"prompt": [s.prompt for s in draws]}),
                          processing_class=policy.tokenizer)
    trainer._generate_single_turn = timed(trainer._generate_single_turn, lambda: "sample_s")
    trainer._calculate_rewards = timed(trainer._calculate_rewards, lambda: "score_s")
    trainer._get_per_token_logps_and_entropies = timed(
        trainer._get_per_token_logps_and_entropies,
        lambda: None if torch.is_grad_enabled() else "ref_s")

    class Gate(TrainerCallback):
        """Blocks each step until the parent says go; reports its times after."""

        t0 = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            conn.recv()
            timers.update(dict.fromkeys(PHASES, 0.0))
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            gpu_mb = gpu_peak_mb(a.device)
            step_s = time.perf_counter() - self.t0
            timers["update_s"] = step_s - timers["sample_s"] - timers["score_s"] - timers["ref_s"]
            n = a.prompts * a.generations
            conn.send({"step_s": step_s, "tokens": float(n * a.tokens), **timers,
                       "rss_mb": peak_rss_mb(), "gpu_peak_mb": gpu_mb})

    trainer.add_callback(Gate())
    conn.send({"checksum": param_checksum(trainer.model), "threads": torch.get_num_threads()})
    trainer.train()
    conn.recv()  # the parent's stop
    conn.send({"rss_mb": peak_rss_mb()})


# ------------------------------------------------------------------- parent
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
                   help="rookworld micro_batch: auto (the training default), 0 = the whole batch, N rows")
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
    if a.ablate:  # each variant against the defaults, step time and peak RSS
        base = out[ABLATIONS[0][0]]
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
