"""Policies: the embedded character-level GPT-2, random tiny GPT-2s, and hub/local
checkpoints such as RookWorld-LM-124M, all returned as one `Policy` bundle.

The model here is `gpt2.GPT2LMHeadModel` (the hub layout without transformers' model
classes; any other causal LM loads through `backends.hub.load_hf`); tokenizers are
transformers' fast tokenizers. Every loader sets dropout to 0 in the config
(the model has no dropout: policy and reference agree at step 0) and keeps weights in fp32
(load_hf: in model.dtype), which the optimiser steps directly; mixed precision is autocast
over float32 weights (`precision.py`).
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from .errors import ConfigError
from .files import is_hub_id
from .gpt2 import GPT2Config, GPT2LMHeadModel

EOS = "<|endoftext|>"
EMBEDDED_DIR = Path(__file__).parent / "assets" / "model"
# Every printable ASCII character: covers both task formats and keeps any text encodable.
CHAR_ALPHABET = string.printable[:95]
DROPOUT_KEYS = ("resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout")
# what a hub snapshot fetches: config, safetensors weights, tokenizer files
HUB_FILES = ["config.json", "generation_config.json", "*.safetensors", "tokenizer.json",
             "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
             "added_tokens.json"]
# the files a tokenizer that AutoTokenizer loads is made of, one set of them: the tokenizers
# library's serialisation; a byte-level BPE's vocabulary and merges (GPT-2, Qwen2); a
# sentencepiece or tiktoken model (Llama, Mistral, Gemma; XLNet's and XGLM's names)
TOKENIZER_FILES = (("tokenizer.json",), ("vocab.json", "merges.txt"), ("tokenizer.model",),
                   ("spiece.model",), ("sentencepiece.bpe.model",))
FAST_ONLY = {"TokenizersBackend", "PreTrainedTokenizerFast"}  # classes without a slow form


@dataclass
class Policy:
    """model: a causal LM in eval mode (rookworld's GPT-2 or a transformers model);
    tokenizer: HF fast tokenizer (left padding); bos_id: token put before every prompt
    (RookWorld-LM saw <|endoftext|> before each training document) or None; eos_id: stop
    token; backend: the `backends.Backend` that runs it (None: chosen by
    `backends.of`; the engine sets its own)."""

    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerFast
    eos_id: int
    bos_id: int | None = None
    source: Path | None = None  # the directory the weights were read from (None: built here)
    backend: object | None = None

    def encode_prompt(self, text: str) -> list[int]:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        n_embed = self.model.get_input_embeddings().num_embeddings
        if ids and max(ids) >= n_embed:
            raise ValueError(f"prompt {text[:40]!r}... encodes to token id {max(ids)} beyond the "
                             f"model's {n_embed} embeddings")
        return ([self.bos_id] if self.bos_id is not None else []) + ids

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def decode_completions(self, completion_ids, completion_mask) -> list[str]:
        """[N,T] sampled ids + mask -> N texts, the final end-of-text dropped."""
        texts = []
        for ids, n in zip(completion_ids.tolist(), completion_mask.sum(-1).tolist()):
            ids = ids[:int(n)]
            if ids and ids[-1] == self.eos_id:
                ids = ids[:-1]
            texts.append(self.tokenizer.decode(ids, skip_special_tokens=False))
        return texts


def build_char_tokenizer(alphabet: str = CHAR_ALPHABET) -> PreTrainedTokenizerFast:
    """One token per character, id 0 = <|endoftext|> (end of text and padding)."""
    vocab = {EOS: 0} | {c: i + 1 for i, c in enumerate(dict.fromkeys(alphabet))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=EOS))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS,
                                   bos_token=EOS, unk_token=EOS)
    fast.padding_side = "left"
    return fast


def _no_dropout(config) -> None:
    for key in DROPOUT_KEYS:
        if hasattr(config, key):
            setattr(config, key, 0.0)


def build_random(n_layer: int = 4, n_embd: int = 256, n_head: int = 4, n_positions: int = 384,
                 seed: int = 0) -> Policy:
    """A randomly initialised GPT-2 with the character tokenizer (tests, benchmarks)."""
    tok = build_char_tokenizer()
    config = GPT2Config(vocab_size=len(tok), n_positions=n_positions, n_embd=n_embd,
                        n_layer=n_layer, n_head=n_head, bos_token_id=0, eos_token_id=0,
                        pad_token_id=0, tie_word_embeddings=True)
    _no_dropout(config)
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config).init_weights_().eval()  # transformers' draws for the seed
    return Policy(model, tok, eos_id=tok.eos_token_id)


def load_pretrained(path: str, bos_before_prompt: bool = False, local_files_only: bool = False,
                    revision: str | None = None) -> Policy:
    """Load a GPT-2 and its tokenizer from a hub id or a local directory in the hub
    layout (config.json, model.safetensors, tokenizer files).

    A hub id is fetched into the hub cache first (`snapshot_download`, only the files
    named in HUB_FILES: never pickled weights or code). A local directory without a
    tokenizer (`check_tokenizer`) is a ConfigError naming the missing file. Dropout is set
    to 0; pad = eos; left padding; weights cast to fp32; the tokenizer must fit the
    embedding matrix.
    """
    from transformers import AutoTokenizer

    if Path(path).expanduser().exists():
        directory = Path(path).expanduser()
        check_tokenizer(directory, f"model.path={path}")
    elif not is_hub_id(path):
        raise FileNotFoundError(f"model.path={path!r}: no such directory, and not a hub id "
                                "(owner/name)")
    else:
        from huggingface_hub import snapshot_download

        directory = Path(snapshot_download(path, revision=revision, allow_patterns=HUB_FILES,
                                           local_files_only=local_files_only))
    tok = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    try:
        model = GPT2LMHeadModel.from_pretrained(directory, dtype=torch.float32)
    except SafetensorError as e:  # a file cut short or damaged on disk
        raise ValueError(f"model.path={path!r}: the weights in {directory} cannot be read "
                         f"({e}): the file is damaged or cut short; copy or export the model "
                         "again") from None
    _no_dropout(model.config)
    if tok.eos_token_id is None:
        raise ValueError(f"model.path={path!r}: tokenizer has no end-of-text token")
    tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    check_vocab(tok, model.get_input_embeddings().num_embeddings, path)
    bos = tok.eos_token_id if bos_before_prompt else None
    return Policy(model.float().eval(), tok, eos_id=tok.eos_token_id, bos_id=bos,
                  source=directory)


def check_tokenizer(directory: Path, where: str) -> None:
    """ConfigError naming the directory and the missing file(s) unless the local model
    directory holds one of the sets of TOKENIZER_FILES (tokenizer.json alone where its
    tokenizer_config.json names a class that reads only that, as the tokenizers this
    project saves do); checked before AutoTokenizer, whose own error for a missing
    tokenizer asks for sentencepiece or tiktoken instead."""
    directory = Path(directory)
    names = {f.name for f in directory.iterdir()} if directory.is_dir() else set()
    try:
        kind = json.loads((directory / "tokenizer_config.json").read_text()).get(
            "tokenizer_class")
    except (OSError, ValueError, AttributeError):  # none, or not a JSON object
        kind = None
    sets = (("tokenizer.json",),) if kind in FAST_ONLY else TOKENIZER_FILES
    if any(names.issuperset(files) for files in sets):
        return
    begun = next((files for files in sets if names & set(files)), None)
    missing = [f for f in begun if f not in names] if begun else ["tokenizer.json"]
    holds = f" (it holds {', '.join(sorted(names & set(begun)))})" if begun else ""
    needs = (f"its tokenizer_config.json names {kind}, which reads tokenizer.json only"
             if kind in FAST_ONLY else "a model directory needs tokenizer.json (or vocab.json "
             "with merges.txt, or tokenizer.model)")
    raise ConfigError(
        f"{where}: no tokenizer in {directory}: {' and '.join(missing)} "
        f"{'is' if len(missing) == 1 else 'are'} missing{holds}; {needs}: copy the model's "
        "tokenizer files there")


def check_vocab(tok, n_embed: int, path: str) -> None:
    """The tokenizer's base vocabulary and its end-of-text must fit the embedding matrix.

    Added tokens beyond it are tolerated (RookWorld-LM-124M's exported tokenizer has
    50259 entries for 50257 rows): they are never produced for task text, and
    `Policy.encode_prompt` refuses any id out of range instead of indexing past the end.
    """
    base = tok.vocab_size
    if base > n_embed or tok.eos_token_id >= n_embed:
        raise ValueError(f"model.path={path!r}: tokenizer vocabulary ({base} entries, "
                         f"end-of-text id {tok.eos_token_id}) does not fit the embedding "
                         f"matrix ({n_embed} rows)")


def load_embedded(path: str | None = None) -> Policy:
    """The model this project trains and ships (see rookworld/assets/model/MODEL_CARD.md)."""
    directory = Path(path) if path else EMBEDDED_DIR
    if not (directory / "config.json").exists():
        raise FileNotFoundError(
            f"embedded model not found at {directory}; "
            "build it with `python -m rookworld.pretrain`")
    check_tokenizer(directory, f"model.path={path}" if path else "the shipped model")
    return load_pretrained(str(directory))


LOAD_ONLY_KEYS = {"is_local", "local_files_only"}  # tokenizer kwargs of the load, not the model


def save_policy(policy: Policy, directory: str | Path) -> None:
    """Write weights (safetensors), config and tokenizer in the hub layout."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    policy.model.save_pretrained(directory, safe_serialization=True)
    policy.tokenizer.save_pretrained(directory)
    # transformers saves how this process loaded the tokenizer (from a local directory,
    # offline) among its settings; those are facts of the load, not of the model
    conf = directory / "tokenizer_config.json"
    if conf.exists():
        data = json.loads(conf.read_text())
        if data.keys() & LOAD_ONLY_KEYS:
            conf.write_text(json.dumps({k: v for k, v in data.items()
                                        if k not in LOAD_ONLY_KEYS}, indent=2) + "\n")
    from .files import apply_umask
    apply_umask(directory)
