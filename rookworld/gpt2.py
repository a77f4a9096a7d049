"""GPT-2 in the hub layout, without transformers' model classes.

rookworld trains and samples through its own forward over a GPT-2's weights
(`backends.fast_gpt2`); a model class is only the container of those weights, their
loader and saver, and a plain forward for pretraining. Importing transformers' GPT2LMHeadModel
(transformers.modeling_utils) costs every process seconds and memory beyond torch's,
torch's compiler stack (torch._dynamo, sympy) among it, which a GRPO step here does not
load (`optim.FusedAdamW`, `fast_gpt2.tape.backward_with`). This module keeps the same
parameters under the same names and shapes (`transformer.h.0.attn.c_attn.weight`, the
Conv1D layout [in, out], the output matrix tied to the token embedding), reads and writes
the hub layout that transformers' class reads and writes (config.json + model.safetensors,
the tied matrix stored once), and initialises random weights exactly as transformers 5
does for the same seed (`init_weights_`, pinned by a test). `to_transformers` hands the
weights to transformers' class where a caller wants it (its `generate`, another library).

Only GPT-2 itself: the tanh GELU, no attention variants (`fast_gpt2.forward.check_gpt2`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

# transformers' GPT2Config defaults (config.json may leave any of them out)
DEFAULTS = dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12,
                n_inner=None, activation_function="gelu_new", resid_pdrop=0.1, embd_pdrop=0.1,
                attn_pdrop=0.1, layer_norm_epsilon=1e-5, initializer_range=0.02,
                scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False,
                reorder_and_upcast_attn=False, bos_token_id=50256, eos_token_id=50256,
                tie_word_embeddings=True)
WEIGHTS, CONFIG = "model.safetensors", "config.json"
# buffers some GPT-2 checkpoints carry (the causal mask), not parameters
_BUFFERS = (".attn.bias", ".attn.masked_bias")


def positions_from_mask(mask: Tensor) -> Tensor:
    """[N,S] attention mask -> [N,S] positions counting real tokens from 0 (pads get 0): a
    left-padded row's positions as in training, for every forward over such batches."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


class GPT2Config(SimpleNamespace):
    """A GPT-2 config.json as attributes: transformers' defaults for what it leaves out;
    every other key it holds is kept and written back (`to_dict`)."""

    def __init__(self, **fields):
        super().__init__(**(DEFAULTS | fields))
        self.model_type = "gpt2"

    @property
    def inner(self) -> int:
        return self.n_inner or 4 * self.n_embd

    def to_dict(self) -> dict:
        return dict(vars(self)) | {"architectures": ["GPT2LMHeadModel"]}


class Conv1D(nn.Module):
    """x @ weight + bias with weight [in, out] (GPT-2's layout)."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x: Tensor) -> Tensor:
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(
            *x.shape[:-1], -1)


class Attention(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.num_heads = cfg.n_head
        self.c_attn, self.c_proj = (Conv1D(cfg.n_embd, 3 * cfg.n_embd),
                                    Conv1D(cfg.n_embd, cfg.n_embd))


class MLP(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.c_fc, self.c_proj = Conv1D(cfg.n_embd, cfg.inner), Conv1D(cfg.inner, cfg.n_embd)


class Block(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        eps = cfg.layer_norm_epsilon
        self.ln_1, self.attn = nn.LayerNorm(cfg.n_embd, eps=eps), Attention(cfg)
        self.ln_2, self.mlp = nn.LayerNorm(cfg.n_embd, eps=eps), MLP(cfg)


class Transformer(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd, _weight=torch.empty(
            cfg.vocab_size, cfg.n_embd))
        self.wpe = nn.Embedding(cfg.n_positions, cfg.n_embd, _weight=torch.empty(
            cfg.n_positions, cfg.n_embd))
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)


class GPT2LMHeadModel(nn.Module):
    """GPT-2 with its output matrix (tied to the token embedding unless the config says
    otherwise). Made with uninitialised weights: `init_weights_` or `from_pretrained`."""

    def __init__(self, config: GPT2Config):
        super().__init__()
        self.config = config
        self.transformer = Transformer(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False, device="meta")
        self.tie_weights()

    def tie_weights(self) -> None:
        """The output matrix is the token embedding (tie_word_embeddings, the default)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.transformer.wte.weight
        elif self.lm_head.weight.is_meta:
            self.lm_head.weight = nn.Parameter(torch.empty_like(self.transformer.wte.weight))

    def get_input_embeddings(self) -> nn.Embedding:
        return self.transformer.wte

    @torch.no_grad()
    def init_weights_(self) -> GPT2LMHeadModel:
        """Random weights drawn exactly as transformers 5 draws them for GPT2LMHeadModel
        from the same global RNG state (its constructors' draws, then its `_init_weights`
        pass, then the output layer's, which the tie discards): the same seed gives the
        same model in either library (tests/test_gpt2.py), and the RNG ends in the same
        state. Biases 0, layer norms 1 and 0."""
        cfg, tr = self.config, self.transformer
        std = cfg.initializer_range
        tr.wte.weight.normal_(0.0, 1.0)  # nn.Embedding's own initialisation
        tr.wpe.weight.normal_(0.0, 1.0)
        mats = [(b.attn.c_attn, b.attn.c_proj, b.mlp.c_fc, b.mlp.c_proj) for b in tr.h]
        for layer in mats:  # Conv1D's own initialisation
            for lin in layer:
                lin.weight.normal_(0.0, std)
        tr.wte.weight.normal_(0.0, std)
        tr.wpe.weight.normal_(0.0, std)
        scaled = std / math.sqrt(2 * cfg.n_layer)  # GPT-2's residual projections
        for c_attn, a_proj, c_fc, m_proj in mats:
            c_attn.weight.normal_(0.0, std)
            a_proj.weight.normal_(0.0, std)
            a_proj.weight.normal_(0.0, scaled)
            c_fc.weight.normal_(0.0, std)
            m_proj.weight.normal_(0.0, std)
            m_proj.weight.normal_(0.0, scaled)
        head = torch.empty(cfg.vocab_size, cfg.n_embd)
        nn.init.kaiming_uniform_(head, a=math.sqrt(5))  # nn.Linear's own initialisation
        head.normal_(0.0, std)
        if not cfg.tie_word_embeddings:
            self.lm_head.weight.copy_(head)
        for module in self.modules():
            if isinstance(module, nn.LayerNorm):
                module.weight.fill_(1.0)
                module.bias.zero_()
            elif isinstance(module, Conv1D):
                module.bias.zero_()
        return self

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                position_ids: Tensor | None = None, use_cache: bool = False,
                return_residuals: bool = False):
        """Plain causal forward (pretraining, tests, probes): returns an object with .logits
        [N,S,V], and with return_residuals also .residuals, n_layer + 1 tensors [N,S,C]: the
        residual stream after the embeddings and after each block, before the final layer
        norm. Positions count from the mask's first 1 when a mask is given (left padding);
        every query also sees itself, so a padding row gives finite values."""
        n, s = input_ids.shape
        dev = input_ids.device
        allowed = None  # no mask: SDPA's causal kernel (right-padded batches need no mask)
        if attention_mask is not None:
            causal = torch.ones(s, s, dtype=torch.bool, device=dev).tril()
            allowed = (causal & attention_mask.bool()[:, None, None, :]) | torch.eye(
                s, dtype=torch.bool, device=dev)
            if position_ids is None:
                position_ids = positions_from_mask(attention_mask)
        if position_ids is None:
            position_ids = torch.arange(s, device=dev).expand(n, s)
        tr, c = self.transformer, self.config.n_embd
        x = tr.wte(input_ids) + tr.wpe(position_ids)
        residuals = [x]
        for blk in tr.h:
            h = blk.attn.c_attn(blk.ln_1(x))
            q, k, v = h.view(n, s, 3, blk.attn.num_heads, -1).permute(2, 0, 3, 1, 4)
            att = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed,
                                                 is_causal=allowed is None)
            x = x + blk.attn.c_proj(att.transpose(1, 2).reshape(n, s, c))
            x = x + blk.mlp.c_proj(F.gelu(blk.mlp.c_fc(blk.ln_2(x)), approximate="tanh"))
            residuals.append(x)
        out = SimpleNamespace(logits=self.lm_head(tr.ln_f(x)))
        if return_residuals:
            out.residuals = residuals
        return out

    # ------------------------------------------------------------- hub layout
    def save_pretrained(self, directory: str | Path, safe_serialization: bool = True) -> None:
        """config.json and model.safetensors, as transformers writes them (the tied output
        matrix stored once, as the token embedding)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tied = self.config.tie_word_embeddings
        weights = {k: v.detach().contiguous() for k, v in self.state_dict().items()
                   if not (tied and k == "lm_head.weight")}
        save_file(weights, str(directory / WEIGHTS), metadata={"format": "pt"})
        cfg = self.config.to_dict() | {"dtype": str(self.transformer.wte.weight.dtype)[6:]}
        (directory / CONFIG).write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")

    @classmethod
    def from_pretrained(cls, directory: str | Path, dtype: torch.dtype = torch.float32
                        ) -> GPT2LMHeadModel:
        """A GPT-2 from a local directory in the hub layout (config.json and
        model.safetensors; pickled weights are never read). Raises ValueError for another
        architecture or weights that do not fit the config."""
        directory = Path(directory)
        if not (directory / WEIGHTS).exists():
            raise OSError(f"{directory}: no {WEIGHTS} (rookworld reads safetensors only, "
                          "never pickled weights)")
        raw = json.loads((directory / CONFIG).read_text())
        if raw.get("model_type") != "gpt2":
            raise ValueError(f"{directory}: model_type {raw.get('model_type')!r}; rookworld's "
                             "forward supports GPT-2 checkpoints only")
        model = cls(GPT2Config(**raw))
        model.load_weights(load_file(str(directory / WEIGHTS)), str(directory))
        return model.to(dtype)

    def load_weights(self, weights: dict[str, Tensor], where: str = "checkpoint") -> None:
        """Copy a hub-layout state dict in (keys with or without the `transformer.`
        prefix, causal-mask buffers ignored, the tied output matrix optional)."""
        fixed = {}
        for k, v in weights.items():
            if k.endswith(_BUFFERS):
                continue
            fixed[k if k.startswith(("transformer.", "lm_head.")) else f"transformer.{k}"] = v
        if self.config.tie_word_embeddings:
            fixed.pop("lm_head.weight", None)
        own = {k: p for k, p in self.state_dict(keep_vars=True).items()
               if not (self.config.tie_word_embeddings and k == "lm_head.weight")}
        missing, unexpected = sorted(set(own) - set(fixed)), sorted(set(fixed) - set(own))
        wrong = sorted(k for k in set(own) & set(fixed) if own[k].shape != fixed[k].shape)
        if missing or unexpected or wrong:
            raise ValueError(f"{where}: weights do not fit the GPT-2 config: missing {missing}, "
                             f"unexpected {unexpected}, wrong shape {wrong}")
        with torch.no_grad():
            for k, p in own.items():
                p.copy_(fixed[k])

    def to_transformers(self):
        """transformers' GPT2LMHeadModel with these weights (a copy), for its `generate`
        or another library; imports transformers' model classes."""
        from transformers import GPT2Config as HFConfig
        from transformers import GPT2LMHeadModel as HFModel

        keys = {"model_type", "architectures", "dtype", "transformers_version"}
        hf = HFModel(HFConfig(**{k: v for k, v in vars(self.config).items() if k not in keys}))
        hf.load_state_dict(self.state_dict())
        return hf.to(self.transformer.wte.weight.dtype).eval()


def is_rookworld_gpt2(model) -> bool:
    """Whether model is this module's GPT-2, the class the fast_gpt2 backend runs."""
    return isinstance(model, GPT2LMHeadModel)
