"""MLP (linear -> exact GELU -> linear) from the tiled Triton GEMM of gemm.py.

What it adds over torch.compile: the GELU lives in the epilogue of the first GEMM, so the
activation is computed on the tile while it is still in registers; the widest tensor of
the block (M x hidden) is written once as GELU(H) (plus once as H, which backward needs)
and never re-read for the activation. In backward the GELU derivative rides in the
epilogue of dG = dY @ W2, so dH = dG * GELU'(H) costs no extra pass either; dX and dW of
both layers are the same GEMM kernel fed transposed *views* (strides, no copies).

What it costs: five GEMMs we tile and tune ourselves instead of cuBLAS's, an extra
(M x hidden) store of the pre-activation in forward (the alternative, recomputing
H = X W1^T + b1 in backward, costs a third more FLOPs), and the bias gradients as two
column-sum passes. No torch matmul anywhere: that would be Level 1 in disguise.

Measured (H100, bf16, M=8192, 4096 -> 16384 -> 4096, reports/h100-bench.json): forward
3.89 ms = 565 TFLOP/s vs eager cuBLAS + GELU 3.29 ms = 668 TFLOP/s (0.85x, goal 1.0x
missed); forward+backward 0.94x. Subtiling the epilogue (gemm.py SPLIT_N) took the
128x256 tile from 460-506 TFLOP/s (spilling: 42 and 292 registers) to 565-578. The rest
of the gap is the GEMM main loop: cuBLAS runs a persistent, warp-specialized TMA kernel
whose epilogue overlaps the next tile's loads; this one issues cp.async + wgmma from
every warp and stops the tensor cores for its epilogue (`levels explain --level triton`).

Shapes: x (..., K) is viewed as (M, K) (a copy only if its strides do not allow a view),
w1 (hidden, K), w2 (N, hidden), as nn.Linear stores them; X @ W1^T is gemm(x, w1.t()).
"""

from __future__ import annotations

import torch

from .gemm import KERNELS as _GEMM_KERNELS
from .gemm import column_sum, gemm, gemm_gelu_backward
from .launch import apply_ahead, forward_ahead, needs_grad

KERNELS = list(_GEMM_KERNELS)


def uses_tf32(device, dtype) -> bool:
    return False  # fp32 dots use input_precision="ieee"


def _rows(x: torch.Tensor) -> torch.Tensor:
    # reshape is a view whenever the strides allow it (always for contiguous inputs).
    return x.reshape(-1, x.shape[-1])


def _forward(x, w1, b1, w2, b2, keep_preact: bool, config=None):
    """(out, x2, pre, act) without autograd; pre (H = X W1^T + b1) is only kept for a
    backward pass (the GELU's derivative needs it); without one, one GEMM fewer stores.
    config: gemm's (None: each GEMM's tile from its size)."""
    x2 = _rows(x)
    M, hidden = x2.shape[0], w1.shape[0]
    pre = x2.new_empty((M, hidden)) if keep_preact else None
    # G = GELU(H), and H itself in the same pass when the backward needs it
    act = gemm(x2, w1.t(), b1, activation="gelu", preact_out=pre, check=False, config=config)
    out = gemm(act, w2.t(), b2, check=False, config=config)
    return out.view(*x.shape[:-1], w2.shape[0]), x2, pre, act


class _MLP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w1, b1, w2, b2, config=None):
        out, x2, pre, act = _forward(x, w1, b1, w2, b2, keep_preact=True, config=config)
        ctx.save_for_backward(x2, w1, w2, pre, act)
        ctx.x_shape = x.shape
        ctx.config = config  # the backward's GEMMs run the same pinned tile, if any
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x2, w1, w2, pre, act = ctx.saved_tensors
        dy = grad_out.reshape(-1, grad_out.shape[-1])  # (M, N), any strides
        needs = ctx.needs_input_grad
        cfg = ctx.config
        dx = dw1 = db1 = dw2 = db2 = None
        # Second layer: dW2 = dY^T G, db2 = colsum(dY); dH = (dY W2) * GELU'(H) fused.
        if needs[3]:
            dw2 = gemm(dy.t(), act, check=False, config=cfg)
        if needs[4]:
            db2 = column_sum(dy, out_dtype=dy.dtype)
        if needs[0] or needs[1] or needs[2]:
            dh = gemm_gelu_backward(dy, w2, pre, check=False, config=cfg)  # (M, hidden)
            if needs[0]:
                dx = gemm(dh, w1, check=False, config=cfg).reshape(ctx.x_shape)  # dX = dH W1
            if needs[1]:
                dw1 = gemm(dh.t(), x2, check=False, config=cfg)  # dW1 = dH^T X
            if needs[2]:
                db1 = column_sum(dh, out_dtype=dh.dtype)
        return dx, dw1, db1, dw2, db2, None


def check(x) -> None:
    """What only these kernels refuse (levels.triton runs it once per argument signature,
    after the contract)."""
    if x.dtype == torch.float64:
        raise TypeError("mlp: argument 'x' must be float16, bfloat16 or float32 for the Triton "
                        "kernels (tl.dot has no float64 tensor-core path); got torch.float64")


def mlp(x, w1, b1, w2, b2, config=None):
    """Called by levels.triton.mlp after the shared validation and `check`.

    config=None: every GEMM's tile follows from its size. A dict (gemm's `config`) pins
    all of them, forward and backward, to one tile: what `levels bench`'s tile sweep and
    the split-K tests pass."""
    if needs_grad(x, w1, b1, w2, b2):
        return apply_ahead(_MLP, x, w1, b1, w2, b2, config)
    return forward_ahead(_inference, x, w1, b1, w2, b2, config)


def _inference(x, w1, b1, w2, b2, config):
    """The forward of a call that computes no gradient (launch.forward_ahead replays it)."""
    return _forward(x, w1, b1, w2, b2, keep_preact=False, config=config)[0]
