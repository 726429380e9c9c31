"""Rotary position embeddings (RoPE) in Triton: one read of x, one write of y.

The math: feature pairs (x1, x2) are points in the plane, each turned by the angle of its
position and pair, theta[n, i]:

    y1 = x1 cos - x2 sin,    y2 = x2 cos + x1 sin

with pairs (i, i + D/2) (half-split: GPT-NeoX, HF Llama's rotate_half) or (2i, 2i + 1)
(interleaved: the RoPE paper, Meta's Llama). A rotation is orthogonal, so its backward is
its transpose, the rotation by -theta: dx = rotate(dy, cos, -sin). The backward is the
same kernel with SIGN = -1, reading dy instead of x; cos and sin are tables, not
differentiated (the contract refuses tables that require grad).

What it adds over torch.compile: little in speed (Inductor fuses the same pointwise math),
and that is the lesson, as for layer_norm: the floor is one read of x and one write of y,
the (N, D/2) tables are read once per program and stay in L2 for the other heads. What the
hand-written kernel buys is control of the layout: x is read through all four of its
strides, so q sliced out of a fused (B, N, 3, H, D) qkv projection (the layout a real model
hands over) is rotated without the copy that `.contiguous()` would make, and the rotation
itself is a device function, `rotate_pairs`, that a fused attention kernel can apply to
its q and k tiles in registers (RoPE fused into attention never writes rotated q and k).

The grid: one program per (row block, head): program p takes rows
[BLOCK_N * (p % row_blocks), ...) of head p // row_blocks, all its D/2 pairs, so a program
moves BLOCK_N x D elements (about 4096, the size at which a copy kernel reaches bandwidth).
A flat grid, so no axis limit applies (CUDA caps the 2nd and 3rd axes at 65535).

What it costs: the half-split layout loads two contiguous halves; the interleaved layout
loads whole rows and separates the pairs in registers (tl.reshape + tl.split, then
tl.join to put them back), which asks Triton for a register shuffle instead of the
stride-2 gathers and scatters that a direct translation of the math would issue.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .launch import apply_ahead, cdiv, fast_launch, forward_ahead, needs_grad, next_power_of_2

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def rotate_pairs(x1, x2, cos, sin):
    """Each pair (x1, x2) turned by its angle, in fp32 registers: the core of the kernel
    below, kept separate so that attention's kernels can call it on their q and k tiles
    right after loading them (RoPE fused into attention: issue #30)."""
    ### BEGIN SOLUTION
    return x1 * cos - x2 * sin, x2 * cos + x1 * sin
    ### END SOLUTION


@fast_launch
@triton.jit
def rope_kernel(x_ptr,  # (B, H, N, D) input (dy in the backward), any strides
                cos_ptr, sin_ptr,  # (N, D/2) tables, any strides
                y_ptr,  # (B, H, N, D) output, contiguous
                H, N, HALF,  # heads, positions, pairs per row (D / 2)
                row_blocks,  # programs per head: cdiv(N, BLOCK_N)
                stride_xb, stride_xh, stride_xn, stride_xd,  # x's strides, in elements
                stride_cn, stride_cd,  # cos's strides
                stride_sn, stride_sd,  # sin's strides
                SIGN: tl.constexpr,  # 1.0 forward; -1.0 backward: the rotation by -theta
                INTERLEAVED: tl.constexpr,  # pairs (2i, 2i+1); else (i, i + D/2)
                BLOCK_N: tl.constexpr,  # rows per program
                BLOCK_HALF: tl.constexpr):  # pairs per row, rounded up to a power of two
    pid = tl.program_id(0)
    bh = pid // row_blocks
    b = bh // H
    h = bh % H
    rows = (pid % row_blocks) * BLOCK_N + tl.arange(0, BLOCK_N)
    pairs = tl.arange(0, BLOCK_HALF)
    mask = (rows < N)[:, None] & (pairs < HALF)[None, :]
    # 64-bit offsets throughout: a sliced x spans its whole parent buffer, and B*H*N*D
    # passes 2**31 at long contexts (32 heads x 128 x 1M tokens)
    rows64 = rows.to(tl.int64)
    x_row = x_ptr + b.to(tl.int64) * stride_xb + h.to(tl.int64) * stride_xh \
        + rows64[:, None] * stride_xn
    y_row = y_ptr + (bh.to(tl.int64) * N + rows64[:, None]) * (2 * HALF)
    cos = tl.load(cos_ptr + rows64[:, None] * stride_cn + pairs[None, :] * stride_cd,
                  mask=mask, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + rows64[:, None] * stride_sn + pairs[None, :] * stride_sd,
                  mask=mask, other=0.0).to(tl.float32)
    if INTERLEAVED:
        # Pairs (2i, 2i+1) sit side by side: load the whole row tile in one contiguous,
        # vectorized access and split the pairs apart in registers ([N, D] -> [N, D/2, 2]
        # -> two [N, D/2]), then join and store the same way. The first version loaded
        # x[2i] and x[2i+1] as two stride-2 gathers and stored them as two stride-2
        # scatters: 0.14x copy on the H100 (reports/h100-bench-rope.json), 7x slower than
        # this layout-in-registers form for the same bytes.
        cols = tl.arange(0, 2 * BLOCK_HALF)
        full = (rows < N)[:, None] & (cols < 2 * HALF)[None, :]
        x = tl.load(x_row + cols[None, :].to(tl.int64) * stride_xd, mask=full, other=0.0)
        x1, x2 = tl.split(tl.reshape(x.to(tl.float32), (BLOCK_N, BLOCK_HALF, 2)))
        y1, y2 = rotate_pairs(x1, x2, cos, SIGN * sin)
        y = tl.reshape(tl.join(y1, y2), (BLOCK_N, 2 * BLOCK_HALF))
        tl.store(y_row + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=full)
    else:
        # Pairs (i, i + D/2): two contiguous halves, each a coalesced load and store.
        x1 = tl.load(x_row + pairs[None, :].to(tl.int64) * stride_xd, mask=mask, other=0.0)
        x2 = tl.load(x_row + (pairs + HALF)[None, :].to(tl.int64) * stride_xd, mask=mask,
                     other=0.0)
        y1, y2 = rotate_pairs(x1.to(tl.float32), x2.to(tl.float32), cos, SIGN * sin)
        tl.store(y_row + pairs[None, :], y1.to(y_ptr.dtype.element_ty), mask=mask)
        tl.store(y_row + (pairs + HALF)[None, :], y2.to(y_ptr.dtype.element_ty), mask=mask)


KERNELS = [rope_kernel]


def uses_tf32(device, dtype) -> bool:
    return False  # no dot products


def _tiling(N: int, half: int):
    """(BLOCK_N, BLOCK_HALF, num_warps): whole rows, about 2048 pairs (4096 elements) a
    program, fewer in the interpreter (every element is a numpy operation there)."""
    BLOCK_HALF = next_power_of_2(half)
    target = 256 if INTERPRETED else 2048
    BLOCK_N = min(next_power_of_2(N), max(1, target // BLOCK_HALF))
    return BLOCK_N, BLOCK_HALF, 4


def rotate(x, cos, sin, interleaved: bool, sign: float = 1.0):
    """y = x rotated by +theta (sign 1) or -theta (sign -1), a new contiguous (B, H, N, D)
    tensor; x, cos and sin are read through their strides (no copy, whatever the view)."""
    B, H, N, D = x.shape
    y = torch.empty((B, H, N, D), dtype=x.dtype, device=x.device)
    if y.numel() == 0:
        return y  # no batch element, head or position: nothing to launch (an empty grid)
    BLOCK_N, BLOCK_HALF, num_warps = _tiling(N, D // 2)
    row_blocks = cdiv(N, BLOCK_N)
    rope_kernel[(B * H * row_blocks,)](
        x, cos, sin, y, H, N, D // 2, row_blocks, *x.stride(), *cos.stride(), *sin.stride(),
        SIGN=sign, INTERLEAVED=interleaved, BLOCK_N=BLOCK_N, BLOCK_HALF=BLOCK_HALF,
        num_warps=num_warps)
    return y


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin, interleaved):
        ctx.save_for_backward(cos, sin)
        ctx.interleaved = interleaved
        return rotate(x, cos, sin, interleaved, 1.0)

    @staticmethod
    def backward(ctx, dy):
        cos, sin = ctx.saved_tensors
        # dx = R(-theta) dy: the same kernel with sin negated. dy may be any view (an
        # expanded .sum() gradient has stride 0 everywhere): read through its strides.
        return rotate(dy, cos, sin, ctx.interleaved, -1.0), None, None, None


def check(x) -> None:
    """What only these kernels refuse (after the contract): float64, which they would
    compute in float32."""
    if x.dtype == torch.float64:
        raise TypeError("rope: argument 'x' must be float16, bfloat16 or float32 for the Triton "
                        "kernel (it computes in float32); got torch.float64")


def rope(x, cos, sin, interleaved=False):
    """Called by levels.triton.rope after the contract and `check`. Returns a contiguous
    (B, H, N, D) tensor; every input is read through its own strides."""
    if needs_grad(x):
        return apply_ahead(_Rope, x, cos, sin, bool(interleaved))
    return forward_ahead(rotate, x, cos, sin, bool(interleaved), 1.0)
