"""GEMM with a fused epilogue, column sums, and the MLP built on them: the numba twin of
cuda_kernels/gemm.cu version 2 and of cuda_kernels/mlp.py.

    C[M,N] = epilogue(A[M,K] . B[K,N] (+ bias[n]))
    EPI_NONE       c = acc (+ bias[n])
    EPI_GELU       c = GELU(acc + bias[n])                 exact GELU (erf), as gemm.cu
    EPI_GELU_SAVE  aux = acc + bias[n]; c = GELU(aux)      the pre-activation backward needs
    EPI_GELU_GRAD  c = acc * GELU'(aux[m, n])              dH = (dY . W2) * GELU'(H)

What it mirrors (gemm.cu unless said otherwise):
    gelu, gelu_grad, finish   gelu, gelu_grad, finish: the epilogue of one output element,
                              applied to the fp32 accumulator before its single store
    gemm_tiled                gemm_v2_kernel: a TILE x TILE block of threads (TILE = 32, as
                              V2_TILE) stages a tile of A and of B in shared memory, barrier,
                              TILE FMAs per thread from shared memory, barrier, next K tile.
                              Every global element is read once per tile instead of once per
                              thread. The same 1-D grid (blockIdx.x / tiles_n), the same +1
                              padding column, the same coalescing choice of which thread
                              loads which element (a_k_fast, b_n_fast)
    column_sum                column_sum_kernel: x.sum(0) in fp32 (bias gradients), a block
                              per 32 columns, partial sums folded through shared memory; no
                              atomics, deterministic
    mlp                       cuda_kernels/mlp.py: bias + GELU ride in the first GEMM's
                              epilogue (which also stores H for backward); backward is the
                              same five GEMMs and two column sums (_mlp_backward): dW2 = dY^T G,
                              db2 = colsum dY, dH = (dY W2) * GELU'(H), dX = dH W1,
                              dW1 = dH^T X, db1 = colsum dH. No torch matmul anywhere.

What the simulator cannot do, and what the twin does instead:
  * No timing, no tensor cores, no cp.async: the rungs above version 2 (register tiles,
    mma.sync fed by ldmatrix through a cp.async pipeline, Hopper's wgmma) are about speed
    on real hardware, which the simulator cannot show; version 2 is the rung whose idea
    (shared-memory tiles, and the two barriers that make them safe) runs the same on both.
  * Each CUDA thread is an OS thread: a 32x32 tile is a block of 1024 threads, about a
    second of simulation per block. `gemm_kernels(tile)` builds the same kernel for a
    smaller tile (8 x 8 = 64 threads): the level runs gemm.cu's 32 unless asked
    (`level.mlp(..., tile=8)`), the tests run both, the notebook 8 (it has a minute).
  * Strides: as the C++, every operand is taken with its element strides (transposed
    views, slices, no copies); binding.py passes them as 1-D spans.
  * Not here: gemm.cu's `accumulate` (C +=, for the LSTM) and fp32 output of 16-bit inputs
    (c_fp32): the twins compute and store float32 throughout.

fmaf: the C++ accumulates with fmaf (one rounding per multiply-add); `cuda.fma` is the same
instruction on a GPU (the simulator computes a*b + c in float32, two roundings: within
float32's bound all the same).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch
from numba import cuda, float32

from .binding import Output, cdiv, dummy, launch, operand

TILE = 32             # gemm.cu: V2_TILE
COLSUM_COLS = 32      # column_sum: columns per block (a warp reads 32 neighbouring columns)
COLSUM_ROWS = 8       # ... and threads striding down the rows per column (C++: 32)
COLSUM_PADDED = COLSUM_COLS + 1  # shared-array shapes are constants, not expressions

EPI_NONE, EPI_GELU, EPI_GELU_SAVE, EPI_GELU_GRAD = 0, 1, 2, 3
EPILOGUES = {"none": EPI_NONE, "gelu": EPI_GELU, "gelu_save": EPI_GELU_SAVE, "gelu_grad": EPI_GELU_GRAD}


@cuda.jit(device=True)
def gelu(v):
    ### BEGIN SOLUTION
    return 0.5 * v * (1.0 + math.erf(v * 0.7071067811865476))
    ### END SOLUTION


@cuda.jit(device=True)
def gelu_grad(v):
    # d/dx [x Phi(x)] = Phi(x) + x phi(x)
    ### BEGIN SOLUTION
    cdf = 0.5 * (1.0 + math.erf(v * 0.7071067811865476))
    pdf = math.exp(-0.5 * v * v) * 0.3989422804014327
    return cdf + v * pdf
    ### END SOLUTION


@cuda.jit(device=True)
def finish(v, m, n,
           c, stride_cm, stride_cn,
           bias, stride_bias, has_bias,
           aux, stride_xm, stride_xn,
           kind):
    """The epilogue of one output element (m, n), both in range."""
    if has_bias:
        v += bias[n * stride_bias]
    if kind == EPI_GELU_SAVE:
        aux[m * stride_xm + n * stride_xn] = v
    if kind == EPI_GELU or kind == EPI_GELU_SAVE:
        v = gelu(v)
    if kind == EPI_GELU_GRAD:
        v *= gelu_grad(aux[m * stride_xm + n * stride_xn])
    c[m * stride_cm + n * stride_cn] = v


class GemmKernels(NamedTuple):
    tile: int
    gemm: object  # gemm_tiled for this tile


@functools.cache
def gemm_kernels(tile: int = TILE) -> GemmKernels:
    """gemm_tiled for a `tile` x `tile` block (the tile is a compile-time constant: it sizes
    the shared arrays). gemm_kernels() is gemm.cu's version 2."""
    if tile < 1:
        raise ValueError(f"gemm_kernels: argument 'tile' must be a positive int; got {tile!r}")
    # Shared-array shapes must be compile-time constants: plain ints captured by the kernel
    # (numba freezes them), computed here rather than as expressions inside it.
    padded = tile + 1

    @cuda.jit
    def gemm_tiled(A, stride_am, stride_ak,     # (M, K) view
                   B, stride_bk, stride_bn,     # (K, N) view (pass w.t() for nn.Linear's w)
                   M, N, K,
                   c, stride_cm, stride_cn,     # (M, N) output
                   bias, stride_bias, has_bias,  # (N,) or a dummy with has_bias = False
                   aux, stride_xm, stride_xn,   # (M, N): written (GELU_SAVE) or read (GELU_GRAD)
                   kind):
        # +1 column of padding: the transposed stores below (a column per warp) hit 32 banks.
        As = cuda.shared.array((tile, padded), float32)  # [m][k]
        Bs = cuda.shared.array((tile, padded), float32)  # [k][n]
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        tiles_n = (N + tile - 1) // tile
        m0 = (cuda.blockIdx.x // tiles_n) * tile
        n0 = (cuda.blockIdx.x % tiles_n) * tile
        # Coalescing: the threads of a warp (same ty, consecutive tx) must walk the operand's
        # contiguous dimension. A is (M,K): along k if stride_ak == 1, else along m. B is
        # (K,N): along n if stride_bn == 1 (B row-major), else along k (W^T of nn.Linear).
        a_k_fast = stride_ak == 1
        b_n_fast = stride_bn == 1 or stride_bk != 1
        acc = float32(0.0)
        for k0 in range(0, K, tile):
            r = ty if a_k_fast else tx
            kk = tx if a_k_fast else ty
            m = m0 + r
            k = k0 + kk
            As[r, kk] = A[m * stride_am + k * stride_ak] if (m < M and k < K) else 0.0
            kk = ty if b_n_fast else tx
            cn = tx if b_n_fast else ty
            k = k0 + kk
            n = n0 + cn
            Bs[kk, cn] = B[k * stride_bk + n * stride_bn] if (k < K and n < N) else 0.0
            cuda.syncthreads()  # the tiles are complete before anyone reads them
            for kk in range(tile):
                acc = cuda.fma(As[ty, kk], Bs[kk, tx], acc)
            cuda.syncthreads()  # the next iteration overwrites the tiles
        m = m0 + ty
        n = n0 + tx
        if m < M and n < N:
            finish(acc, m, n, c, stride_cm, stride_cn, bias, stride_bias, has_bias,
                   aux, stride_xm, stride_xn, kind)

    return GemmKernels(tile, gemm_tiled)


@cuda.jit
def column_sum_kernel(x, stride_xm, stride_xn,  # (M, N) view
                      out,                      # (N,) contiguous
                      M, N):
    part = cuda.shared.array((COLSUM_ROWS, COLSUM_PADDED), float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    n = cuda.blockIdx.x * COLSUM_COLS + tx
    s = float32(0.0)
    if n < N:
        for m in range(ty, M, COLSUM_ROWS):
            s += x[m * stride_xm + n * stride_xn]
    part[ty, tx] = s
    cuda.syncthreads()
    if ty == 0 and n < N:
        total = float32(0.0)
        for i in range(COLSUM_ROWS):
            total += part[i, tx]
        out[n] = total


# =====================================================================================
# Launchers (no autograd): torch float32 tensors in and out
# =====================================================================================

def gemm(a, b, bias=None, epilogue="none", aux=None, *, kernels: GemmKernels | None = None):
    """epilogue(a @ b [+ bias]) of float32 a (M, K), b (K, N), both with any strides (pass
    `w.t()` for an nn.Linear weight w). Returns a new contiguous (M, N) tensor, or
    (act, pre) for "gelu_save"; "gelu_grad" reads the pre-activation `aux`."""
    kernels = kernels or gemm_kernels()
    if epilogue not in EPILOGUES:
        raise ValueError(f"gemm: argument 'epilogue' must be one of {tuple(EPILOGUES)}; got {epilogue!r}")
    if (aux is not None) != (epilogue == "gelu_grad"):
        raise ValueError("gemm: argument 'aux' (the pre-activation) is given with epilogue='gelu_grad' "
                         "and only then")
    M, K = a.shape
    N = b.shape[1]
    if M == 0 or N == 0 or (K == 0 and bias is None and epilogue == "none"):
        # As mlp_binding.cpp's matmul_into: an empty output (a batch of 0 rows) has nothing to
        # write, a plain sum over K = 0 terms (a weight gradient over no rows) is 0; no launch
        c = torch.zeros((M, N), dtype=torch.float32, device=a.device)
        return (c, c.clone()) if epilogue == "gelu_save" else c
    c = Output((M, N), a.device)
    if epilogue == "gelu_save":
        pre = Output((M, N), a.device)
        aux_array, aux_strides = pre.array, (N, 1)
    elif epilogue == "gelu_grad":
        pre = None
        aux_array, aux_strides = operand(aux), aux.stride()
    else:
        pre = None
        aux_array, aux_strides = dummy(a.device), (0, 0)
    bias_array = operand(bias) if bias is not None else dummy(a.device)
    tile = kernels.tile
    launch(kernels.gemm, cdiv(M, tile) * cdiv(N, tile), (tile, tile),
           operand(a), *a.stride(), operand(b), *b.stride(), M, N, K,
           c.array, N, 1, bias_array, bias.stride(0) if bias is not None else 0, bias is not None,
           aux_array, *aux_strides, EPILOGUES[epilogue])
    if pre is not None:
        return c.finish(), pre.finish()
    return c.finish()


def column_sum(x):
    """x.sum(0) of a float32 (M, N) x with any strides, accumulated in float32."""
    M, N = x.shape
    if M == 0:  # no rows (a batch of 0): a sum of nothing, no launch (as mlp_binding.cpp)
        return torch.zeros((N,), dtype=torch.float32, device=x.device)
    out = Output((N,), x.device)
    launch(column_sum_kernel, cdiv(N, COLSUM_COLS), (COLSUM_COLS, COLSUM_ROWS),
           operand(x), *x.stride(), out.array, M, N)
    return out.finish()


# =====================================================================================
# The MLP: cuda_kernels/mlp.py's composition, on the twin's GEMM
# =====================================================================================

class _MLP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, w1, b1, w2, b2, kernels):
        act, pre = gemm(x2, w1.t(), b1, "gelu_save", kernels=kernels)  # mlp_fwd's first GEMM
        out = gemm(act, w2.t(), b2, kernels=kernels)                    # ... and its second
        ctx.save_for_backward(x2, w1, w2, pre, act)
        ctx.kernels = kernels
        return out

    @staticmethod
    def backward(ctx, dy):
        # cuda_kernels/mlp.py: _mlp_backward, GEMM for GEMM
        x2, w1, w2, pre, act = ctx.saved_tensors
        k = ctx.kernels
        needs = ctx.needs_input_grad
        dx = dw1 = db1 = dw2 = db2 = None
        if needs[3]:
            dw2 = gemm(dy.t(), act, kernels=k)                                # dW2 = dY^T G
        if needs[4]:
            db2 = column_sum(dy)
        if needs[0] or needs[1] or needs[2]:
            dh = gemm(dy, w2, epilogue="gelu_grad", aux=pre, kernels=k)     # dH = (dY W2) * GELU'(H)
            if needs[0]:
                dx = gemm(dh, w1, kernels=k)                                  # dX = dH W1
            if needs[1]:
                dw1 = gemm(dh.t(), x2, kernels=k)                             # dW1 = dH^T X
            if needs[2]:
                db1 = column_sum(dh)
        return dx, dw1, db1, dw2, db2, None


def mlp(x, w1, b1, w2, b2, *, kernels: GemmKernels | None = None):
    """linear -> exact GELU -> linear of float32 tensors (validated by the caller:
    numba_kernels.level), weights as nn.Linear's. Differentiable: backward runs the twin's
    GEMMs and column sums.

    Copies: x (..., K) is viewed as (M, K) by reshape, a view whenever its leading
    dimensions merge into one row stride (always for contiguous x and row slices), else one
    copy. Nothing else: w1, w2 (transposed or not), b1, b2 and the upstream gradient go in
    with their strides."""
    K, N = x.shape[-1], w2.shape[0]
    out = _MLP.apply(x.reshape(-1, K), w1, b1, w2, b2, kernels or gemm_kernels())
    return out.view(*x.shape[:-1], N)
