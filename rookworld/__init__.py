"""rookworld: GRPO (RL with verifiable rewards) for chess language models, configured with Hydra.

Importing the package bounds two CPU kernel caches before torch's oneDNN builds its first
compiled product (see `CPU_KERNEL_CACHE`): the one process-wide choice that cannot wait for
`runtime.setup`, which makes the others and records this one.
"""

import os as _os

# oneDNN (ONEDNN_PRIMITIVE_CACHE_CAPACITY) and PyTorch's ideep layer over it
# (LRU_CACHE_CAPACITY) each keep up to 1,024 compiled matrix products, one per shape, and
# give none back while there is room. GRPO's prompt and completion widths change every step,
# so a run keeps adding shapes: 200 shapes of one 256 x 768 product took 132 MB (21 MB with
# 16 each), and the main job's peak RSS rose from 918 to 1,602 MB over its 20 steps (16
# each: 1,069 MB, level from step 8; 64 each: 1,218 MB). The price is building some products
# again each step: the 4 x 8 x 64 benchmark step builds ~22 more than with 1,024 (about 6 ms
# of its 330 ms);
# the whole main job spent 292 ms building products at 16, 262 ms at 64. Both variables are
# read when oneDNN first builds a product, which every rookworld import precedes; a value
# already in the environment wins.
CPU_KERNEL_CACHE = 16
KERNEL_CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")
for _name in KERNEL_CACHE_VARIABLES:
    if _name == "ONEDNN_PRIMITIVE_CACHE_CAPACITY" and "DNNL_PRIMITIVE_CACHE_CAPACITY" in _os.environ:
        continue  # oneDNN's older name for the same setting: the user's choice
    _os.environ.setdefault(_name, str(CPU_KERNEL_CACHE))
