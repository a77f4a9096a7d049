"""Greedy held-out metrics of a model: `python -m rookworld.evaluate [model=...]`.

Reproduces the figures of the embedded model's card (greedy decoding is
deterministic), and measures any other model (`model=rookworld_lm_124m
model.path=...`) on the same splits and on the external ROOK set.
"""

from __future__ import annotations

import json
from pathlib import Path

import hydra
from omegaconf import DictConfig

from .config import WHITELIST, instantiate
from .data_io import read_samples
from .evaluation import Evaluator


def measure(policy, cfg, held_out) -> dict:
    """{"held_out": metrics, "external": metrics (when cfg.data.external_eval exists)}."""
    settings = instantiate(cfg.sampler)
    reward = instantiate(cfg.reward)
    results = {"held_out": Evaluator(held_out, settings,
                                     max_per_task=cfg.data.eval_per_task)(policy, reward)[0]}
    ext_path = cfg.data.get("external_eval")
    if ext_path and Path(ext_path).exists():
        ext = read_samples(ext_path, on_defect="relabel")
        results["external"] = Evaluator(ext, settings)(policy, reward)[0]
    elif ext_path:
        print(f"[rookworld] data.external_eval={ext_path}: no such file; the external ROOK "
              "set is skipped (point data.external_eval or ROOKWORLD_EXTERNAL_EVAL at a copy, "
              "or set it to null)", flush=True)
    return results


@hydra.main(config_path="../conf", config_name="evaluate", execution_whitelist=WHITELIST)
def main(cfg: DictConfig) -> None:
    results = measure(instantiate(cfg.model), cfg, read_samples(cfg.data.eval))
    text = json.dumps(results, indent=2)
    print(text)
    if cfg.out:
        Path(cfg.out).write_text(text + "\n")


if __name__ == "__main__":
    import sys

    from .config import check_argv
    check_argv(sys.argv[1:])
    main()
