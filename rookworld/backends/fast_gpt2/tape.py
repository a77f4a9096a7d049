"""The rollout's forward, kept for the update: most of the policy's forward not run twice.

With one optimiser step per generation batch (num_iterations = 1, or the first of
several) the policy that sampled a batch is the policy the update differentiates, and
the teacher-forced forward the update would run has already been run, token by token,
while sampling. A `Tape` keeps, for every layer and token, the block's input (the
residual stream), its queries and the residual after attention (3C floats a token and
layer, and the final residual); the keys and values stay in the sampler's cache, kept
with the tape. The update takes the log-probs from the final residual (final norm and
output matrix with gradients, as the forward would), and `backward` replays the blocks
from the top (`blocks.replay_attention`, `blocks.replay_mlp`): three of a block's
four matrix products (attention input, attention output, MLP output; 8 of its 12 C^2
multiply-adds a token) take their outputs from the tape, the MLP's first product runs
again with the layer norms, attention and GELU (keeping its [4C] output instead would
more than double the tape), and every gradient is the usual one. Two thirds of the
policy's forward FLOPs are not spent again.

The kept values are those sampling computed (packed products, one token at a time),
not a second teacher-forced pass: they differ from one in float rounding only, and
they are what the sampled tokens and their log-probs came from. Prompts are kept once
per group, as the teacher-forced forward runs them (`forward.completion_hidden`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ...gpt2 import positions_from_mask
from .attention import prompt_completion_attention, to_rows
from .blocks import Keep, replay_attention, replay_mlp

# floats a token keeps per layer: x (C), q (C), xm (C); its keys and values stay in the
# sampler's cache (2C), kept with the tape
PER_LAYER = 3
# rows per MLP replay (evened out): its [rows, 4C] product, GELU and their gradients are
# the largest tensors of a layer's backward, so pieces bound the peak, and products of ~1k
# rows and more keep their rate, so pieces are not smaller than that
MLP_ROWS = 1536


class Tape:
    """The kept forward of one `decode.sample` call: U distinct prompts of width P
    (rows 0 .. U*P-1) and N completion rows of up to `max_steps` decoding steps (step
    t of row n at U*P + t*N + n, so one step writes one contiguous block)."""

    def __init__(self, model, uniq: Tensor, u_mask: Tensor, order: Tensor, g: int, n: int,
                 max_steps: int):
        cfg, w = model.config, model.transformer.wte.weight
        self.uniq, self.u_mask, self.order, self.g, self.n = uniq, u_mask, order, g, n
        self.mp = uniq.shape[0] * uniq.shape[1]
        rows, c, layers = self.mp + n * max_steps, cfg.n_embd, cfg.n_layer

        def new(width: int, count: int = layers) -> list[Tensor]:
            return [torch.empty(rows, width, dtype=w.dtype, device=w.device) for _ in range(count)]
        # one tensor per layer and kind, so that backward frees each as soon as it is done
        self.x = new(c, layers + 1)  # every block's input, then the final residual
        self.q, self.xm = new(c), new(c)
        self.cache = None  # the sampler's KVCache: the keys and values (`attach`)
        self.ids = torch.empty(max_steps, n, dtype=torch.long, device=w.device)
        self.pos = torch.empty(max_steps, n, dtype=torch.long, device=w.device)
        self.steps = 0  # decoding steps kept
        self.nbytes = sum(t.nbytes for t in self.x + self.q + self.xm)

    def attach(self, cache) -> None:
        """Keep the sampler's KVCache (`decode.KVCache`, same groups): the keys and
        values the tape does not copy."""
        self.cache = cache
        self.nbytes += cache.kv.nbytes

    @staticmethod
    def size(cfg, n_unique: int, prompt_width: int, n: int, max_steps: int, n_groups: int,
             itemsize: int = 4) -> int:
        """Bytes a Tape of these sizes holds with its cache (G = n / n_groups rows a
        group, each group's prompt in the cache once)."""
        rows = n_unique * prompt_width + n * max_steps
        cache = 2 * cfg.n_layer * (n_groups * prompt_width + n * (max_steps + 1)) * cfg.n_embd
        return (rows * cfg.n_embd * (PER_LAYER * cfg.n_layer + 1) + cache) * itemsize

    def prompt_keeper(self) -> Callable[[int], Keep]:
        """keep(layer) for `forward.prompt_forward`: the prompts' rows 0..U*P-1."""
        def for_layer(layer: int) -> Keep:
            def keep(kind: str, value: Tensor) -> None:
                value = value.reshape(self.mp, -1)
                if kind == "qkv":  # the queries; keys and values are in the cache
                    kind, value = "q", value[:, :self.x[0].shape[1]]
                getattr(self, kind)[layer][:self.mp] = value
            return keep
        return for_layer

    def step_rows(self, t: int, tok: Tensor, positions: Tensor) -> slice:
        """The tape rows of decoding step t (inputs tok at positions [N]), which
        `decode.decode_block` writes; steps come in order."""
        assert t == self.steps, (t, self.steps)
        self.ids[t], self.pos[t] = tok, positions
        self.steps = t + 1
        lo = self.mp + t * self.n
        return slice(lo, lo + self.n)

    @property
    def rows(self) -> int:
        return self.mp + self.n * self.steps

    def final(self) -> Tensor:
        """A leaf [rows, C] with gradients: the final residual of every kept token."""
        return self.x[-1][:self.rows].detach().requires_grad_()

    def hidden(self, final: Tensor, rows: Tensor) -> Tensor:
        """final (from `final`) -> the residuals predicting completion tokens 0..steps of
        these rows (indices into this sample's rows): [len(rows), steps + 1, C]."""
        (u, p), c = self.uniq.shape, final.shape[1]
        first = to_rows(final[:self.mp].view(u, p, c)[:, -1], self.order, self.g)[rows]
        later = final[self.mp:].view(self.steps, self.n, c)[:, rows].transpose(0, 1)
        return torch.cat([first[:, None], later], dim=1)

    def backward(self, model, d_final: Tensor) -> None:
        """Accumulate the model's parameter gradients (.grad) for d_final, the loss's
        gradient with respect to `final()` [rows, C]: the blocks from the top, then the
        embeddings. Each layer's kept tensors are freed once it is done (the tape is
        spent: call once, after dropping final()'s leaf)."""
        tr, m, s = model.transformer, self.rows, self.steps
        attend = prompt_completion_attention(self.u_mask, to_rows(self.u_mask, self.order, self.g),
                                             self.order, self.g, s, time_major=True)
        # a group for each distinct prompt, where the cache holds its keys and values
        first = torch.empty(self.uniq.shape[0], dtype=torch.long, device=self.order.device)
        first[self.order] = torch.arange(self.order.shape[0], device=self.order.device)
        dx = d_final
        for i in reversed(range(len(tr.h))):
            blk = tr.h[i]
            d_xm = torch.empty_like(dx)
            for lo, hi in _even_chunks(m, MLP_ROWS):
                with torch.enable_grad():
                    xm = self.xm[i][lo:hi].detach().requires_grad_()
                    backward_with(replay_mlp(xm, blk, self.x[i + 1][lo:hi]), dx[lo:hi])
                d_xm[lo:hi] = xm.grad
            self.x[i + 1] = None
            del dx, xm
            with torch.enable_grad():
                x = self.x[i][:m].detach().requires_grad_()
                qkv = torch.cat([self.q[i][:m], *self._keys_values(i, first)], dim=1)
                backward_with(replay_attention(x, blk, attend, qkv, self.xm[i][:m]), d_xm)
            dx = x.grad
            del x, qkv, d_xm
            self.q[i] = self.xm[i] = None
        self.cache = None
        with torch.enable_grad():
            x0 = torch.cat([(tr.wte(self.uniq) + tr.wpe(positions_from_mask(self.u_mask))
                             ).reshape(self.mp, -1),
                            (tr.wte(self.ids[:s]) + tr.wpe(self.pos[:s])).flatten(0, 1)])
            backward_with(x0, dx)
        self.x[0] = None

    def _keys_values(self, layer: int, first: Tensor) -> tuple[Tensor, Tensor]:
        """Layer's keys and values in the tape's row order, [rows, C] each, from the cache
        ([groups, H, P + slots, D]: each group's prompt, then completion token t of the
        group's row r at slot P + t * G + r); first [U]: a group of each distinct prompt."""
        (u, p), s = self.uniq.shape, self.steps
        out = []
        for z in (self.cache.k[layer], self.cache.v[layer]):
            h, d = z.shape[1], z.shape[3]
            prompts = z[first, :, :p].permute(0, 2, 1, 3).reshape(u * p, h * d)
            steps = z[:, :, p:p + s * self.g].unflatten(2, (s, self.g))  # [U',H,s,G,D]
            out.append(torch.cat([prompts, steps.permute(2, 0, 3, 1, 4).reshape(-1, h * d)]))
        return out[0], out[1]


def backward_with(out: Tensor, grad: Tensor) -> None:
    """out.backward(grad) through autograd's engine directly, as torch.autograd.backward
    runs it, without the check of the given gradient that first imports torch.fx's
    symbolic shapes and sympy (benchmarks/README.md); the shapes are checked here."""
    if out.shape != grad.shape:
        raise ValueError(f"gradient of shape {tuple(grad.shape)} for an output of shape "
                         f"{tuple(out.shape)}")
    run = getattr(torch.autograd.graph, "_engine_run_backward", None)
    if run is None:  # a torch without it: the public call, and its imports
        out.backward(grad)
    else:
        run((out,), (grad,), False, False, (), allow_unreachable=True, accumulate_grad=True)


def _even_chunks(n: int, most: int) -> list[tuple[int, int]]:
    """[lo, hi) ranges covering 0..n-1 in as few chunks of at most `most` as can, evened
    out (2,244 rows by 2,048 -> 1,122 + 1,122)."""
    chunks = max(1, -(-n // most))
    size = -(-n // chunks)
    return [(lo, min(lo + size, n)) for lo in range(0, n, size)]
