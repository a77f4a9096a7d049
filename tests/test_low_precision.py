"""bf16 products in the fast GPT-2 (`autocast=bf16` on the CPU): float32 in and out, values
and gradients within bfloat16's rounding of the float32 ones, evaluations left in float32."""

import pytest
import torch

from rookworld import precision
from rookworld.backends.fast_gpt2.matmul import low_precision
from rookworld.config import compose
from rookworld.train import build_engine, build_parts
from tests.test_engine import LengthReward

pytestmark = pytest.mark.usefixtures("cpu_matmul")
native = pytest.mark.skipif(not precision.cpu_has_native_bf16(),
                            reason="bf16 products need a CPU with AVX512-BF16 or AMX")


def test_bf16_is_refused_on_a_cpu_without_native_bf16_and_auto_keeps_float32(
        tiny_overrides, monkeypatch):
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    assert precision.products_dtype("auto", "cpu") is None
    cfg = compose(tiny_overrides + ["backend=fast_gpt2", "autocast=bf16"])
    with pytest.raises(ValueError, match="needs a CPU with native bf16.*autocast=auto or off"):
        build_engine(cfg, build_parts(cfg), LengthReward())


@pytest.mark.parametrize("vendor, flags, auto", [
    ("AuthenticAMD", "avx2 avx512f avx512_bf16", torch.bfloat16),  # bf16 over twice as fast
    ("GenuineIntel", "avx2 avx512f avx512_bf16", None),  # slower than float32 without AMX
    ("GenuineIntel", "avx512f avx512_bf16 amx_bf16 amx_tile", torch.bfloat16),  # AMX tiles
    ("AuthenticAMD", "avx2 fma", None),  # no bf16 instructions: emulated
])
def test_auto_takes_bf16_products_only_where_they_beat_float32(monkeypatch, vendor, flags, auto):
    info = {"vendor_id": vendor, "flags": flags}
    monkeypatch.setattr(precision, "cpuinfo", lambda field: info.get(field, ""))
    assert precision.products_dtype("auto", "cpu") == auto
    assert precision.products_dtype("off", "cpu") is None
    if "bf16" in flags:  # asked for, bf16 runs wherever the instructions exist
        assert precision.products_dtype("bf16", "cpu") == torch.bfloat16


@native
@pytest.mark.parametrize("gelu", [False, True])
def test_products_run_in_bf16_and_hand_back_float32(gelu):
    from rookworld.backends.fast_gpt2.matmul import linear

    torch.manual_seed(0)
    x, w, b = torch.randn(96, 64), torch.randn(64, 48) / 8, torch.randn(48)
    with torch.no_grad():
        exact = linear(x, w, b, gelu=gelu)
        with low_precision(torch.bfloat16):
            low = linear(x, w, b, gelu=gelu)
    assert low.dtype == torch.float32
    assert not torch.equal(low, exact)  # the products did run in bf16
    assert torch.allclose(low, exact, atol=0.05, rtol=0.02)


@native
def test_the_engine_samples_and_scores_in_bf16_within_its_rounding(tiny_overrides):
    from rookworld.backends.fast_gpt2 import matmul
    from rookworld.data.load import read_samples

    cfg = compose(tiny_overrides + ["backend=fast_gpt2", "autocast=bf16", "kl=fixed"])
    parts = build_parts(cfg)
    engine = build_engine(cfg, parts, LengthReward())
    assert engine.amp is None and engine.products == torch.bfloat16
    pools = {t: [s for s in read_samples(cfg.data.train) if s.task == t] for t in "PA"}
    with low_precision(engine.products):
        assert matmul.LOW == torch.bfloat16
        batch = engine.rollout(parts.task_mix.draw(pools, 2, 0, 0), 0)
        low = engine.logprobs(engine.model, batch.rollout, batch.temperature)
        m = engine.update(batch, 0)
    assert matmul.LOW is None  # the context restores float32 products
    assert torch.isfinite(torch.tensor(m["loss/total"]))
    exact = engine.logprobs(engine.ref, batch.rollout, batch.temperature)  # the start, float32
    with low_precision(engine.products):
        ref_low = engine.logprobs(engine.ref, batch.rollout, batch.temperature)
    mask = batch.rollout.completion_mask.bool()
    assert not torch.equal(ref_low[mask], exact[mask])
    assert torch.allclose(ref_low[mask], exact[mask], atol=0.1)
    # the sampler's log-probs are a bf16 forward's too: the update's teacher-forced pass
    # agrees to bf16 rounding (a policy ratio within 1% of 1), float32 would be far closer
    assert torch.allclose(batch.rollout.logprobs[mask], low[mask], atol=0.01)


@native
@pytest.mark.parametrize("algorithm", ["grpo", "gspo"])
def test_with_bf16_products_the_first_update_starts_at_ratio_one(tiny_overrides, algorithm):
    """The sampler's cached one-token steps and the update's teacher-forced pass round bf16
    products apart; the first iteration takes its old log-probs from its own forward, so
    the ratio is exactly 1 and GSPO's tight clip does not act before the policy moves."""
    from rookworld.data.load import read_samples

    cfg = compose(tiny_overrides + ["backend=fast_gpt2", "autocast=bf16", "rollout_tape_mib=0",
                                    f"algorithm={algorithm}", "sampler.temperature=1.0"])
    parts = build_parts(cfg)
    engine = build_engine(cfg, parts, LengthReward())
    pools = {t: [s for s in read_samples(cfg.data.train) if s.task == t] for t in "PA"}
    with low_precision(engine.products):
        batch = engine.rollout(parts.task_mix.draw(pools, 2, 0, 0), 0)
        sampled = batch.rollout.logprobs.clone()
        teacher = engine.logprobs(engine.model, batch.rollout, batch.temperature)
        m = engine.update(batch, 0)
    mask = batch.rollout.completion_mask.bool()
    assert not torch.equal(sampled[mask], teacher[mask])  # the two passes do round apart
    assert m["policy/ratio_max"] == 1.0 and m["policy/ratio_mean"] == 1.0
    assert m["policy/clip_frac_low"] == m["policy/clip_frac_high"] == 0.0


@native
def test_with_bf16_products_ppos_kl_in_the_rewards_starts_at_zero(tiny_overrides):
    """Under kl_penalty=reward the rollout's policy log-probs meet the reference's in the
    rewards: both come from a teacher-forced pass, so before any step they are equal (the
    sampler's cached one-token steps round bf16 products apart from it)."""
    from rookworld.data.load import read_samples

    cfg = compose(tiny_overrides + ["backend=fast_gpt2", "autocast=bf16", "algorithm=ppo",
                                    "algorithm.critic.kl_penalty=reward", "kl=fixed",
                                    "sampler.temperature=1.0"])
    parts = build_parts(cfg)
    engine = build_engine(cfg, parts, LengthReward())
    assert engine.amp is None and engine.products == torch.bfloat16
    pools = {t: [s for s in read_samples(cfg.data.train) if s.task == t] for t in "PA"}
    with low_precision(engine.products):
        batch = engine.rollout(parts.task_mix.draw(pools, 2, 0, 0), 0)
    mask = batch.rollout.completion_mask.bool()
    assert torch.equal(batch.rollout.logprobs[mask], batch.ref_logprobs[mask])


@native
def test_a_run_updates_in_bf16_and_evaluates_in_float32(tiny_overrides, tmp_path, monkeypatch):
    from rookworld import train
    from rookworld.backends.fast_gpt2 import matmul
    from rookworld.engine import GRPOEngine

    seen = {"update": [], "evaluate": []}
    update, evaluate = GRPOEngine.update, train.evaluate

    def watched_update(self, *a, **k):
        seen["update"].append(matmul.LOW)
        return update(self, *a, **k)

    def watched_evaluate(*a, **k):
        seen["evaluate"].append(matmul.LOW)
        return evaluate(*a, **k)

    monkeypatch.setattr(GRPOEngine, "update", watched_update)
    monkeypatch.setattr(train, "evaluate", watched_evaluate)
    result = train.run(compose(tiny_overrides + ["autocast=bf16"]), tmp_path)
    assert result.outcome.status == "success"
    assert seen == {"update": [torch.bfloat16] * 2, "evaluate": [None, None]}
    assert "autocast: bf16" in (tmp_path / "run_config.yaml").read_text()
