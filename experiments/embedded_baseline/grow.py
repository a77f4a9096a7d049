"""A deeper copy of a model in the embedded layout that computes the same function: blocks
appended after the last one, each a copy of the last block with both output projections
(attention's and the MLP's c_proj) set to zero, so each adds nothing to the residual
stream until training moves those projections.

    python experiments/embedded_baseline/grow.py OUT --layers N [--model DIR]

DIR: the model to grow (default: the shipped one). Continue it with `python -m
rookworld.pretrain model=embedded model.path=OUT ...`.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses

import torch


def grow(policy, n_layer: int):
    """-> a Policy whose model has n_layer blocks and the same outputs as policy's."""
    from rookworld.gpt2 import GPT2LMHeadModel

    old = policy.model.config.n_layer
    if n_layer < old:
        raise ValueError(f"--layers {n_layer} is below the model's {old}")
    config = copy.deepcopy(policy.model.config)
    config.n_layer = n_layer
    model = GPT2LMHeadModel(config)
    source = policy.model.state_dict()
    target = model.state_dict()
    with torch.no_grad():
        for key, value in target.items():
            if key in source:
                value.copy_(source[key])
                continue
            block = int(key.split(".")[2])  # transformer.h.<block>....
            value.copy_(source[key.replace(f"h.{block}.", f"h.{old - 1}.", 1)])
            if ".c_proj." in key:
                value.zero_()
    model.load_state_dict(target)
    model.tie_weights()
    return dataclasses.replace(policy, model=model.eval())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--layers", type=int, required=True)
    parser.add_argument("--model", default=None, help="model directory (default: shipped)")
    args = parser.parse_args()
    from rookworld.policy import load_embedded, save_policy

    save_policy(grow(load_embedded(args.model), args.layers), args.out)


if __name__ == "__main__":
    main()
