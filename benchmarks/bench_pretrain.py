"""Pretraining throughput: rookworld's SFT step vs a plain transformers GPT-2 loop.

    .venv/bin/python benchmarks/bench_pretrain.py --steps 20 --batch-size 32

Both sides train the same randomly initialised GPT-2 (the embedded model's shape,
character vocabulary, dropout 0, fp32) on the same batches of the bundled train
split (prompt + completion + end-of-text, right-padded, loss on completion tokens
only), with AdamW and gradient clipping as `rookworld.pretrain` uses them. The two
alternate step by step, so drift in the machine's speed hits both alike. Prints one
JSON line per implementation: median step seconds, loss-bearing (completion) tokens
per second, all tokens per second, and the ratio of medians.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch
import torch.nn.functional as F

from rookworld.data.load import read_samples
from rookworld.policy import build_random
from rookworld.sft import encode, lm_loss, make_batch


def hf_model(policy):
    """transformers' GPT2LMHeadModel holding the same weights (its own forward)."""
    return policy.model.to_transformers()


def hf_loss(model, ids, labels):
    logits = model(input_ids=ids, use_cache=False).logits[:, :-1]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                           ignore_index=-100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=256)
    ap.add_argument("--n-head", type=int, default=4)
    args = ap.parse_args()
    from rookworld import runtime
    from rookworld.config import pkg_data
    runtime.setup()  # as rookworld.pretrain does, before the models
    rows = None
    impls = {}
    for name in ("rookworld", "transformers"):
        policy = build_random(n_layer=args.n_layer, n_embd=args.n_embd, n_head=args.n_head,
                              n_positions=384, seed=0)
        if rows is None:
            rows = encode(policy, read_samples(pkg_data("train.jsonl.gz")))
            pad = policy.eos_id
        model = policy.model if name == "rookworld" else hf_model(policy)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95),
                                weight_decay=0.1)
        loss_fn = lm_loss if name == "rookworld" else hf_loss
        impls[name] = (model, opt, loss_fn, [])
    counts = []
    for step in range(args.warmup + args.steps):
        batch = random.Random(step).sample(rows, args.batch_size)
        ids, labels = make_batch(batch, pad)
        counts.append(((labels != -100).sum().item(), ids.numel()))
        for model, opt, loss_fn, times in impls.values():
            t0 = time.perf_counter()
            loss = loss_fn(model, ids, labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if step >= args.warmup:
                times.append(time.perf_counter() - t0)
    loss_tokens = statistics.mean(c for c, _ in counts[args.warmup:])
    all_tokens = statistics.mean(t for _, t in counts[args.warmup:])
    medians = {}
    for name, (_, _, _, times) in impls.items():
        med = statistics.median(times)
        medians[name] = med
        print(json.dumps({"impl": name, "median_step_s": round(med, 4),
                          "completion_tokens_per_s": round(loss_tokens / med),
                          "tokens_per_s": round(all_tokens / med),
                          "batch_size": args.batch_size, "steps": args.steps,
                          "threads": torch.get_num_threads()}))
    print(json.dumps({"speedup_vs_transformers": round(medians["transformers"]
                                                       / medians["rookworld"], 3)}))


if __name__ == "__main__":
    main()
