"""The GPU path: device=cuda runs policy and reference there with bf16 autocast where the
device supports it, the reference can sit on a device of its own, and float32 on the GPU
gives the CPU's log-probs. Skipped on machines without CUDA."""

import json

import pytest
import torch
from test_engine import LengthReward

from rookworld.config import compose
from rookworld.data.load import read_samples
from rookworld.train import build_engine, build_parts, run

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _batch(engine, cfg):
    train = read_samples(cfg.data.train)
    pools = {t: [s for s in train if s.task == t] for t in "PA"}
    return engine.rollout(build_parts(cfg).task_mix.draw(pools, 2, 0, 0), 0)


def test_a_cuda_run_uses_the_hf_backend_with_bf16_autocast_and_records_both(tiny_overrides,
                                                                             tmp_path):
    cfg = compose(tiny_overrides + ["device=cuda", "eval_every=2"])
    result = run(cfg, tmp_path / "run")
    assert result.outcome.status == "success"
    saved = (tmp_path / "run" / "run_config.yaml").read_text()
    assert "backend: hf" in saved
    assert ("autocast: bf16" if torch.cuda.is_bf16_supported() else "autocast: off") in saved


def test_the_reference_runs_on_its_own_device(tiny_overrides):
    cfg = compose(tiny_overrides + ["device=cuda", "reference.device=cpu", "kl=fixed",
                                    "algorithm.kl_estimator=full_symmetric"])
    engine = build_engine(cfg, build_parts(cfg), LengthReward())
    assert next(engine.model.parameters()).device.type == "cuda"
    assert next(engine.ref.parameters()).device.type == "cpu"
    b = _batch(engine, cfg)
    assert b.ref_logprobs.device.type == "cuda"
    m = engine.update(b, 0)
    assert all(torch.isfinite(torch.tensor(m[k])) for k in ("loss/total", "kl/full_symmetric"))


@pytest.mark.parametrize("kind", ["head", "model"])
def test_ppo_trains_its_critic_on_the_gpu(tiny_overrides, kind):
    cfg = compose(tiny_overrides + ["device=cuda", "algorithm=ppo", f"algorithm.critic.kind={kind}",
                                    "algorithm.critic.warmup_steps=0"])
    engine = build_engine(cfg, build_parts(cfg), LengthReward())
    assert next(engine.critic.head.parameters()).device.type == "cuda"
    b = _batch(engine, cfg)
    assert b.old_values.device.type == "cuda"
    m = engine.update(b, 0)
    assert all(torch.isfinite(torch.tensor(m[k])) for k in ("loss/total", "value/loss"))


def test_float32_on_the_gpu_gives_the_cpus_logprobs(tiny_overrides):
    engines = {}
    for device in ("cpu", "cuda"):
        cfg = compose(tiny_overrides + [f"device={device}", "backend=hf", "autocast=off"])
        engines[device] = build_engine(cfg, build_parts(cfg), LengthReward())
    b = _batch(engines["cpu"], cfg)
    r = b.rollout
    on_gpu = type(r)(*(x.cuda() if isinstance(x, torch.Tensor) else x for x in (
        r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask, r.logprobs,
        r.truncated)))
    gpu = engines["cuda"].logprobs(engines["cuda"].ref, on_gpu, b.temperature.cuda()).cpu()
    torch.testing.assert_close(gpu, b.ref_logprobs, atol=1e-4, rtol=0)



def test_pretraining_on_the_gpu_trains_evaluates_and_exports(tmp_path, synthetic_data):
    from test_pretrain import _pretrain

    train, held_out = synthetic_data
    _pretrain(tmp_path / "run", train, held_out, "steps=4", "curve_every=2", "device=cuda",
              f"export_to={tmp_path / 'model'}")
    report = json.loads((tmp_path / "run" / "pretrain_report.json").read_text())
    assert report["device"].startswith(torch.cuda.get_device_name())
    assert "eval/P/format" in report["eval"]["held_out"]
    assert "(host " in (tmp_path / "model" / "MODEL_CARD.md").read_text()
