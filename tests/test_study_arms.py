"""The learning study's TRL arm samples from the model it trains: transformers' generate on
the wrapped GPT-2 gives rookworld's own greedy completions for left-padded prompts."""

import torch

from rookworld.config import compose, instantiate
from rookworld.data.load import read_samples
from rookworld.held_out import Evaluator
from rookworld.policy import EMBEDDED_DIR, load_embedded


def test_wrapped_generate_matches_rookworld_greedy_under_left_padding(experiment_script):
    from transformers import AutoTokenizer, GPT2LMHeadModel

    cfg = compose([])
    samples = [s for s in read_samples(cfg.data.eval) if s.task == "P"][:8]
    truth = Evaluator(samples, instantiate(cfg.sampler)).completions(load_embedded(), "P")
    model = GPT2LMHeadModel.from_pretrained(str(EMBEDDED_DIR)).eval()
    tok = AutoTokenizer.from_pretrained(str(EMBEDDED_DIR))
    tok.padding_side = "left"
    enc = tok([s.prompt for s in samples], return_tensors="pt", padding=True)
    assert len(set(enc["attention_mask"].sum(1).tolist())) > 1  # the batch is padded
    experiment_script("learning/trl_arm.py").derive_positions(model)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=150, do_sample=False,
                             pad_token_id=tok.pad_token_id)
    width = enc["input_ids"].shape[1]
    got = [tok.decode(o[width:], skip_special_tokens=True) for o in out]
    assert [g.strip() for g in got] == [t.strip() for t in truth]
