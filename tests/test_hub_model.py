"""model=rookworld_lm_124m's code path, offline: a GPT-2-small-shaped model and a BPE
tokenizer built here, saved in the hub layout, loaded exactly as the hub model is."""

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

from rookworld.config import compose
from rookworld.policy import load_pretrained
from rookworld.rewards.graduated import GraduatedReward
from rookworld.train import build_engine, build_parts

EOS = "<|endoftext|>"


def bpe_tokenizer(texts, vocab_size=400) -> PreTrainedTokenizerFast:
    """Byte-level BPE like GPT-2's (end-of-text at the end of the base vocabulary) plus
    two added tokens past it, as RookWorld-LM-124M's export has (50259 vs 50257 rows)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS,
                                   unk_token=EOS)
    fast.add_special_tokens({"additional_special_tokens": ["<|pad0|>", "<|pad1|>"]})
    return fast


def save_hub_dir(tmp_path, synthetic_data, n_layer, n_embd, n_head):
    from rookworld.data.load import read_samples

    texts = [s.prompt + s.completion for s in read_samples(synthetic_data[0])][:400]
    tok = bpe_tokenizer(texts)
    n_vocab = tok.vocab_size  # embedding rows = base vocabulary; 2 added tokens lie beyond
    cfg = GPT2Config(vocab_size=n_vocab, n_positions=256, n_embd=n_embd, n_layer=n_layer,
                     n_head=n_head, eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id)
    assert cfg.resid_pdrop == 0.1  # the export's default dropout, which the loader must zero
    GPT2LMHeadModel(cfg).to(torch.bfloat16).save_pretrained(tmp_path, safe_serialization=True)
    tok.save_pretrained(tmp_path)
    return tok


def test_local_hub_layout_loads_with_dropout_off_fp32_and_bos(tmp_path, synthetic_data):
    tok = save_hub_dir(tmp_path, synthetic_data, 2, 64, 2)
    assert len(tok) == tok.vocab_size + 2
    policy = load_pretrained(str(tmp_path), bos_before_prompt=True)
    c = policy.model.config
    assert c.resid_pdrop == c.embd_pdrop == c.attn_pdrop == 0.0
    assert all(p.dtype == torch.float32 for p in policy.model.parameters())
    ids = policy.encode_prompt("P: 8/8/8/8/8/8/8/K6k w - - 0 1 ")
    assert ids[0] == policy.eos_id == tok.eos_token_id
    assert policy.tokenizer.padding_side == "left"
    assert policy.tokenizer.pad_token_id == policy.eos_id
    with pytest.raises(ValueError, match="beyond the model"):
        policy.encode_prompt("<|pad1|>")


def test_missing_model_path_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="model.path"):
        load_pretrained(str(tmp_path / "nope"))


def test_weights_cut_short_are_named_with_what_to_do(tmp_path):
    import shutil

    from rookworld.policy import EMBEDDED_DIR
    shutil.copytree(EMBEDDED_DIR, tmp_path / "model")
    weights = tmp_path / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100_000])
    with pytest.raises(ValueError, match="cannot be read .*damaged or cut short"):
        load_pretrained(str(tmp_path / "model"))


def test_an_uncached_hub_id_offline_names_the_settings_to_change(tmp_path, monkeypatch):
    from rookworld.backends.hub import check

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))  # nothing cached
    with pytest.raises(FileNotFoundError) as err:
        check(path="someone/no-such-model", local_files_only=True)
    message = str(err.value)
    assert "model.local_files_only" in message and "model.path" in message, message


@pytest.mark.slow
def test_gpt2_small_shape_grpo_step_through_the_config_path(tmp_path, synthetic_data,
                                                             tiny_overrides):
    save_hub_dir(tmp_path, synthetic_data, 12, 768, 12)
    overrides = [o for o in tiny_overrides if not o.startswith("model")] + [
        "model=rookworld_lm_124m", f"model.path={tmp_path}", "num_generations=2",
        "prompts_per_step=1", "sampler.max_new_tokens=8", "sampler.per_task.A.max_new_tokens=8"]
    cfg = compose(overrides)
    parts = build_parts(cfg)
    engine = build_engine(cfg, parts, GraduatedReward())
    assert sum(p.numel() for p in engine.model.parameters()) > 80_000_000
    from rookworld.data.load import read_samples
    pool = read_samples(cfg.data.train)
    batch = engine.rollout(pool[:1], 0)
    m = engine.update(batch, 0)
    assert torch.isfinite(torch.tensor(m["loss/total"]))
    assert abs(m["kl/k3"]) < 1e-5  # reference and policy agree at step 0: dropout is off


def test_a_model_directory_without_a_tokenizer_names_the_missing_file(tmp_path, synthetic_data):
    """Refused before AutoTokenizer (whose own error asks for sentencepiece or tiktoken), by
    each loader, naming the directory and the file; BPE files without tokenizer.json load."""
    from rookworld.backends.hub import check, load_hf
    from rookworld.errors import ConfigError
    from rookworld.policy import load_embedded

    tok = save_hub_dir(tmp_path, synthetic_data, 1, 32, 2)
    (tmp_path / "tokenizer.json").unlink()
    for load in (load_pretrained, load_embedded, load_hf, lambda p: check(path=p)):
        with pytest.raises(ConfigError, match=f"no tokenizer in {tmp_path}: tokenizer.json is "
                                              "missing"):
            load(str(tmp_path))
    # BPE files: not read by the tokenizer class that tokenizer_config.json names
    tok.backend_tokenizer.model.save(str(tmp_path))  # vocab.json and merges.txt
    with pytest.raises(ConfigError, match="names TokenizersBackend, which reads tokenizer.json"):
        load_pretrained(str(tmp_path))
    # without that file, GPT-2's own tokenizer reads them; half of them: the other is named
    (tmp_path / "tokenizer_config.json").unlink()
    merges = (tmp_path / "merges.txt").read_bytes()
    (tmp_path / "merges.txt").unlink()
    with pytest.raises(ConfigError, match=r"merges.txt is missing \(it holds vocab.json\)"):
        load_pretrained(str(tmp_path))
    (tmp_path / "merges.txt").write_bytes(merges)
    policy = load_pretrained(str(tmp_path))
    text = "P: 8/8/8/8/8/8/8/K6k w"
    assert policy.decode(policy.encode_prompt(text)) == text
