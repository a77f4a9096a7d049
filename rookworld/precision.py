"""Mixed precision: the `autocast` setting resolved per device, and the context that applies it.

auto: bfloat16 autocast when the policy is on a CUDA device with native bf16 (compute
capability 8+), none elsewhere (the CPU path keeps float32: its native kernels and matrix
library are tuned for it). bf16: bfloat16 autocast on every device of the run, CPU
included. off: float32 throughout. The reference runs at the policy's precision. Weights,
optimiser state and the loss's log-softmax stay float32 in every case; only the matrix
products run in bfloat16 (`torch.autocast`), so no gradient scaling is needed. Under
autocast the engine takes the sampled tokens' log-probs from a teacher-forced pass, as the
update computes them, so the policy ratio starts at 1.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

CHOICES = ("auto", "bf16", "off")


def autocast_dtype(setting: str, device) -> torch.dtype | None:
    """The autocast dtype on `device` for `setting` (None: float32)."""
    if setting not in CHOICES:
        raise ValueError(f"autocast must be one of {' | '.join(CHOICES)}, got {setting!r}")
    device = torch.device(device)
    if setting == "off":
        return None
    if setting == "bf16":
        return torch.bfloat16
    if device.type == "cuda" and torch.cuda.is_available() and \
            torch.cuda.get_device_capability(device)[0] >= 8:
        return torch.bfloat16
    return None


def autocast(dtype: torch.dtype | None, device):
    """A context running matrix products on `device` in `dtype` (None: as they are)."""
    if dtype is None:
        return nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)


def name(dtype: torch.dtype | None) -> str:
    return "bf16" if dtype is torch.bfloat16 else "off"
