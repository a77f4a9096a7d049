"""rookworld's GPT-2 container against transformers' GPT2LMHeadModel: the same random
weights for a seed, the same logits, checkpoints that either library reads from the other;
and training without importing transformers' model classes at all."""

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import GPT2Config as HFConfig
from transformers import GPT2LMHeadModel as HFModel

from rookworld.gpt2 import GPT2Config, GPT2LMHeadModel

SHAPES = [dict(vocab_size=96, n_positions=64, n_embd=32, n_layer=2, n_head=2),
          dict(vocab_size=50, n_positions=40, n_embd=48, n_layer=3, n_head=4, n_inner=80)]


def _batch(vocab: int):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, vocab, (3, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # left padding
    mask[2, :7] = 0
    return ids, mask


@pytest.mark.parametrize("shape", SHAPES)
def test_same_seed_same_weights_as_transformers(shape):
    torch.manual_seed(11)
    theirs = HFModel(HFConfig(**shape))
    after_theirs = torch.random.get_rng_state()
    torch.manual_seed(11)
    ours = GPT2LMHeadModel(GPT2Config(**shape)).init_weights_()
    assert torch.equal(torch.random.get_rng_state(), after_theirs)  # same draws, same order
    want = theirs.state_dict()
    got = ours.state_dict()
    assert set(got) <= set(want) | {"lm_head.weight"}
    for k, v in got.items():
        assert torch.equal(v, want[k]), k
    assert ours.lm_head.weight is ours.transformer.wte.weight


@pytest.mark.parametrize("shape", SHAPES)
def test_checkpoints_go_both_ways_with_the_same_logits(tmp_path, shape):
    torch.manual_seed(0)
    ours = GPT2LMHeadModel(GPT2Config(**shape)).init_weights_().eval()
    ours.save_pretrained(tmp_path / "ours")
    theirs = HFModel.from_pretrained(tmp_path / "ours").eval()
    ids, mask = _batch(shape["vocab_size"])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        want = theirs(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        got = ours(ids, mask).logits
    real = mask.bool()  # padding positions are undefined in both
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=1e-5)
    theirs.save_pretrained(tmp_path / "theirs")
    back = GPT2LMHeadModel.from_pretrained(tmp_path / "theirs")
    for k, v in ours.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    # the tied output matrix is stored once, as transformers stores it
    assert "lm_head.weight" not in load_file(str(tmp_path / "ours" / "model.safetensors"))


def test_untied_output_matrix_round_trips(tmp_path):
    torch.manual_seed(0)
    m = GPT2LMHeadModel(GPT2Config(**SHAPES[0], tie_word_embeddings=False)).init_weights_()
    assert m.lm_head.weight is not m.transformer.wte.weight
    m.save_pretrained(tmp_path)
    back = GPT2LMHeadModel.from_pretrained(tmp_path)
    assert torch.equal(back.lm_head.weight, m.lm_head.weight)
    assert not torch.equal(back.lm_head.weight, back.transformer.wte.weight)


def test_original_gpt2_key_names_and_mask_buffers_load(tmp_path):
    """OpenAI's GPT-2 exports name keys without `transformer.` and carry causal-mask
    buffers; both load (the buffers are dropped)."""
    torch.manual_seed(0)
    m = GPT2LMHeadModel(GPT2Config(**SHAPES[0])).init_weights_()
    m.save_pretrained(tmp_path)
    sd = load_file(str(tmp_path / "model.safetensors"))
    old = {k.removeprefix("transformer."): v for k, v in sd.items()}
    old["h.0.attn.bias"] = torch.ones(1, 1, 64, 64)
    save_file(old, str(tmp_path / "model.safetensors"))
    back = GPT2LMHeadModel.from_pretrained(tmp_path)
    assert torch.equal(back.transformer.h[1].mlp.c_proj.weight,
                       m.transformer.h[1].mlp.c_proj.weight)


def test_bad_checkpoints_are_refused_with_their_reason(tmp_path):
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(**SHAPES[0])).init_weights_().save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(cfg | {"n_embd": 48}))
    with pytest.raises(ValueError, match="wrong shape"):
        GPT2LMHeadModel.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(cfg | {"model_type": "llama"}))
    with pytest.raises(ValueError, match="GPT-2 checkpoints only"):
        GPT2LMHeadModel.from_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(OSError, match="safetensors only"):
        GPT2LMHeadModel.from_pretrained(tmp_path)


def test_a_grpo_step_imports_no_model_classes_or_compiler(tiny_overrides):
    """A rollout and an update load neither transformers.modeling_utils nor torch's compiler
    stack (torch._dynamo, sympy; `optim.FusedAdamW`, `tape.backward_with`): what that saves
    a GRPO process is in benchmarks/README.md."""
    code = f"""
import sys
from rookworld.config import compose, instantiate
from rookworld.data.load import read_samples
from rookworld.train import build_engine, build_parts
cfg = compose({tiny_overrides!r})
engine = build_engine(cfg, build_parts(cfg), instantiate(cfg.reward))
batch = engine.rollout(read_samples(cfg.data.train)[:2], 0)
engine.update(batch, 0)
print([m for m in ("transformers.modeling_utils", "torch._dynamo", "sympy") if m in sys.modules])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
