"""Optimisations change speed, not results: the same seed gives the same samples and
the same losses on the fast backend (shared prompt passes, rollout tape, native kernels) as
on the plain one (`backend=hf`: transformers' GPT-2, every row's own full forward).

tests/data/perf_golden.json holds the plain engine's output, recorded from the current
code by

    ROOKWORLD_RECORD_GOLDEN=1 pytest tests/test_perf_equivalence.py

(recording runs backend=hf only); both backends are checked against it. Sampled ids and
masks must match exactly; log-probs, losses and norms to float32 rounding (the fast path
shares each prompt's forward among its G rows and sums in a different order).
"""

import json
import os
from pathlib import Path

import pytest
import torch

from rookworld.config import compose
from rookworld.data.load import read_samples
from rookworld.rewards.base import Reward, Scored
from rookworld.train import build_engine, build_parts

GOLDEN = Path(__file__).parent / "data" / "perf_golden.json"
RECORD = os.environ.get("ROOKWORLD_RECORD_GOLDEN") == "1"

SCENARIOS = {
    # GRPO defaults: seq-mean-token-mean, k3 in the loss, whole batch per forward
    "grpo": ["kl=fixed"],
    # DAPO token mean, micro-batches that split groups, exact KL and an entropy bonus
    "dapo_micro_full_kl": ["algorithm=dapo", "kl=fixed", "micro_batch=4",
                           "algorithm.kl_estimator=full", "algorithm.entropy_coef=0.01"],
    # filtered sampling and early end-of-text
    "top_k_top_p": ["kl=fixed", "sampler.top_k=12", "sampler.top_p=0.9",
                    "sampler.temperature=1.0"],
}


class DistinctCharsReward(Reward):
    """Varies within groups on a random model: distinct characters / 16 (mechanics only)."""

    range = (0.0, 6.0)

    def __call__(self, sample, completion):
        return Scored(len(set(completion)) / 16, {"distinct": float(len(set(completion)))})


def _run(overrides: list[str]) -> dict:
    cfg = compose(overrides)
    parts = build_parts(cfg)
    torch.manual_seed(cfg.seed)
    engine = build_engine(cfg, parts, DistinctCharsReward())
    train = read_samples(cfg.data.train)
    pools = {t: [s for s in train if s.task == t] for t in "PA"}
    out = {"steps": []}
    for step in range(cfg.steps):
        batch = engine.rollout(parts.task_mix.draw(pools, cfg.prompts_per_step, step, cfg.seed),
                               step)
        sampled = batch.rollout.logprobs.clone()  # the sampler's (several iterations replace them)
        m = engine.update(batch, step)
        r = batch.rollout
        out["steps"].append({
            "completion_ids": r.completion_ids.tolist(),
            "completion_mask": r.completion_mask.tolist(),
            "prompt_ids": r.prompt_ids.tolist(),
            # each row's prompt without its left padding: the padded width is a setting
            # (sampler.pad_to_multiple_of), not part of the sample
            "prompts": [ids[m.bool()].tolist() for ids, m in zip(r.prompt_ids, r.prompt_mask)],
            "logprobs": sampled.tolist(),
            "ref_logprobs": batch.ref_logprobs.tolist(),
            "rewards": batch.rewards.tolist(),
            "metrics": {k: m[k] for k in sorted(m) if k.split("/")[0] in ("loss", "kl", "policy")
                        or k == "optim/grad_norm"},
        })
    out["param_abs_sum"] = float(sum(p.detach().double().abs().sum()
                                     for p in engine.model.parameters()))
    return out


@pytest.fixture
def overrides(tiny_overrides):
    return tiny_overrides + ["prompts_per_step=3", "num_generations=3", "optim.lr=1e-2",
                             "sampler.temperature=1.5", "sampler.max_new_tokens=16",
                             "sampler.per_task.A.max_new_tokens=16"]


@pytest.mark.parametrize("backend", ["fast_gpt2", "hf"])
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_same_seed_same_samples_and_losses_as_the_plain_engine(name, backend, overrides):
    if RECORD and backend != "hf":
        pytest.skip("the golden file is the plain engine's (backend=hf)")
    got = _run(overrides + SCENARIOS[name] + [f"backend={backend}"])
    if RECORD:
        golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
        golden[name] = got
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(golden, indent=0, sort_keys=True))
        pytest.skip("recorded")
    want = json.loads(GOLDEN.read_text())[name]
    assert len(got["steps"]) == len(want["steps"]) == 2
    for step, (g, w) in enumerate(zip(got["steps"], want["steps"])):
        for got_prompt, want_ids in zip(g["prompts"], w["prompt_ids"], strict=True):
            pads = len(want_ids) - len(got_prompt)
            assert want_ids[pads:] == got_prompt and set(want_ids[:pads]) <= {0}, \
                f"step {step}: prompt changed"  # 0: the char tokenizer's end-of-text (pad)
        for key in ("completion_ids", "completion_mask"):
            assert g[key] == w[key], f"step {step}: {key} changed"
        for key in ("logprobs", "ref_logprobs", "rewards"):
            assert torch.allclose(torch.tensor(g[key]), torch.tensor(w[key]), atol=2e-5), \
                f"step {step}: {key}"
        assert w["metrics"].keys() <= g["metrics"].keys()  # later metrics may be added
        for k, v in w["metrics"].items():
            if k == "loss/kl_share":  # |kl| / (|policy| + |kl|): loss/policy is ~1e-8 rounding
                continue              # noise here (advantages sum to 0), so the share is too
            assert g["metrics"][k] == pytest.approx(v, rel=1e-4, abs=1e-6), f"step {step}: {k}"
    assert got["param_abs_sum"] == pytest.approx(want["param_abs_sum"], rel=1e-6)
