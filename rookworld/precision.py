"""Mixed precision: the `autocast` setting resolved per device and backend, and the
contexts that apply it.

hf backend: auto is bfloat16 autocast on a CUDA device with native bf16 (compute capability
8+), float32 elsewhere; bf16 is bfloat16 autocast on every device, CPU included. Under
autocast, where PPO pays the KL in its rewards (kl_penalty=reward), the engine takes the
sampled tokens' log-probs from a teacher-forced pass, as the reference's are taken, so that
KL starts at 0.
fast_gpt2 (CPU): bf16 runs its matrix products in bfloat16 on a CPU with native bf16 and is
refused elsewhere; auto does so only where bf16 products beat float32
(`cpu_bf16_is_faster`) and keeps float32 elsewhere (`products_dtype`,
`fast_gpt2.matmul.low_precision`), for sampling, reference pass and update alike; held-out
evaluations stay float32. off: float32 throughout. The reference runs at the policy's
precision. Weights, optimiser state and the loss's log-softmax stay float32 in every case;
only the matrix products run in bfloat16, so no gradient scaling is needed.

In bfloat16 the sampler's cached one-token steps, a teacher-forced pass and the update's
differentiable pass round apart (by up to ~0.1 nats a token). The update's first iteration
therefore takes its old log-probs from its own forward (`GRPOEngine.chunk_loss`), so the
policy ratio starts at exactly 1 under every setting; the KL to the reference at step 0
reads bf16 rounding (kl/k3 about 2e-5 on the embedded model) instead of 0.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

CHOICES = ("auto", "bf16", "off")


def check_choice(setting: str) -> None:
    """ValueError unless setting is one of CHOICES."""
    if setting not in CHOICES:
        raise ValueError(f"autocast must be one of {' | '.join(CHOICES)}, got {setting!r}")


def autocast_dtype(setting: str, device) -> torch.dtype | None:
    """The autocast dtype on `device` for `setting` (None: float32)."""
    check_choice(setting)
    device = torch.device(device)
    if setting == "off":
        return None
    if setting == "bf16":
        return torch.bfloat16
    if device.type == "cuda" and torch.cuda.is_available() and \
            torch.cuda.get_device_capability(device)[0] >= 8:
        return torch.bfloat16
    return None


def cpuinfo(field: str) -> str:
    """The first value of `field` in /proc/cpuinfo ("" where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.split(":", 1)[0].strip() == field:
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def cpu_has_native_bf16() -> bool:
    """Whether this CPU has bfloat16 product instructions (AVX512-BF16 or AMX-BF16);
    elsewhere torch emulates them, far slower. Having them does not make bf16 products
    faster than float32 (`cpu_bf16_is_faster`)."""
    return bool(set(cpuinfo("flags").split()) & {"avx512_bf16", "amx_bf16"})


def cpu_bf16_is_faster() -> bool:
    """Whether bf16 products beat float32 on this CPU, by a fixed rule (a timing at start-up
    could choose differently for the same seed under load): AMX-BF16, or AVX512-BF16 on a
    CPU that is not Intel's: on AMD's AVX512-BF16 bf16 products beat float32, on Intel's
    without AMX they lose (benchmarks/README.md, section The main job: bf16 products). AMX,
    Intel's bf16 tile unit, is taken on its design: no host with it has been measured."""
    flags = set(cpuinfo("flags").split())
    if "amx_bf16" in flags:
        return True
    return "avx512_bf16" in flags and cpuinfo("vendor_id") != "GenuineIntel"


def products_dtype(setting: str, device) -> torch.dtype | None:
    """The dtype of fast_gpt2's matrix products (CPU) for `setting`: bf16 -> bfloat16;
    auto -> bfloat16 where bf16 products are the faster (`cpu_bf16_is_faster`); off, or
    any other device -> None (float32). bf16 on a CPU without native bf16 raises ValueError."""
    check_choice(setting)
    if torch.device(device).type != "cpu" or setting == "off":
        return None
    native = cpu_has_native_bf16()
    if setting == "bf16" and not native:
        # oneDNN and MKL refuse bf16 products on a CPU without AVX-512; torch.matmul
        # emulates them, orders of magnitude slower than float32
        raise ValueError("autocast=bf16 under backend=fast_gpt2 needs a CPU with native bf16 "
                         "(AVX512-BF16 or AMX), which this one lacks: use autocast=auto or off "
                         "(float32 here), or backend=hf")
    return torch.bfloat16 if native and (setting == "bf16" or cpu_bf16_is_faster()) else None


def autocast(dtype: torch.dtype | None, device):
    """A context running matrix products on `device` in `dtype` (None: as they are)."""
    if dtype is None:
        return nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)


def name(dtype: torch.dtype | None) -> str:
    return "bf16" if dtype is torch.bfloat16 else "off"
