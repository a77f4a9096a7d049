"""rookworld: GRPO (RL with verifiable rewards) for chess language models, configured with Hydra.

The modules in layers, bottom up; a module imports from its own layer and those below it
only, and no import cycle exists (tests/test_layout.py checks both, and that every module
is listed; a subpackage's name covers its modules):

    base: rookworld, precision, files, redact, errors, distributed, engine_settings, optim, memory
    tasks: chess_tasks
    maths: gpt2, sampling, legal_mask, advantages, kl_schedule, grpo, ppo, guards, sft
    config: config
    data and rewards: data, task_mix, rewards
    backend: backends, policy
    engine: engine, batch, credit, critic, anchor, prompt_filter, held_out, runtime, strength,
        episodes
    tracking: run_dir, loggers, report, diff, resume, model_card, sweeps
    entry points: train, pretrain, evaluate

Importing the package bounds two CPU kernel caches before torch's oneDNN builds its first
compiled product (see `CPU_KERNEL_CACHE`): the one process-wide choice that cannot wait for
`runtime.setup`, which makes the others and records this one.
"""

import os as _os

# oneDNN (ONEDNN_PRIMITIVE_CACHE_CAPACITY) and PyTorch's ideep layer over it
# (LRU_CACHE_CAPACITY) each keep up to 1,024 compiled matrix products, one per shape, and
# give none back while there is room. GRPO's prompt and completion widths change every step,
# so a run keeps adding shapes and its peak RSS keeps growing; at 16 each it levels off, for
# the price of building some products again (figures: benchmarks/README.md). Both variables
# are read when oneDNN first builds a product, which every rookworld import precedes; a
# value already in the environment wins.
CPU_KERNEL_CACHE = 16
KERNEL_CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")
for _name in KERNEL_CACHE_VARIABLES:
    if (_name == "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
            and "DNNL_PRIMITIVE_CACHE_CAPACITY" in _os.environ):
        continue  # oneDNN's older name for the same setting: the user's choice
    _os.environ.setdefault(_name, str(CPU_KERNEL_CACHE))
