"""Loading any transformers causal LM (`model=hf`), checked before any weight is read.

The preflight reads config.json (and, for sharded weights, model.safetensors.index.json)
only: the model type must be a causal LM that transformers itself implements, and the
weights safetensors (one file or shards with an index). Code from a model repository is
never run and pickled weights are never read.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..files import is_hub_id

SINGLE, INDEX = "model.safetensors", "model.safetensors.index.json"
# what a hub snapshot of an hf model fetches once the preflight passed
HUB_FILES = ["config.json", "generation_config.json", "model*.safetensors", INDEX,
             "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
             "vocab.json", "merges.txt", "added_tokens.json", "tokenizer.model"]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DROPOUT_KEYS = ("resid_pdrop", "embd_pdrop", "attn_pdrop", "attention_dropout",
                "hidden_dropout", "dropout", "summary_first_dropout")


class UnsupportedModel(ValueError):
    """A model rookworld refuses to load; the message names what is unsupported."""


def check_config(raw: dict, where: str) -> None:
    """config.json must name a decoder-only causal LM that transformers implements (no
    remote code). Encoders that transformers can also run as decoders (a type it
    implements as a masked LM too, such as bert) are refused."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    kind = raw.get("model_type")
    if kind not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or kind in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        extra = " (its auto_map asks for code from the repository, which rookworld never " \
                "runs)" if raw.get("auto_map") else ""
        raise UnsupportedModel(f"{where}: model_type {kind!r} is not a decoder-only causal LM "
                               f"that transformers implements (AutoModelForCausalLM){extra}")


def check_weights(names: set[str] | None, index: dict | None, where: str) -> None:
    """names: the files there (None: not listed, a hub repository with an index);
    index: model.safetensors.index.json's content or None."""
    if index is not None:
        shards = set(index.get("weight_map", {}).values())
        missing = sorted(shards - names) if names is not None else []
        if not shards or missing:
            raise UnsupportedModel(f"{where}: {INDEX} names no shards or shards that are "
                                   f"missing: {missing[:3]}")
        return
    if SINGLE not in names:
        found = sorted(n for n in names if n.endswith((".bin", ".pt", ".pth", ".ckpt",
                                                        ".safetensors")))
        raise UnsupportedModel(f"{where}: no safetensors weights ({SINGLE} or {INDEX}); "
                               f"found {found or 'no weight files'}. rookworld never loads "
                               "pickled weights: convert them to safetensors")


def preflight(path: str | None, local_files_only: bool = False, revision: str | None = None,
              fetch: bool = True) -> Path | None:
    """Check config and weight format (and, in a local directory, that a tokenizer is
    there), then return a local directory with the model (a hub id is fetched only once it
    passed; fetch=False: checked only, None returned). Raises UnsupportedModel, ConfigError
    or FileNotFoundError before any weight is downloaded or read."""
    if not path:
        raise UnsupportedModel("model.path is not set: give a hub id (owner/name) or a local "
                               "directory")
    local = Path(path).expanduser()
    if local.exists():
        cfg = local / "config.json"
        if not cfg.is_file():
            raise UnsupportedModel(f"model.path={path}: no config.json")
        check_config(json.loads(cfg.read_text()), f"model.path={path}")
        index = json.loads((local / INDEX).read_text()) if (local / INDEX).is_file() else None
        check_weights({f.name for f in local.iterdir()}, index, f"model.path={path}")
        from ..policy import check_tokenizer

        check_tokenizer(local, f"model.path={path}")  # ConfigError naming the missing file
        return local
    if not is_hub_id(path):
        raise FileNotFoundError(f"model.path={path!r}: no such directory, and not a hub id "
                                "(owner/name)")
    from huggingface_hub import hf_hub_download, snapshot_download
    from huggingface_hub.errors import EntryNotFoundError

    def one_file(name: str) -> Path:
        return Path(hf_hub_download(path, name, revision=revision,
                                    local_files_only=local_files_only))
    try:
        config = one_file("config.json")
    except Exception as e:  # not cached, no network, no such repository or revision
        raise FileNotFoundError(hub_error(path, local_files_only, e)) from e
    check_config(json.loads(config.read_text()), f"model.path={path}")
    try:
        index = json.loads(one_file(INDEX).read_text())
    except EntryNotFoundError:
        index = None
    names = None if index is not None else (
        {SINGLE} if _hub_has(path, SINGLE, revision, local_files_only) else set())
    check_weights(names, index, f"model.path={path}")
    if not fetch:
        return None
    return Path(snapshot_download(path, revision=revision, allow_patterns=HUB_FILES,
                                  local_files_only=local_files_only))


def hub_error(path: str, local_files_only: bool, error: Exception) -> str:
    """The message for a hub id whose files could not be had, naming the settings to change."""
    if local_files_only:
        return (f"model.path={path}: not in the local hub cache, and model.local_files_only="
                f"true forbids downloading it; download it once (huggingface-cli download "
                f"{path}), set model.local_files_only=false, or give a local directory in "
                "model.path")
    return (f"model.path={path}: the hub did not give its files ({type(error).__name__}: "
            f"{error}); check the id and model.revision, or give a local directory in "
            "model.path (model.local_files_only=true never asks the hub)")


def _hub_has(repo: str, name: str, revision: str | None, local_files_only: bool) -> bool:
    """Whether the hub repository holds file `name` (a metadata query, nothing fetched)."""
    if local_files_only:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo, name, revision=revision), str)
    from huggingface_hub import file_exists

    return file_exists(repo, name, revision=revision)


def check_settings(trust_remote_code: bool, dtype: str) -> None:
    """The model settings refused whatever the model: remote code, an unknown dtype."""
    if trust_remote_code:
        raise UnsupportedModel("model.trust_remote_code=true is refused: rookworld never runs "
                               "code from a model repository; pick a model transformers "
                               "implements")
    if dtype not in DTYPES:
        raise ValueError(f"model.dtype must be one of {' | '.join(DTYPES)}, got {dtype!r}")


def check(path: str | None = None, dtype: str = "float32", trust_remote_code: bool = False,
          local_files_only: bool = False, revision: str | None = None, **_) -> None:
    """What `load_hf` checks before any weight moves, without fetching the model: train runs
    it with the config's other checks, before the data loads."""
    check_settings(trust_remote_code, dtype)
    preflight(path, local_files_only, revision, fetch=False)


def load_hf(path: str | None = None, dtype: str = "float32", trust_remote_code: bool = False,
            bos_before_prompt: bool = False, local_files_only: bool = False,
            revision: str | None = None):
    """A `policy.Policy` of any transformers causal LM from a hub id or local directory:
    preflight first (`preflight`), then the weights in `dtype`, dropout 0, eval mode; the
    tokenizer from the same directory, pad = eos when it has no pad token, left padding."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from ..policy import Policy, check_vocab

    check_settings(trust_remote_code, dtype)
    directory = preflight(path, local_files_only, revision)
    config = AutoConfig.from_pretrained(directory, trust_remote_code=False,
                                        local_files_only=True)
    for key in DROPOUT_KEYS:
        if isinstance(getattr(config, key, None), float):
            setattr(config, key, 0.0)
    model = AutoModelForCausalLM.from_pretrained(
        directory, config=config, dtype=DTYPES[dtype], trust_remote_code=False,
        use_safetensors=True, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(str(directory), trust_remote_code=False,
                                        local_files_only=True)
    if tok.eos_token_id is None:
        raise UnsupportedModel(f"model.path={path!r}: tokenizer has no end-of-text token")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    check_vocab(tok, model.get_input_embeddings().num_embeddings, path)
    bos = (tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id) \
        if bos_before_prompt else None
    return Policy(model.eval(), tok, eos_id=tok.eos_token_id, bos_id=bos, source=directory)
