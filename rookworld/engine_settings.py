"""The GRPO engine's settings as typed objects with their checks (`EngineSettings`,
`ReferenceSettings`), and the backend choice's check that needs no model yet.

Their fields are the train config's own keys: `config.TrainConfig` extends EngineSettings
with the run's keys and is the schema Hydra composes conf/train.yaml into."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from .errors import check_int
from .precision import check_choice as check_autocast

BACKENDS = ("auto", "fast_gpt2", "hf")

# micro_batch_tokens=auto: tokens a chunk of the update for models under SMALL_MODEL_PARAMS,
# and from there up (benchmarks/README.md, "micro_batch_tokens").
SMALL_MODEL_PARAMS = 50_000_000
AUTO_CHUNK_TOKENS_SMALL, AUTO_CHUNK_TOKENS = 4096, 1024


def micro_batch_tokens(setting: int | str, n_params: int) -> int:
    """The tokens per update chunk the engine uses for the micro_batch_tokens setting."""
    if setting == "auto":
        return AUTO_CHUNK_TOKENS_SMALL if n_params < SMALL_MODEL_PARAMS else AUTO_CHUNK_TOKENS
    if isinstance(setting, bool) or not isinstance(setting, int) or setting < 1:
        raise ValueError(f"micro_batch_tokens must be auto or an integer >= 1, got {setting!r}")
    return setting


def check_backend(backend: str, autocast: str, device: str, hf_model: bool,
                  recompute_activations: bool = False) -> None:
    """ValueError unless `backend` can run the model (hf_model: a transformers model, not
    rookworld's GPT-2) with these settings on `device`."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {' | '.join(BACKENDS)}, got {backend!r}")
    check_autocast(autocast)
    on_gpu = str(device).startswith("cuda")
    if backend == "fast_gpt2" and hf_model:
        raise ValueError("backend=fast_gpt2 runs rookworld's own GPT-2 class only; this model "
                         "is a transformers model: use backend=hf (or auto)")
    if backend == "fast_gpt2" and autocast == "bf16" and on_gpu:
        raise ValueError("backend=fast_gpt2 takes autocast=bf16 on the CPU only; on a GPU use "
                         "backend=hf (or auto), or set autocast=off")
    if recompute_activations and (backend == "hf" or hf_model or (backend == "auto" and on_gpu)):
        raise ValueError("recompute_activations=true needs backend=fast_gpt2 (the hf backend "
                         "runs transformers' forward as it is); set it to false")


def _check_device(key: str, device) -> None:
    if not str(device).startswith(("cpu", "cuda")):
        raise ValueError(f"{key} must be cpu, cuda or cuda:N, got {device!r}")


@dataclass
class ReferenceSettings:
    """The `reference` node of conf/train.yaml: the frozen reference model."""

    enabled: bool = True
    sync_every: int = 0
    sync_alpha: float = 1.0
    device: str | None = None

    def __post_init__(self):
        if not isinstance(self.enabled, bool):
            raise ValueError(f"reference.enabled must be true or false, got {self.enabled!r}")
        check_int("reference.sync_every", self.sync_every, 0)
        a = self.sync_alpha
        if isinstance(a, bool) or not isinstance(a, int | float) or not 0 < a <= 1:
            raise ValueError(f"reference.sync_alpha must be in (0, 1], got {a!r}")
        if self.device is not None:
            _check_device("reference.device", self.device)


@dataclass
class EngineSettings:
    """Every choice of the engine that is not an injected object. The fields are
    conf/train.yaml's keys, and its comments say what each does; the defaults are its
    values (tests/test_engine.py checks that they agree)."""

    num_generations: int = 8
    steps: int = 45
    zero_variance: str = "keep"
    micro_batch: int | str = "auto"
    micro_batch_tokens: int | str = "auto"
    seed: int = 0
    device: str = "cpu"
    release_memory: bool = False
    mmap_threshold_kib: int | str = "auto"
    recompute_activations: bool = False
    rollout_tape_mib: int = 256
    backend: str = "auto"
    autocast: str = "auto"
    reference: ReferenceSettings = field(default_factory=ReferenceSettings)

    def __post_init__(self):
        check_int("num_generations", self.num_generations, 2)
        check_int("steps", self.steps, 1)
        check_int("seed", self.seed, 0)
        check_int("micro_batch", self.micro_batch, 0, auto=True)
        check_int("micro_batch_tokens", self.micro_batch_tokens, 1, auto=True)
        check_int("mmap_threshold_kib", self.mmap_threshold_kib, 0, auto=True)
        check_int("rollout_tape_mib", self.rollout_tape_mib, 0)
        for key in ("release_memory", "recompute_activations"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"{key} must be true or false, got {getattr(self, key)!r}")
        if self.zero_variance not in ("keep", "drop"):
            raise ValueError(f"zero_variance must be keep or drop, got {self.zero_variance!r}")
        _check_device("device", self.device)
        check_backend(self.backend, self.autocast, self.device, hf_model=False)

    @classmethod
    def from_config(cls, cfg) -> EngineSettings:
        """The settings a composed train config (`conf/train.yaml`) names."""
        ref = cfg.reference
        return cls(**{f.name: cfg[f.name] for f in fields(cls) if f.name != "reference"},
                   reference=ReferenceSettings(ref.enabled, ref.sync_every, ref.sync_alpha,
                                               ref.get("device")))  # runs saved before it: none
