"""RMSNorm in Triton: y = x / sqrt(mean(x^2) + eps) * weight, one pass over memory each way.

What it adds over layer_norm.py: less, and that is its lesson. RMSNorm (Zhang & Sennrich
2019; the norm of Llama, Mistral, Qwen) drops the centring and the bias: one statistic per
row (the mean square) instead of two, no bias to load, no dbias to reduce. The data
movement is what it was (read x, write y; read x and dy, write dx), so the floor is the
same: 2 bytes moved per byte of x forward, 3 backward. The kernels are layer_norm's minus
the lines the math no longer needs, and reuse its second-stage reduction.

Forward: each program owns BLOCK_M whole rows (BLOCK_N = the width rounded up to a power
of two, masked), sums x^2 in fp32 in registers and writes y once. 1/rms is saved (4 bytes a
row) when a backward will need it.

Backward: with xhat = x * rstd,
    dx = rstd * (w*dy - xhat * mean(w*dy * xhat))      (one row reduction, not two)
    dweight = sum_rows dy * xhat                        (a reduction across programs)
Each program loops over its chunk of rows, keeps its dweight partial sums in registers and
writes them to its row of a (programs, N) fp32 buffer; layer_norm's sum_partials_kernel adds
the rows up. No atomics: deterministic.

What it costs: a row must fit in registers (widths up to 65536, as layer_norm).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import layer_norm
from .launch import apply_ahead, cdiv, fast_launch, forward_ahead, needs_grad
from .layer_norm import (_backward_tiling, _n_programs, _rows, _tiling,
                         sum_partials_kernel)


@fast_launch
@triton.jit
def rms_norm_fwd_kernel(x_ptr,  # (M, N) rows, row stride stride_xm, columns adjacent
                        w_ptr,  # (N,) contiguous
                        y_ptr,  # (M, N) output, row stride stride_ym
                        rstd_ptr,  # (M,) fp32: 1/rms of each row (read by the backward)
                        M, N, stride_xm, stride_ym, eps,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        STATS: tl.constexpr):  # False under no_grad: nothing to save
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < M
    row_off = rows.to(tl.int64)  # 64-bit: M * N may exceed 2**31 (see layer_norm.py)
    col_ok = cols < N
    mask = row_ok[:, None] & col_ok[None, :]
    ### BEGIN SOLUTION
    x = tl.load(x_ptr + row_off[:, None] * stride_xm + cols[None, :], mask=mask, other=0.0)
    x = x.to(tl.float32)  # masked lanes are 0: they add nothing to the sum of squares
    ms = tl.sum(x * x, axis=1) / N
    rstd = 1.0 / tl.sqrt(ms + tl.cast(eps, tl.float32))  # tl.cast: Inductor passes fp64 eps
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    y = x * rstd[:, None] * w[None, :]
    tl.store(y_ptr + row_off[:, None] * stride_ym + cols[None, :], y.to(y_ptr.dtype.element_ty),
             mask=mask)
    if STATS:
        tl.store(rstd_ptr + rows, rstd, mask=row_ok)
    ### END SOLUTION


@fast_launch
@triton.jit
def rms_norm_bwd_kernel(x_ptr, w_ptr, dy_ptr, dx_ptr,  # rows as in the forward; w (N,)
                        rstd_ptr,  # (M,) fp32: the forward's 1/rms
                        part_ptr,  # (programs, N) fp32: dweight's partial sums
                        M, N, stride_xm, stride_dym, stride_dxm, rows_per_program,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    dw_acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    first = pid * rows_per_program
    for r in range(0, rows_per_program, BLOCK_M):
        rows = first + r + tl.arange(0, BLOCK_M)
        row_ok = rows < M
        row_off = rows.to(tl.int64)
        mask = row_ok[:, None] & col_ok[None, :]
        ### BEGIN SOLUTION
        x = tl.load(x_ptr + row_off[:, None] * stride_xm + cols[None, :], mask=mask,
                    other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + row_off[:, None] * stride_dym + cols[None, :], mask=mask,
                     other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + rows, mask=row_ok, other=0.0)
        xhat = x * rstd[:, None]  # 0 on masked lanes (x loaded as 0 there)
        wdy = dy * w[None, :]
        c1 = tl.sum(xhat * wdy, axis=1) / N
        dx = (wdy - xhat * c1[:, None]) * rstd[:, None]
        tl.store(dx_ptr + row_off[:, None] * stride_dxm + cols[None, :],
                 dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw_acc += tl.sum(dy * xhat, axis=0)
        ### END SOLUTION
    tl.store(part_ptr + pid * N + cols, dw_acc, mask=col_ok)


KERNELS = [rms_norm_fwd_kernel, rms_norm_bwd_kernel, sum_partials_kernel]


def uses_tf32(device, dtype) -> bool:
    return False  # no dot products


def _forward(x, weight, eps, save: bool, tiling=None):
    """(y, x2, rstd): the launch, without autograd. x2 is x's (M, N) row view (any row
    stride; a copy only where the last dimension is strided or the leading ones do not
    flatten); y is allocated contiguous in x's shape. Under no_grad no statistics are
    stored (the kernel gets y as a placeholder pointer it never writes through)."""
    N = x.shape[-1]
    x2 = _rows(x)
    M = x2.shape[0]
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rstd = x.new_empty((M,), dtype=torch.float32) if save else y
    if M == 0:
        return y, x2, rstd  # no rows: nothing to launch (an empty y, as F.rms_norm's)
    # (aligned=True: layer_norm's unaligned-row rule was measured for layer_norm only)
    BLOCK_M, BLOCK_N, num_warps = _tiling(N, tiling)
    rms_norm_fwd_kernel[(cdiv(M, BLOCK_M),)](
        x2, weight, y, rstd, M, N, x2.stride(0), N, eps,
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, STATS=save, num_warps=num_warps)
    return y, x2, rstd


def _backward(dy, x2, weight, rstd, backward_tiling=None):
    """(dx as (M, N), dweight): the two launches of the backward, without autograd."""
    M, N = x2.shape
    dy2 = _rows(dy)
    dx = x2.new_empty((M, N))
    if M == 0:  # no rows: dweight is a sum of nothing, and nothing is launched
        return dx, weight.new_zeros((N,))
    BLOCK_M, BLOCK_N, num_warps, per_sm = _backward_tiling(N, backward_tiling)
    programs = _n_programs(x2.device, M, BLOCK_M, per_sm)
    rows = cdiv(cdiv(M, programs), BLOCK_M) * BLOCK_M  # whole BLOCK_M groups: no shared row
    programs = cdiv(M, rows)
    parts = x2.new_empty((programs, N), dtype=torch.float32)
    rms_norm_bwd_kernel[(programs,)](
        x2, weight, dy2, dx, rstd, parts, M, N, x2.stride(0), dy2.stride(0), N, rows,
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, num_warps=num_warps)
    dweight = weight.new_empty((N,))
    RB_N, RB_P = layer_norm.partials_tile(N, programs, parts.device, 1)
    # grid axis 1 of size 1: sum_partials adds up its first (and here only) half
    sum_partials_kernel[(cdiv(N, RB_N), 1)](parts, dweight, programs, N, BLOCK_P=RB_P,
                                            BLOCK_N=RB_N)
    return dx, dweight


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, tiling=None, backward_tiling=None):
        y, x2, rstd = _forward(x, weight, eps, save=True, tiling=tiling)
        ctx.save_for_backward(x2, weight, rstd)
        ctx.x_shape = x.shape
        ctx.backward_tiling = backward_tiling
        return y

    @staticmethod
    def backward(ctx, dy):
        x2, weight, rstd = ctx.saved_tensors
        dx, dweight = _backward(dy, x2, weight, rstd, ctx.backward_tiling)
        return dx.reshape(ctx.x_shape), dweight, None, None, None


def check(x) -> None:
    """What only these kernels refuse (levels.triton runs it once per argument signature,
    after the contract): layer_norm's limits, rows too wide for registers and float64."""
    layer_norm.check(x, "rms_norm")


def rms_norm(x, weight, eps=1e-6, tiling=None, backward_tiling=None):
    """Called by levels.triton.rms_norm after the shared validation and `check`.

    tiling, backward_tiling: as layer_norm's (pin the forward's (BLOCK_M, num_warps) and the
    backward's (BLOCK_M, num_warps, programs per SM) for this call; `levels bench` sweeps).

    Layouts: x may have any strides (its (M, N) row view keeps a row stride, see _rows);
    weight is indexed `w_ptr + cols`, so it is made contiguous here (an N-element copy for a
    strided view; autograd carries its gradient back through the copy)."""
    weight = weight.contiguous()
    if needs_grad(x, weight):
        return apply_ahead(_RMSNorm, x, weight, eps, tiling, backward_tiling)
    return forward_ahead(_inference, x, weight, eps, tiling)


def _inference(x, weight, eps, tiling):
    """The forward of a call that computes no gradient (launch.forward_ahead replays it)."""
    return _forward(x, weight, eps, save=False, tiling=tiling)[0]
