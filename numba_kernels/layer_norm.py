"""LayerNorm, forward and backward: the numba twin of cuda_kernels/layer_norm.cu.

    y = (x - mean) * rstd * w + b,   mean = sum(x)/N,   rstd = 1/sqrt(sum((x-mean)^2)/N + eps)
    dx = rstd * (w*dy - mean(w*dy) - xhat * mean(w*dy*xhat)),   xhat = (x - mean) * rstd
    dw = sum_rows dy*xhat,   db = sum_rows dy

What it mirrors (layer_norm.cu unless said otherwise):
    block_sum           common.cuh: block_sum          a block-wide sum, every thread gets it
    block_sum2          block_sum2                      two sums for one set of barriers
    fwd_block_row       fwd_v3_loop with VEC = 1 (v3's block-per-row path): one block per
                        row, its threads striding over the row as fwd_v2's lanes do, two
                        block reductions (mean, then the centred variance: two passes, as
                        every C++ version)
    bwd_dx_block_row    bwd_dx_v2's math, a block per row, both row sums through block_sum2
                        (v3's bwd_v3_fused does the same)
    bwd_dwdb_partial    bwd_dwdb_partial_v2: stage 1 of dweight/dbias, P chunks of rows x
                        blocks of columns, each thread summing its column over its chunk
                        into a (P, N) fp32 buffer
    sum_partials        sum_partials: stage 2, the P partial rows summed per column.
                        Deterministic: no atomics, the same order every run.

What the simulator cannot do, and what the twin does instead:
  * No warp-level operations. The C++ adds a warp's 32 values in registers, 5 shuffles and
    no barrier, in common.cuh's warp_sum: the line
        for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    (offsets 16, 8, 4, 2, 1), and block_sum calls warp_sum twice around one
    shared-memory hop (3 barriers in all). The simulator has no __shfl_*, so block_sum
    here is the shared-memory tree: the same halving offsets, every step a read of a
    neighbour's partial from shared memory and a cuda.syncthreads() before the next step.
    On a GPU that is log2(blockDim) + 2 barriers where the C++ pays 3: the cost of having
    no warp primitives, and why v2 and v3 use them.
  * No 16-byte vector loads and no row held in registers (v3's fast path): the twin walks
    the row in memory twice more, as fwd_v3_loop does when v3 cannot vectorize.
  * No timing: the simulator runs one block after another, each CUDA thread an OS thread,
    roughly a million times slower than the GPU. It checks correctness only; the H100
    figures are in layer_norm.cu's header.
  * Where the C++ launcher copies (x strided along its last dimension, a strided weight),
    the twin passes the stride instead: see binding.py.

Launch plan (the C++'s constants are for an H100; the twin's are chosen so that tiny
shapes stay tiny in the simulator, where every thread is an OS thread and every barrier a
round of Python polling; the algorithms do not change):
    rows:     one block of `row_threads(N)` threads per row (a power of two, 32..256, about
              8 elements a thread; the C++ v3 uses N/8 threads up to 512 for fp32)
    stage 1:  PARTIAL_THREADS (32; C++ 256) columns per block, `partial_rows(M, N)` chunks
    stage 2:  SUM_COLS (32) columns x SUM_LANES (4; C++ 16) partial rows per block
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from numba import cuda, float32

from .binding import Output, cdiv, launch, operand

MAX_ROW_THREADS = 256   # the widest block of the row kernels (their shared scratch size)
PARTIAL_THREADS = 32    # stage 1: columns per block (C++: 256)
PARTIAL_BLOCKS = 16     # stage 1: about this many blocks in all (C++: 8 per SM)
SUM_COLS = 32           # stage 2: columns per block ...
SUM_LANES = 4           # ... and partial rows summed in parallel per column (C++: 16)
SUM_PADDED = SUM_COLS + 1  # +1: no bank conflicts (shared-array shapes are constants)


# =====================================================================================
# Block reductions (the shared-memory stand-ins for warp_sum + block_sum)
# =====================================================================================

@cuda.jit(device=True)
def block_sum(v, scratch):
    """Sum of `v` over the block's threads; every thread gets it. blockDim.x must be a
    power of two (the launcher's row_threads makes it so); scratch holds blockDim.x floats.
    Call from every thread of the block: it has barriers."""
    t = cuda.threadIdx.x
    cuda.syncthreads()  # scratch may still be read by a previous call (as in common.cuh)
    scratch[t] = v
    cuda.syncthreads()
    # The tree: at each step the lower half adds the upper half's partials. warp_sum does
    # these same offsets (16, 8, 4, 2, 1) with __shfl_xor_sync, in registers, unsynchronized.
    offset = cuda.blockDim.x // 2
    while offset > 0:
        if t < offset:
            scratch[t] += scratch[t + offset]
        cuda.syncthreads()  # the next step reads what this one wrote
        offset //= 2
    return scratch[0]


@cuda.jit(device=True)
def block_sum2(a, b, scratch_a, scratch_b):
    """Two block-wide sums for the price of one set of barriers (layer_norm.cu's block_sum2,
    which packs them in a float2 through the same shuffles)."""
    t = cuda.threadIdx.x
    cuda.syncthreads()
    scratch_a[t] = a
    scratch_b[t] = b
    cuda.syncthreads()
    offset = cuda.blockDim.x // 2
    while offset > 0:
        if t < offset:
            scratch_a[t] += scratch_a[t + offset]
            scratch_b[t] += scratch_b[t + offset]
        cuda.syncthreads()
        offset //= 2
    return scratch_a[0], scratch_b[0]


# =====================================================================================
# The two kernels that reduce along a row, built around the block reductions
# =====================================================================================

class RowKernels(NamedTuple):
    fwd: object     # fwd_block_row
    bwd_dx: object  # bwd_dx_block_row


def row_kernels(block_sum=block_sum, block_sum2=block_sum2) -> RowKernels:
    """The forward and dx kernels, compiled around the given block reductions (a notebook
    exercise passes its own block_sum; on a GPU numba compiles the one it is given in).
    `ROW_KERNELS` is the twin's own."""

    @cuda.jit
    def fwd_block_row(x, stride_xm, stride_xn,  # (M, N) view
                      weight, stride_w,         # (N,)
                      bias, stride_b,           # (N,)
                      y,                        # (M, N) contiguous
                      mean_out, rstd_out,       # (M,)
                      M, N, eps):
        scratch = cuda.shared.array(MAX_ROW_THREADS, float32)
        row = cuda.blockIdx.x  # one block per row: the whole block runs every barrier
        t = cuda.threadIdx.x
        xr = row * stride_xm
        ### BEGIN SOLUTION
        total = float32(0.0)
        for i in range(t, N, cuda.blockDim.x):  # fwd_v2's lane stride: neighbours read neighbours
            total += x[xr + i * stride_xn]
        mean = block_sum(total, scratch) / N
        sq = float32(0.0)
        for i in range(t, N, cuda.blockDim.x):
            d = x[xr + i * stride_xn] - mean
            sq += d * d
        rstd = 1.0 / math.sqrt(block_sum(sq, scratch) / N + eps)
        for i in range(t, N, cuda.blockDim.x):
            y[row * N + i] = (x[xr + i * stride_xn] - mean) * rstd * weight[i * stride_w] + bias[i * stride_b]
        if t == 0:
            mean_out[row] = mean
            rstd_out[row] = rstd
        ### END SOLUTION

    @cuda.jit
    def bwd_dx_block_row(dy, stride_dym, stride_dyn,  # (M, N) view
                         x, stride_xm, stride_xn,     # (M, N) view
                         weight, stride_w,            # (N,)
                         mean, rstd,                  # (M,): the forward's
                         dx,                          # (M, N) contiguous
                         M, N):
        scratch_a = cuda.shared.array(MAX_ROW_THREADS, float32)
        scratch_b = cuda.shared.array(MAX_ROW_THREADS, float32)
        row = cuda.blockIdx.x
        t = cuda.threadIdx.x
        xr = row * stride_xm
        dyr = row * stride_dym
        mu = mean[row]
        rs = rstd[row]
        ### BEGIN SOLUTION
        c1 = float32(0.0)
        c2 = float32(0.0)
        for i in range(t, N, cuda.blockDim.x):
            xhat = (x[xr + i * stride_xn] - mu) * rs
            wdy = weight[i * stride_w] * dy[dyr + i * stride_dyn]
            c1 += xhat * wdy
            c2 += wdy
        c1, c2 = block_sum2(c1, c2, scratch_a, scratch_b)
        c1 = c1 / N
        c2 = c2 / N
        for i in range(t, N, cuda.blockDim.x):
            xhat = (x[xr + i * stride_xn] - mu) * rs
            wdy = weight[i * stride_w] * dy[dyr + i * stride_dyn]
            dx[row * N + i] = (wdy - xhat * c1 - c2) * rs
        ### END SOLUTION

    return RowKernels(fwd_block_row, bwd_dx_block_row)


ROW_KERNELS = row_kernels()


# =====================================================================================
# dweight, dbias in two stages (no reduction across threads: no barrier in stage 1)
# =====================================================================================

@cuda.jit
def bwd_dwdb_partial(dy, stride_dym, stride_dyn,
                     x, stride_xm, stride_xn,
                     mean, rstd,
                     part_dw, part_db,  # (P, N) contiguous
                     M, N, rows_per_chunk):
    col = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if col >= N:
        return  # no barrier below: a thread past the edge may leave
    p = cuda.blockIdx.y
    first = p * rows_per_chunk
    # The C++'s ternary, not min(): numba 0.68's CUDA target does not compile the builtin
    # min/max of two numbers (cuda.compile_ptx rejects their generic overload).
    last = first + rows_per_chunk if first + rows_per_chunk < M else M
    ### BEGIN SOLUTION
    dw = float32(0.0)
    db = float32(0.0)
    for m in range(first, last):
        g = dy[m * stride_dym + col * stride_dyn]
        dw += g * (x[m * stride_xm + col * stride_xn] - mean[m]) * rstd[m]
        db += g
    part_dw[p * N + col] = dw
    part_db[p * N + col] = db
    ### END SOLUTION


@cuda.jit
def sum_partials(part_dw, part_db,  # (P, N) contiguous
                 dweight, dbias,    # (N,) contiguous
                 P, N):
    s_dw = cuda.shared.array((SUM_LANES, SUM_PADDED), float32)
    s_db = cuda.shared.array((SUM_LANES, SUM_PADDED), float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    col = cuda.blockIdx.x * SUM_COLS + tx
    dw = float32(0.0)
    db = float32(0.0)
    if col < N:
        for p in range(ty, P, SUM_LANES):
            dw += part_dw[p * N + col]
            db += part_db[p * N + col]
    s_dw[ty, tx] = dw
    s_db[ty, tx] = db
    cuda.syncthreads()
    if ty == 0 and col < N:
        for i in range(1, SUM_LANES):
            dw += s_dw[i, tx]
            db += s_db[i, tx]
        dweight[col] = dw
        dbias[col] = db


# =====================================================================================
# Launchers (no autograd): torch float32 tensors in and out
# =====================================================================================

def row_threads(N: int) -> int:
    """Threads per row: a power of two (block_sum's tree halves it), about 8 elements each,
    at least a warp, at most MAX_ROW_THREADS."""
    want = cdiv(N, 8)
    threads = 32
    while threads < want and threads < MAX_ROW_THREADS:
        threads *= 2
    return threads


def partial_rows(M: int, N: int) -> int:
    """P, the chunks of rows of stage 1 (layer_norm.cu's v2_partials, with "8 blocks per
    SM" replaced by a fixed PARTIAL_BLOCKS: the simulator has no SMs)."""
    return min(M, cdiv(PARTIAL_BLOCKS, cdiv(N, PARTIAL_THREADS)))


def layer_norm_fwd(x2, weight, bias, eps, kernels: RowKernels = ROW_KERNELS):
    """y (M, N) contiguous, mean (M,), rstd (M,) of an (M, N) x2 with any strides."""
    M, N = x2.shape
    if M == 0:  # no rows: nothing to launch (layer_norm_binding.cpp returns before it too)
        return x2.new_empty((0, N)), x2.new_empty((0,)), x2.new_empty((0,))
    y = Output((M, N), x2.device)
    mean = Output((M,), x2.device)
    rstd = Output((M,), x2.device)
    launch(kernels.fwd, M, row_threads(N),
           operand(x2), *x2.stride(), operand(weight), weight.stride(0), operand(bias), bias.stride(0),
           y.array, mean.array, rstd.array, M, N, float(eps))
    return y.finish(), mean.finish(), rstd.finish()


def layer_norm_bwd(dy2, x2, weight, mean, rstd, kernels: RowKernels = ROW_KERNELS):
    """dx (M, N) contiguous, dweight (N,), dbias (N,)."""
    M, N = x2.shape
    device = x2.device
    if M == 0:  # no rows: dweight and dbias are sums of nothing (zeros, as the binding's)
        zeros = torch.zeros((2, N), dtype=torch.float32, device=device)
        return x2.new_empty((0, N)), zeros[0], zeros[1]
    dy_a, x_a, mean_a, rstd_a = operand(dy2), operand(x2), operand(mean), operand(rstd)
    dx = Output((M, N), device)
    launch(kernels.bwd_dx, M, row_threads(N),
           dy_a, *dy2.stride(), x_a, *x2.stride(), operand(weight), weight.stride(0), mean_a, rstd_a,
           dx.array, M, N)
    P = partial_rows(M, N)
    rows_per = cdiv(M, P)
    used = cdiv(M, rows_per)  # chunks that hold rows: each writes its partial row
    part_dw, part_db = Output((used, N), device), Output((used, N), device)
    launch(bwd_dwdb_partial, (cdiv(N, PARTIAL_THREADS), used), PARTIAL_THREADS,
           dy_a, *dy2.stride(), x_a, *x2.stride(), mean_a, rstd_a, part_dw.array, part_db.array,
           M, N, rows_per)
    dweight, dbias = Output((N,), device), Output((N,), device)
    launch(sum_partials, cdiv(N, SUM_COLS), (SUM_COLS, SUM_LANES),
           part_dw.array, part_db.array, dweight.array, dbias.array, used, N)
    return dx.finish(), dweight.finish(), dbias.finish()


class _LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, weight, bias, eps, kernels):
        y, mean, rstd = layer_norm_fwd(x2, weight, bias, eps, kernels)
        ctx.save_for_backward(x2, weight, mean, rstd)
        ctx.kernels = kernels
        return y

    @staticmethod
    def backward(ctx, dy):
        x2, weight, mean, rstd = ctx.saved_tensors
        dx, dweight, dbias = layer_norm_bwd(dy, x2, weight, mean, rstd, ctx.kernels)
        return dx, dweight, dbias, None, None


def layer_norm(x, weight, bias, eps=1e-5, *, kernels: RowKernels = ROW_KERNELS):
    """y = LayerNorm(x) over the last dimension, float32 tensors (validated by the caller:
    numba_kernels.level). Differentiable: backward runs the twin's backward kernels.

    Copies: x is viewed as (M, N) by reshape, a view whenever its leading dimensions merge
    into one row stride (always for contiguous x and for row slices), else one copy. Nothing
    else is copied: weight, bias, x and the upstream gradient go in with their strides."""
    N = x.shape[-1]
    y = _LayerNorm.apply(x.reshape(-1, N), weight, bias, eps, kernels)
    return y.view(x.shape)
