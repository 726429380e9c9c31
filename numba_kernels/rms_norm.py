"""RMSNorm, forward and backward: the numba twin of cuda_kernels/rms_norm.cu.

    y = x * rstd * w,   rstd = 1/sqrt(sum(x^2)/N + eps)
    dx = rstd * (w*dy - xhat * mean(w*dy*xhat)),   xhat = x * rstd
    dw = sum_rows dy * xhat

What it mirrors (rms_norm.cu unless said otherwise), built as the layer_norm twin is
(numba_kernels/layer_norm.py: why a block per row, why the shared-memory tree for the
reductions, what the simulator cannot do) and reusing its block_sum and launch plan:
    fwd_block_row       fwd_v2's math (a row's sum of squares, then y), a block per row and
                        one block reduction instead of a warp's shuffles
    bwd_dx_block_row    bwd_dx_v2's math, a block per row: one row sum, mean(w*dy*xhat)
    bwd_dw_partial      bwd_dw_partial_v2: stage 1 of dweight, P chunks of rows x blocks of
                        columns into a (P, N) fp32 buffer
    sum_partials        sum_partials: stage 2, the P partial rows summed per column, in the
                        same order every run (no atomics)
"""

from __future__ import annotations

import math

import torch
from numba import cuda, float32

from .binding import Output, cdiv, launch, operand
from .layer_norm import (MAX_ROW_THREADS, PARTIAL_THREADS, SUM_COLS, SUM_LANES, SUM_PADDED,
                         block_sum, partial_rows, row_threads)


@cuda.jit
def fwd_block_row(x, stride_xm, stride_xn,  # (M, N) view
                  weight, stride_w,         # (N,)
                  y,                        # (M, N) contiguous
                  rstd_out,                 # (M,)
                  M, N, eps):
    scratch = cuda.shared.array(MAX_ROW_THREADS, float32)
    row = cuda.blockIdx.x  # one block per row: the whole block runs every barrier
    t = cuda.threadIdx.x
    xr = row * stride_xm
    ### BEGIN SOLUTION
    sq = float32(0.0)
    for i in range(t, N, cuda.blockDim.x):  # neighbouring threads read neighbouring elements
        v = x[xr + i * stride_xn]
        sq += v * v
    rstd = 1.0 / math.sqrt(block_sum(sq, scratch) / N + eps)
    for i in range(t, N, cuda.blockDim.x):
        y[row * N + i] = x[xr + i * stride_xn] * rstd * weight[i * stride_w]
    if t == 0:
        rstd_out[row] = rstd
    ### END SOLUTION


@cuda.jit
def bwd_dx_block_row(dy, stride_dym, stride_dyn,  # (M, N) view
                     x, stride_xm, stride_xn,     # (M, N) view
                     weight, stride_w,            # (N,)
                     rstd,                        # (M,): the forward's
                     dx,                          # (M, N) contiguous
                     M, N):
    scratch = cuda.shared.array(MAX_ROW_THREADS, float32)
    row = cuda.blockIdx.x
    t = cuda.threadIdx.x
    xr = row * stride_xm
    dyr = row * stride_dym
    rs = rstd[row]
    ### BEGIN SOLUTION
    c1 = float32(0.0)
    for i in range(t, N, cuda.blockDim.x):
        c1 += x[xr + i * stride_xn] * rs * weight[i * stride_w] * dy[dyr + i * stride_dyn]
    c1 = block_sum(c1, scratch) / N
    for i in range(t, N, cuda.blockDim.x):
        xhat = x[xr + i * stride_xn] * rs
        dx[row * N + i] = (weight[i * stride_w] * dy[dyr + i * stride_dyn] - xhat * c1) * rs
    ### END SOLUTION


@cuda.jit
def bwd_dw_partial(dy, stride_dym, stride_dyn,
                   x, stride_xm, stride_xn,
                   rstd,
                   part_dw,  # (P, N) contiguous
                   M, N, rows_per_chunk):
    col = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if col >= N:
        return  # no barrier below: a thread past the edge may leave
    p = cuda.blockIdx.y
    first = p * rows_per_chunk
    last = first + rows_per_chunk if first + rows_per_chunk < M else M  # (no builtin min)
    ### BEGIN SOLUTION
    dw = float32(0.0)
    for m in range(first, last):
        dw += dy[m * stride_dym + col * stride_dyn] * x[m * stride_xm + col * stride_xn] * rstd[m]
    part_dw[p * N + col] = dw
    ### END SOLUTION


@cuda.jit
def sum_partials(part_dw,  # (P, N) contiguous
                 dweight,  # (N,) contiguous
                 P, N):
    s_dw = cuda.shared.array((SUM_LANES, SUM_PADDED), float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    col = cuda.blockIdx.x * SUM_COLS + tx
    dw = float32(0.0)
    if col < N:
        for p in range(ty, P, SUM_LANES):
            dw += part_dw[p * N + col]
    s_dw[ty, tx] = dw
    cuda.syncthreads()
    if ty == 0 and col < N:
        for i in range(1, SUM_LANES):
            dw += s_dw[i, tx]
        dweight[col] = dw


KERNELS = (fwd_block_row, bwd_dx_block_row, bwd_dw_partial, sum_partials)


def rms_norm_fwd(x2, weight, eps):
    """y (M, N) contiguous and rstd (M,) of an (M, N) x2 with any strides."""
    M, N = x2.shape
    if M == 0:  # no rows: nothing to launch (rms_norm_binding.cpp returns before it too)
        return x2.new_empty((0, N)), x2.new_empty((0,))
    y, rstd = Output((M, N), x2.device), Output((M,), x2.device)
    launch(fwd_block_row, M, row_threads(N), operand(x2), *x2.stride(), operand(weight),
           weight.stride(0), y.array, rstd.array, M, N, float(eps))
    return y.finish(), rstd.finish()


def rms_norm_bwd(dy2, x2, weight, rstd):
    """dx (M, N) contiguous and dweight (N,)."""
    M, N = x2.shape
    device = x2.device
    if M == 0:  # no rows: dweight is a sum of nothing (zeros, as the binding's), no launch
        return x2.new_empty((0, N)), torch.zeros((N,), dtype=torch.float32, device=device)
    dy_a, x_a, rstd_a = operand(dy2), operand(x2), operand(rstd)
    dx = Output((M, N), device)
    launch(bwd_dx_block_row, M, row_threads(N), dy_a, *dy2.stride(), x_a, *x2.stride(),
           operand(weight), weight.stride(0), rstd_a, dx.array, M, N)
    rows_per = cdiv(M, partial_rows(M, N))
    used = cdiv(M, rows_per)  # chunks that hold rows: each writes its partial row
    part_dw = Output((used, N), device)
    launch(bwd_dw_partial, (cdiv(N, PARTIAL_THREADS), used), PARTIAL_THREADS,
           dy_a, *dy2.stride(), x_a, *x2.stride(), rstd_a, part_dw.array, M, N, rows_per)
    dweight = Output((N,), device)
    launch(sum_partials, cdiv(N, SUM_COLS), (SUM_COLS, SUM_LANES), part_dw.array,
           dweight.array, used, N)
    return dx.finish(), dweight.finish()


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, weight, eps):
        y, rstd = rms_norm_fwd(x2, weight, eps)
        ctx.save_for_backward(x2, weight, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        dx, dweight = rms_norm_bwd(dy, *ctx.saved_tensors)
        return dx, dweight, None


def rms_norm(x, weight, eps=1e-6):
    """y = RMSNorm(x) over the last dimension, float32 tensors (validated by the caller:
    numba_kernels.level). x is viewed as (M, N) by reshape (a copy only when its leading
    dimensions do not merge into one row stride); weight, x and the upstream gradient go in
    with their strides, as in the layer_norm twin."""
    N = x.shape[-1]
    return _RMSNorm.apply(x.reshape(-1, N), weight, eps).view(x.shape)
