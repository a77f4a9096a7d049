"""The two workers of `bench_grpo.py`, each run in its own process: rookworld's engine
(`rookworld_worker`, also each `--ablate` variant) and TRL's GRPOTrainer (`trl_worker`). Each
builds its implementation, sends its parameter checksum and thread count, then takes one
GRPO step each time the parent sends "step" and answers with the step's seconds, tokens,
phase times and peak RSS (and peak GPU memory on a GPU).

Both implementations get the same randomly initialised GPT-2 (`build_random`, the
character tokenizer, dropout 0, fp32), the same P prompts (the bundled training
data, drawn by the `policy_only` task mix with the same seed), the same P, G,
completion length L (forced: end-of-text is suppressed until L tokens), beta,
temperature 1.0, learning rate, grad clip, and one optimiser step per generation
batch. TRL loads the model from a local directory (no network).

TRL phases: sample_s = `_generate_single_turn` (HF generate), score_s = reward
functions, ref_s = no-grad log-prob passes (reference), update_s = the rest of
the step (policy forward, backward, optimiser). Known TRL 1.16 defect, measured
and not fixed here: its log-prob pass gives left-padded GPT-2 batches no
position_ids, so positions count the padding (~9 nats per sequence off).
"""

from __future__ import annotations

import tempfile
import time

from rookworld.memory import peak_rss_mb

PHASES = ("sample_s", "score_s", "ref_s", "update_s")


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
    from rookworld.data.load import read_samples

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

# the update's objectives side by side (bench_grpo.py --algorithms): the critic's cost beside
# GRPO's; warm-up 0 so that every measured PPO step moves the policy too
ALGORITHMS = (
    ("grpo (defaults)", []),
    ("rloo", ["advantage=rloo"]),
    ("ppo, value head", ["algorithm=ppo", "algorithm.critic.warmup_steps=0"]),
    ("ppo, critic model", ["algorithm=ppo", "algorithm.critic.warmup_steps=0",
                           "algorithm.critic.kind=model", "algorithm.critic.lr=1e-4"]),
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
        out = {"step_s": time.perf_counter() - t0, "gpu_peak_mb": gpu_mb,
               "tokens": m["sample/tokens"],
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
    from rookworld.policy import build_random, save_policy

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
        fp16=False, seed=a.seed, max_steps=steps,
        per_device_train_batch_size=a.prompts * a.generations,
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
