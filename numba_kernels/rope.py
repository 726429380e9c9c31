"""Rotary position embeddings, forward and backward: the numba twin of cuda_kernels/rope.cu.

    y1 = x1 cos - x2 sin,   y2 = x2 cos + x1 sin,   pairs (i, i + D/2) or (2i, 2i + 1)
    dx = the same kernel on dy with -sin: a rotation's inverse is its transpose

What it mirrors (rope.cu):
    rotate          rope.cuh: rope_rotate          one pair turned by its angle, in fp32
    rope_v2         rope_v2                        a block per (row block, head):
                    threadIdx.x walks the pairs of a row, threadIdx.y the rows, each thread
                    ROWS rows, all their loads before any arithmetic; x, the tables and dy
                    read through their strides, y written contiguous

What differs, and why: the block. The C++ runs 256 threads a block (32-128 along the pairs,
the rest along the rows); the twin the same width along the pairs but 2 rows of threads,
since every simulated thread is an OS thread. The index arithmetic is the C++'s, line for
line, which is what the twin is for: the kernel on the GPU cannot be run here, its indexing
can. No timing: the simulator checks correctness only.
"""

from __future__ import annotations

import torch
from numba import cuda, float32

from .binding import Output, cdiv, launch, operand

ROWS = 4  # rope.cu's V2_ROWS: rows per thread, their loads issued together
THREAD_ROWS = 2  # threadIdx.y's extent (C++: 256 / the pair width)


@cuda.jit(device=True)
def rotate(x1, x2, c, s):
    ### BEGIN SOLUTION
    return x1 * c - x2 * s, x2 * c + x1 * s
    ### END SOLUTION


@cuda.jit
def rope_v2(x, cos, sin, y, H, N, half, row_blocks, sxb, sxh, sxn, sxd, scn, scd, ssn, ssd,
            sign, interleaved):
    bh = cuda.blockIdx.x // row_blocks
    rb = cuda.blockIdx.x % row_blocks
    b = bh // H
    h = bh % H
    rows_per_block = cuda.blockDim.y * ROWS
    n0 = rb * rows_per_block + cuda.threadIdx.y
    xh = b * sxb + h * sxh
    yh = bh * N * 2 * half
    x1 = cuda.local.array(ROWS, float32)
    x2 = cuda.local.array(ROWS, float32)
    c = cuda.local.array(ROWS, float32)
    s = cuda.local.array(ROWS, float32)
    i = cuda.threadIdx.x
    while i < half:
        lo = 2 * i if interleaved else i
        hi = 2 * i + 1 if interleaved else i + half
        for r in range(ROWS):  # every load first ...
            n = n0 + r * cuda.blockDim.y
            ok = n < N
            x1[r] = x[xh + n * sxn + lo * sxd] if ok else 0.0
            x2[r] = x[xh + n * sxn + hi * sxd] if ok else 0.0
            c[r] = cos[n * scn + i * scd] if ok else 0.0
            s[r] = sign * sin[n * ssn + i * ssd] if ok else 0.0
        for r in range(ROWS):  # ... then the arithmetic and the stores
            n = n0 + r * cuda.blockDim.y
            if n < N:
                y1, y2 = rotate(x1[r], x2[r], c[r], s[r])
                y[yh + n * 2 * half + lo] = y1
                y[yh + n * 2 * half + hi] = y2
        i += cuda.blockDim.x


def rotate_all(x, cos, sin, interleaved: bool, sign: float):
    """y = x rotated by sign * theta: float32 tensors with any strides in, a contiguous
    (B, H, N, D) float32 tensor out (rope.cu's launch, version 2)."""
    B, H, N, D = x.shape
    if x.numel() == 0:  # no batch element, head or position: no launch (as rope_binding.cpp)
        return torch.empty((B, H, N, D), dtype=torch.float32, device=x.device)
    half = D // 2
    tx = 128 if half >= 128 else (64 if half >= 64 else 32)
    row_blocks = cdiv(N, THREAD_ROWS * ROWS)
    y = Output((B, H, N, D), x.device)
    launch(rope_v2, B * H * row_blocks, (tx, THREAD_ROWS), operand(x), operand(cos),
           operand(sin), y.array, H, N, half, row_blocks, *x.stride(), *cos.stride(),
           *sin.stride(), sign, interleaved)
    return y.finish()


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin, interleaved):
        ctx.save_for_backward(cos, sin)
        ctx.interleaved = interleaved
        return rotate_all(x, cos, sin, interleaved, 1.0)

    @staticmethod
    def backward(ctx, dy):
        cos, sin = ctx.saved_tensors
        return rotate_all(dy, cos, sin, ctx.interleaved, -1.0), None, None, None


def rope(x, cos, sin, interleaved=False):
    """Called by numba_kernels.level.rope after the contract (float32 tensors). Nothing is
    copied: x, the tables and the upstream gradient go in with their strides."""
    return _Rope.apply(x, cos, sin, bool(interleaved))
