"""The GRPO engine's settings as one typed object (`EngineSettings`), built from the config
in one place (`train.build_engine`)."""

from __future__ import annotations

from dataclasses import dataclass

# micro_batch_tokens=auto: tokens a chunk of the update for models under SMALL_MODEL_PARAMS,
# and from there up. A small model runs fewer, larger chunks faster for little memory; the
# 124M shape keeps 1024, which holds its update's peak RSS target. Figures: benchmarks/README.md.
SMALL_MODEL_PARAMS = 50_000_000
AUTO_CHUNK_TOKENS_SMALL, AUTO_CHUNK_TOKENS = 4096, 1024


def micro_batch_tokens(setting: int | str, n_params: int) -> int:
    """The tokens per update chunk the engine uses for the config's micro_batch_tokens."""
    if setting == "auto":
        return AUTO_CHUNK_TOKENS_SMALL if n_params < SMALL_MODEL_PARAMS else AUTO_CHUNK_TOKENS
    if isinstance(setting, bool) or not isinstance(setting, int) or setting < 1:
        raise ValueError(f"micro_batch_tokens must be auto or an integer >= 1, got {setting!r}")
    return setting


@dataclass(frozen=True)
class EngineSettings:
    """num_generations: G, the completions per prompt; total_steps: the learning-rate
    schedule's length; num_iterations: PPO updates per batch; kl_estimator:
    k1|k2|k3|full_forward|full_reverse|full_symmetric (full = full_forward), the estimator
    inside the loss; entropy_coef: bonus weight (entropy is measured and logged either way);
    zero_variance: keep or drop groups whose rewards are all equal; micro_batch: rows per
    forward/backward chunk of the update and the reference pass (0 = all at once; "auto":
    the update's chunks sized each step by `batch.micro_batch_rows` from
    micro_batch_tokens, the reference pass whole); use_reference: keep a frozen reference
    (needed by KL schedules with beta > 0 and by the KL guard);
    ref_sync_every/ref_sync_alpha: periodic ref <- alpha*policy + (1-alpha)*ref (0 = never);
    seed: the sampling generators' seed; nan_lr_backoff: factor on the learning rate after
    an update skipped for non-finite loss or gradients; device: where the model runs (under
    DDP the rank's device instead); release_memory: hand freed heap pages back to the OS
    after each rollout and update (`runtime.release_freed_memory`); mmap_threshold_kib:
    during each update, heap blocks from this many KiB up get their own mappings, returned
    to the OS when freed; the rollout runs at `runtime.ROLLOUT_MMAP_KIB` (0 = glibc's
    default throughout; `runtime.choose_allocator` resolves the config's setting);
    recompute_activations: the update's forward keeps fewer activations and recomputes
    layer norms and GELUs in backward (`forward.block`); rollout_tape_mib: sampling keeps
    its forward (`tape.Tape`) when it fits in this many MiB, and the update's first
    iteration differentiates it, running a third of the policy's forward instead of all of
    it (0 = always all of it; under DDP the ranks' gradients are then averaged by
    `DistContext.average_gradients`, as DDP's hooks only follow its own forward); backend:
    auto | fast_gpt2 | hf, what runs the model (`backends.resolve`; the rollout tape and
    recompute_activations are fast_gpt2's); autocast: auto | bf16 | off, mixed precision of
    the model's matrix products on each device (`precision.autocast_dtype`);
    reference_device: where the frozen reference runs (None: with the policy); credit:
    sequence (every token its sequence's advantage) | moves (each P move's characters the
    advantage of its own legality, `credit.move_advantages`)."""

    num_generations: int
    total_steps: int
    num_iterations: int = 1
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    zero_variance: str = "keep"
    credit: str = "sequence"
    micro_batch: int | str = "auto"
    micro_batch_tokens: int = 1024
    use_reference: bool = True
    ref_sync_every: int = 0
    ref_sync_alpha: float = 1.0
    seed: int = 0
    nan_lr_backoff: float = 0.5
    device: str = "cpu"
    release_memory: bool = False
    mmap_threshold_kib: int = 0
    recompute_activations: bool = False
    rollout_tape_mib: int = 256
    backend: str = "auto"
    autocast: str = "auto"
    reference_device: str | None = None

    def __post_init__(self):
        mb, tokens = self.micro_batch, self.micro_batch_tokens
        if not (mb == "auto" or (isinstance(mb, int) and mb >= 0)):
            raise ValueError(f"micro_batch must be auto or an integer >= 0, got {mb!r}")
        if not (isinstance(tokens, int) and tokens >= 1):
            raise ValueError(f"micro_batch_tokens must be an integer >= 1, got {tokens!r}")
        if self.credit not in ("sequence", "moves"):
            raise ValueError(f"algorithm.credit must be sequence or moves, got {self.credit!r}")
