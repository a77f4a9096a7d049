"""CPU matrix products for the fast GPT-2 forward: the library that takes them
(`CPU_MATMUL`, a fixed choice per machine that `runtime.setup` makes from the
`cpu_matmul` setting, recorded in each checkpoint), `linear`, the products with gradients
that the autograd Functions take (`_train_product`, `_train_product_grads`), and
oneDNN-packed decoding weights (`pack_weights`)."""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor

from ...precision import cpuinfo
from .gelu import gelu_tanh

ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
LOW: torch.dtype | None = None  # the products' dtype inside `low_precision` (None: float32)


@contextmanager
def low_precision(dtype: torch.dtype | None):
    """Inside it every product below takes float32 inputs in `dtype` (bfloat16) and hands
    back float32: weights, activations between products, norms, softmax and GELU inputs
    stay float32, as under torch.autocast. None: float32 products."""
    global LOW
    before, LOW = LOW, dtype
    try:
        yield
    finally:
        LOW = before


def _low(t: Tensor | None) -> Tensor | None:
    return t.to(LOW) if LOW is not None and t is not None and t.dtype == torch.float32 else t


def _high(t: Tensor, like: Tensor) -> Tensor:
    return t.float() if t.dtype != like.dtype and like.dtype == torch.float32 else t


def _dnn(x: Tensor, w_out_in: Tensor, b: Tensor | None, gelu: bool = False) -> Tensor:
    """oneDNN x @ w_out_in^T + b (optionally with tanh GELU fused), any leading dims."""
    y = torch.ops.mkldnn._linear_pointwise(_low(x), _low(w_out_in), _low(b),
                                           "gelu" if gelu else "none", [], "tanh" if gelu else "")
    return _high(y, x)


def cpu_vendor() -> str:
    return cpuinfo("vendor_id")


CPU_MATMUL_CHOICES = ("auto", "onednn", "blas", "mkl")


def resolve_cpu_matmul(choice: str) -> str:
    """The library that takes the float32 CPU matrix products for a `cpu_matmul` setting:
    onednn: oneDNN for every product; blas: MKL for the products of training and of
    decoding, oneDNN for no-grad forwards of at least BLAS_DNN_MIN_ROWS rows (the reference
    pass); mkl: MKL for every product but decoding's, which use oneDNN-packed copies of
    every block matrix. Either way a linear followed by GELU without gradients goes
    through oneDNN with the GELU fused, except under mkl. auto: blas on Intel, mkl
    elsewhere, a fixed choice per machine (never timed: a timing race under load gave
    the same seed different weights in different processes). Without oneDNN: blas."""
    choice = str(choice).lower()
    if choice not in CPU_MATMUL_CHOICES:
        raise ValueError(f"cpu_matmul (ROOKWORLD_CPU_MATMUL) must be one of "
                         f"{', '.join(CPU_MATMUL_CHOICES)}, got {choice!r}")
    if not ONEDNN:
        return "blas"
    if choice == "auto":
        return "blas" if cpu_vendor() == "GenuineIntel" else "mkl"
    return choice


def set_cpu_matmul(choice: str) -> str:
    """Make `choice` (resolved) the library of this process's products; returns it."""
    global CPU_MATMUL
    CPU_MATMUL = resolve_cpu_matmul(choice)
    return CPU_MATMUL


CPU_MATMUL = resolve_cpu_matmul("auto")  # until `runtime.setup` sets the configured one
BLAS_DNN_MIN_ROWS = 64


def _trains_in_onednn(x: Tensor) -> bool:
    """Whether products with gradients over x go through oneDNN (CPU_MATMUL=onednn)."""
    return ONEDNN and CPU_MATMUL == "onednn" and x.device.type == "cpu" \
        and x.dtype == torch.float32


def _train_product(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    """x [M,K] @ w [K,N] + b (the GPT-2 Conv1D layout) as a product with gradients is
    taken, without a graph: for the autograd Functions below."""
    return _dnn(x, w.t(), b) if _trains_in_onednn(x) else _blas(x, w, b)


def _train_product_grads(x: Tensor, w: Tensor, gy: Tensor, needs: tuple[bool, bool, bool]
                         ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """Gradients of x @ w + b for gy: (x, w, b), None where not needed; grad_x through
    oneDNN when the product went there, grad_w through torch.mm (MKL)."""
    gx = None
    if needs[0]:
        gx = _dnn(gy, w, None) if _trains_in_onednn(gy) else _high(_low(gy) @ _low(w).t(), gy)
    gw = _high(torch.mm(_low(x).t(), _low(gy)), gy) if needs[1] else None
    gb = gy.sum(0) if needs[2] else None
    return gx, gw, gb


class _OneDNNLinear(torch.autograd.Function):
    """x [M,K] @ w [K,N] + b through oneDNN's matmul (CPU_MATMUL=onednn, with gradients)."""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        return _dnn(x, w.t(), b)

    @staticmethod
    def backward(ctx, gy):
        x, w = ctx.saved_tensors
        return _train_product_grads(x, w, gy, ctx.needs_input_grad)


Packed = dict[int, Tensor]  # id(weight) -> oneDNN-packed copy (see pack_weights)


def _blas(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    if LOW is not None and x.dtype == torch.float32:  # the bias is added in float32
        y = (_low(x) @ _low(w)).float()
        return y if b is None else y + b
    return x @ w if b is None else torch.addmm(b, x, w)


def linear(x: Tensor, w: Tensor, b: Tensor | None, gelu: bool = False,
           packed: Packed | None = None) -> Tensor:
    """x [M,K] @ w [K,N] + b, then tanh GELU when gelu. Float32 on CPU: through the library
    CPU_MATMUL picks, and through oneDNN with the GELU fused when no gradient is needed
    (not under mkl);
    elsewhere torch.addmm. packed: no-grad only, oneDNN-packed copies of weights from
    pack_weights (faster at small M)."""
    if packed is not None and id(w) in packed:
        return _dnn(x, packed[id(w)], b, gelu)
    cpu32 = ONEDNN and x.device.type == "cpu" and x.dtype == torch.float32
    if cpu32 and CPU_MATMUL != "mkl" and not (
            torch.is_grad_enabled() and (x.requires_grad or w.requires_grad)):
        if gelu or CPU_MATMUL == "onednn" or x.shape[0] >= BLAS_DNN_MIN_ROWS:
            return _dnn(x, w.t(), b, gelu)
    if _trains_in_onednn(x):  # with gradients
        y = _OneDNNLinear.apply(x, w, b)
    else:
        y = _blas(x, w, b)
    if not gelu:
        return y
    return F.gelu(y, approximate="tanh") if torch.is_grad_enabled() and y.requires_grad \
        else gelu_tanh(y)


def pack_weights(model, rows: int) -> Packed | None:
    """oneDNN-packed copies of the block matrices that go through oneDNN (all of them and
    the output matrix when CPU_MATMUL is onednn or mkl, the GELU ones when blas) for no-grad
    forwards of about `rows` rows (decoding); None off CPU. Pack again after the weights
    change (the copies do not follow them)."""
    w0 = model.transformer.wte.weight
    if not (ONEDNN and w0.device.type == "cpu" and w0.dtype == torch.float32):
        return None
    every = CPU_MATMUL in ("onednn", "mkl")
    with torch.no_grad():
        out = {}
        for blk in model.transformer.h:
            lins = (blk.attn.c_attn, blk.attn.c_proj, blk.mlp.c_fc, blk.mlp.c_proj) if every \
                else (blk.mlp.c_fc,)
            for lin in lins:
                # oneDNN reorders straight from the transposed view (same packed
                # result as from a contiguous copy, without making that copy)
                out[id(lin.weight)] = torch.ops.mkldnn._reorder_linear_weight(
                    _low(lin.weight.t()), rows)
        if every:
            out[id(model.lm_head.weight)] = torch.ops.mkldnn._reorder_linear_weight(
                _low(model.lm_head.weight.contiguous()), rows)
    return out

