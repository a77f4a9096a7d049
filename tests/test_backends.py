"""The policy backends: hf agrees with fast_gpt2 on the same GPT-2 weights; tiny GPT-2,
Llama and Qwen2 models train, checkpoint and resume exactly through model=hf; models
rookworld cannot run safely are refused before any weight is read."""

import json

import pytest
import torch
from test_engine import LengthReward
from test_faults import STATEFUL, assert_same_run, crash_at

from rookworld import backends
from rookworld.backends.fast_gpt2 import FastGPT2
from rookworld.backends.hf import HFBackend
from rookworld.backends.hub import load_hf
from rookworld.config import ConfigError, compose, instantiate
from rookworld.data.load import read_samples
from rookworld.policy import build_char_tokenizer, build_random, save_policy
from rookworld.sampling import SamplingSettings
from rookworld.train import build_engine, build_parts, resolve_resume, run

TINY_GPT2 = dict(n_layer=2, n_embd=32, n_head=2, n_positions=320)  # conftest.TINY's model


@pytest.fixture
def gpt2_dir(tmp_path):
    """conftest.TINY's random GPT-2 (seed 0) in the hub layout."""
    save_policy(build_random(**TINY_GPT2), tmp_path / "gpt2")
    return tmp_path / "gpt2"


def test_auto_picks_fast_gpt2_for_rookworlds_gpt2_on_cpu_and_hf_otherwise(gpt2_dir):
    own = build_random(**TINY_GPT2).model
    assert backends.resolve("auto", own, "cpu").name == "fast_gpt2"
    assert backends.resolve("auto", own, "cuda").name == "hf"
    hf = load_hf(str(gpt2_dir)).model
    assert backends.resolve("auto", hf, "cpu").name == "hf"
    with pytest.raises(ValueError, match="fast_gpt2 runs rookworld's own GPT-2"):
        backends.resolve("fast_gpt2", hf, "cpu")
    # bf16 on the CPU: fast_gpt2 takes it as bf16 products; on a GPU it is hf's
    assert backends.resolve("auto", own, "cpu", torch.bfloat16).name == "fast_gpt2"
    with pytest.raises(ValueError, match="CPU only"):
        backends.resolve("fast_gpt2", own, "cuda", torch.bfloat16)


@pytest.mark.parametrize("overrides,key", [
    (["backend=vllm"], "backend must be"),
    (["model=hf", "model.path=x/y", "backend=fast_gpt2"], "backend=fast_gpt2"),
    (["model=hf", "model.path=x/y", "recompute_activations=true"], "recompute_activations"),
    (["autocast=fp16"], "autocast must be"),
    (["device=cuda", "recompute_activations=true"], "recompute_activations"),
    (["backend=fast_gpt2", "autocast=bf16", "device=cuda"], "CPU only"),
])
def test_backend_settings_fail_before_any_model(overrides, key):
    with pytest.raises(ConfigError, match=key):
        build_parts(compose(overrides))


def test_hf_sampling_follows_the_fast_samplers_conventions(gpt2_dir):
    """Same tokens under the same generator (left-padded prompts of several lengths), and
    each sampled token's log-prob is that of logits / temperature, which the teacher-forced
    pass gives again (also while min_new_tokens holds end-of-text back)."""
    own, hf_policy = build_random(**TINY_GPT2), load_hf(str(gpt2_dir))
    fast, hf = FastGPT2(), HFBackend()
    prompts = [own.encode_prompt(s) for s in ("e2e4 ", "a much longer prompt: ", "x")] * 2
    for settings in (SamplingSettings(temperature=0.0, max_new_tokens=12),
                     SamplingSettings(temperature=1.5, top_k=20, max_new_tokens=12,
                                      min_new_tokens=3)):
        a = fast.sample(own.model, prompts, settings, own.eos_id, torch.Generator().manual_seed(1))
        b = hf.sample(hf_policy.model, prompts, settings, own.eos_id,
                      torch.Generator().manual_seed(1))
        assert torch.equal(a.completion_ids, b.completion_ids)
        assert torch.equal(a.completion_mask, b.completion_mask)
        torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=0)
        temps = torch.full((len(prompts),), settings.temperature or 1.0)
        again = hf.logprobs(hf_policy.model, b.prompt_ids, b.prompt_mask, b.completion_ids,
                            temps, micro_batch=4) * b.completion_mask
        torch.testing.assert_close(again, b.logprobs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("estimator", ["k3", "full_forward"])
def test_hf_gives_the_fast_paths_logprobs_and_loss_gradient(tiny_overrides, gpt2_dir,
                                                            estimator):
    """Two engines, one GPT-2 (rookworld's class, and transformers' loaded from its saved
    copy), the policy moved away from the reference: the same completions give the same
    reference log-probs and the same gradient of the GRPO loss (policy, entropy, KL)."""
    common = ["sampler.temperature=1.5", "kl=fixed", "kl.beta=0.5", "algorithm.entropy_coef=0.01",
              f"algorithm.kl_estimator={estimator}"]
    engines, no_model = {}, [o for o in tiny_overrides if not o.startswith("model")]
    for name, base in (("fast_gpt2", tiny_overrides),
                       ("hf", no_model + ["model=hf", f"model.path={gpt2_dir}"])):
        cfg = compose(base + common)
        engines[name] = build_engine(cfg, build_parts(cfg), LengthReward())
    fast, hf = engines["fast_gpt2"], engines["hf"]
    assert (fast.backend.name, hf.backend.name) == ("fast_gpt2", "hf")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        params = dict(hf.model.named_parameters())
        for name, p in fast.model.named_parameters():
            noise = torch.randn(p.shape, generator=gen) * 0.02
            p.add_(noise)
            params[name].add_(noise)
    train = read_samples(cfg.data.train)
    b = fast.rollout(build_parts(cfg).task_mix.draw(
        {t: [s for s in train if s.task == t] for t in "PA"}, 2, 0, 0), 0)
    n = b.rollout.completion_ids.shape[0]
    b.advantages = torch.linspace(-1, 1, n)
    torch.testing.assert_close(hf.logprobs(hf.ref, b.rollout, b.temperature), b.ref_logprobs,
                               atol=1e-5, rtol=0)
    grads, losses = {}, {}
    for name, e in engines.items():
        e.optimizer.zero_grad(set_to_none=True)
        loss, parts = e.chunk_loss(b, slice(0, n), beta=0.5)
        loss.backward()
        losses[name] = {k: float(v) for k, v in parts.items()}
        grads[name] = {k: p.grad for k, p in e.model.named_parameters()}
    assert losses["hf"].keys() == losses["fast_gpt2"].keys()
    for k, v in losses["fast_gpt2"].items():
        assert losses["hf"][k] == pytest.approx(v, rel=1e-4, abs=1e-6), k
    assert grads["hf"].keys() == grads["fast_gpt2"].keys()
    for k, g in grads["fast_gpt2"].items():
        torch.testing.assert_close(grads["hf"][k], g, atol=1e-6, rtol=1e-4, msg=k)


def test_bf16_autocast_runs_the_matrix_products_in_bf16_over_float32_weights(tiny_overrides):
    """autocast=bf16 on CPU under the hf backend: the weights and optimiser stay float32,
    the policy ratio starts at 1, and the reference log-probs move by bf16 rounding only."""
    cfg = compose(tiny_overrides + ["backend=hf"])
    engines = {amp: build_engine(c, build_parts(c), LengthReward())
               for amp, c in (("off", cfg),
                              ("bf16", compose(tiny_overrides + ["backend=hf", "autocast=bf16"])))}
    e = engines["bf16"]
    assert (e.backend.name, e.amp) == ("hf", torch.bfloat16)
    assert engines["off"].amp is None
    train = read_samples(cfg.data.train)
    b = e.rollout(build_parts(cfg).task_mix.draw(
        {t: [s for s in train if s.task == t] for t in "PA"}, 2, 0, 0), 0)
    m = e.update(b, 0)
    assert all(p.dtype == torch.float32 for p in e.model.parameters())
    assert torch.isfinite(torch.tensor(m["loss/total"])) and m["optim/grad_norm"] > 0
    # the old log-probs come from the update's own teacher-forced pass: the ratio starts at 1
    assert m["policy/ratio_max"] == pytest.approx(1.0, abs=1e-4)
    exact = engines["off"].logprobs(engines["off"].ref, b.rollout, b.temperature)
    mixed = e.logprobs(e.ref, b.rollout, b.temperature)
    diff = (mixed - exact).abs().max()
    assert 0 < diff < 0.25, diff  # bf16 has 8 bits of mantissa: not exact, not far


def _tiny_family(kind: str, directory):
    """A random model of a few tens of thousands of parameters with the character tokenizer,
    saved in shards of 20 KB with their index."""
    from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, Qwen2Config

    tok = build_char_tokenizer()
    ids = dict(vocab_size=len(tok), bos_token_id=0, eos_token_id=0, pad_token_id=0)
    small = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=320)
    config = {"gpt2": lambda: GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=320, **ids),
              "llama": lambda: LlamaConfig(**small, **ids),
              "qwen2": lambda: Qwen2Config(**small, **ids)}[kind]()
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(directory, max_shard_size="20KB")
    tok.save_pretrained(directory)


@pytest.mark.parametrize("kind", ["gpt2", "llama", "qwen2"])
def test_a_family_trains_checkpoints_and_resumes_exactly(kind, tiny_overrides, tmp_path,
                                                         monkeypatch, spread_rewards):
    _tiny_family(kind, tmp_path / "model")
    assert (tmp_path / "model" / "model.safetensors.index.json").exists()  # sharded
    model = ["model=hf", f"model.path={tmp_path / 'model'}"]
    overrides = [o for o in tiny_overrides if not o.startswith("model")] + model + STATEFUL \
        + ["steps=3", "eval_every=3", "anchor.coef=0.5"]  # the anchor's loss runs it too
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert run(compose(overrides), whole).outcome.status == "success"
    saved = (whole / "run_config.yaml").read_text()
    assert "backend: hf" in saved and "micro_batch_tokens: 4096" in saved  # auto, resolved
    crash_at(monkeypatch, 2, lambda: run(compose(overrides), cut))
    args = overrides + [f"resume={cut}"]
    resumed, run_dir = resolve_resume(compose(args), args)
    assert run(resumed, run_dir).outcome.status == "success"
    assert_same_run(whole, cut)
    start = load_hf(str(tmp_path / "model")).model.state_dict()
    end = load_hf(str(whole / "checkpoints" / "step-000003" / "model")).model.state_dict()
    assert any(not torch.equal(start[k], end[k]) for k in start)  # the weights moved


def _refused(directory, **kwargs) -> str:
    with pytest.raises(ValueError) as e:  # UnsupportedModel, named again by instantiate
        instantiate(compose(["model=hf", f"model.path={directory}"]
                            + [f"model.{k}={v}" for k, v in kwargs.items()]).model)
    return str(e.value)


def test_unsupported_models_are_refused_before_any_weight_is_read(tmp_path):
    """The weight files hold garbage: reading them would fail differently."""
    import json
    bert, pickled = tmp_path / "bert", tmp_path / "pickled"
    for d in (bert, pickled):
        d.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (bert / "model.safetensors").write_bytes(b"not weights")
    assert "model_type 'bert' is not a decoder-only causal LM" in _refused(bert)
    (pickled / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (pickled / "pytorch_model.bin").write_bytes(b"not weights")
    assert "no safetensors weights" in _refused(pickled)
    assert "trust_remote_code=true is refused" in _refused(pickled, trust_remote_code="true")
    (bert / "config.json").write_text(json.dumps({"model_type": "mine", "auto_map": {}}))
    assert "model_type 'mine'" in _refused(bert)


def test_train_refuses_an_unsupported_model_before_it_loads_data_or_writes(tmp_path):
    import json
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (bert / "model.safetensors").write_bytes(b"not weights")
    with pytest.raises(ConfigError, match="model_type 'bert' is not a decoder-only"):
        run(compose(["model=hf", f"model.path={bert}", "logger=none"]), tmp_path / "run")
    assert not (tmp_path / "run").exists()  # no data check, no run directory


def test_a_hub_model_is_checked_from_its_config_and_index_before_any_download(tmp_path,
                                                                            monkeypatch):
    """Only config.json and the shard index are fetched before the refusal; the snapshot
    (weights) is never asked for."""
    import json

    import huggingface_hub
    from huggingface_hub.errors import EntryNotFoundError

    from rookworld.backends.hub import preflight

    fetched = []
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))

    def download(repo, name, **kwargs):
        fetched.append(name)
        if name != "config.json":
            raise EntryNotFoundError(f"{repo} has no {name}")
        return str(tmp_path / name)

    def no_snapshot(*a, **k):
        raise AssertionError("weights fetched before the preflight passed")
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    monkeypatch.setattr(huggingface_hub, "file_exists", lambda repo, name, **k: False)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_snapshot)
    with pytest.raises(ValueError, match="no safetensors weights"):
        preflight("someone/pickled-model")
    assert fetched == ["config.json", "model.safetensors.index.json"]


def test_a_saved_model_carries_no_trace_of_how_it_was_loaded(gpt2_dir, tmp_path):
    # loaded from a local directory, transformers notes is_local / local_files_only in
    # the tokenizer's kwargs: facts of that load, not of the model
    save_policy(load_hf(str(gpt2_dir)), tmp_path / "again")
    saved = json.loads((tmp_path / "again" / "tokenizer_config.json").read_text())
    assert saved["eos_token"] == "<|endoftext|>"
    assert not saved.keys() & {"is_local", "local_files_only"}
    assert load_hf(str(tmp_path / "again")).tokenizer("P: ")["input_ids"]
