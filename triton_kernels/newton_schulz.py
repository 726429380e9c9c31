"""Newton-Schulz orthogonalization (Muon's) in Triton: a chain of GEMMs that knows its
matrices are symmetric.

Each of the `steps` iterations is X <- aX + (bA + cA^2)X with A = X X^T, on X (m, n), m <= n.
Level 1 runs it as three cuBLAS GEMMs and three pointwise passes a step. What this file adds:

- Symmetry, half the work. A = X X^T is symmetric, and so is B = bA + cA^2 (a polynomial
  in A; A^2 = A A^T because A = A^T). A GEMM computes every (i, j) tile of its output;
  `sym_kernel` launches one program per tile on or below the diagonal, m_t (m_t + 1) / 2
  of the m_t^2 tiles, and each program stores its tile twice: at (i, j) and, transposed,
  at (j, i). The two symmetric products, 2 m^2 n + 2 m^3 of a step's 4 m^2 n + 2 m^3 FLOPs,
  then cost about half: at m = n a step drops from 6 m^3 to about 4 m^3 multiply-adds.
  Where X is larger than L2 the tiles are launched in bands of SYM_GROUP tile rows
  (`banded_lower_tile`), so a wave of programs re-reads fewer of X's panels from DRAM
  (4096 x 11008 bf16: 1.62x torch.matmul(X, X.T), 1.49x row by row).
- The pointwise work in the epilogues. b*A + c*(A A) is one `sym_kernel` launch whose
  epilogue reads the (i, j) tile of A and adds it before the store; a*X + B X is one
  `update_kernel` launch (a GEMM whose epilogue reads X's tile). No pointwise pass over
  memory remains: three launches a step, against six at Level 1.
- The normalization folded in. X0 = G / (||G|| + eps) is never written: two small
  launches compute s = 1 / (||G|| + eps) into a one-element buffer (partial sums of squares
  per block of rows, then one program adds them in a fixed order: no atomics, the same bits
  every run), and the first step reads G itself, scaling A by s^2 and its update by s.
- No transposes. A tall G (rows > cols) is iterated as G^T, and G^T is only other strides:
  the kernels take every operand's two strides, so G (any view) is read where it lies and
  the last step writes the result straight into the output in G's orientation.
- A batch in one launch. G may be (B, m, n), the B same-shape parameters of an optimizer
  step: every kernel's grid has a second axis, one slice of programs per matrix (its own
  base pointer from a batch stride, its own scale: one partial-sum row and one inverse norm
  per matrix). A loop over a parameter list launches 2 + 3 * steps kernels per matrix; the
  batch launches them once, and a small matrix's few tiles no longer leave most of the GPU
  idle (B of them fill it together). A 2-D G is a batch of one (batch stride 0).

What it costs: the intermediates A, B (m x m) and X (m x n) still make a round trip through
memory between launches (a step cannot be one launch: B needs all of A, the update all of
B); every launch is a GEMM we tile ourselves. The tiles are square (BLOCK x BLOCK) so a
tile's mirror image is a tile. Intermediates are stored in G's dtype, as Level 1 stores
them (Muon iterates in bfloat16); every dot accumulates in fp32.

The batch axis is the grid's second, which CUDA caps at 65535: levels.triton refuses a
larger batch (an optimizer holds far fewer parameters of one shape). Each program adds its
matrix's offset in 64 bits, the offsets inside a matrix stay 32-bit.

Precision: fp32 dots use input_precision="ieee" (no TF32: the fp32 bound applies);
16-bit ones run on the tensor cores. In the interpreter tiles are upcast to fp32 first
(its bf16 arithmetic is wrong), as in gemm.py. Offsets are 32-bit: levels.triton refuses
operands and intermediates of >= 2**31 elements.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .gemm import INTERPRETED, grouped_tile, l2_bytes, sm_count
from .launch import cdiv, fast_launch, forward_ahead


@fast_launch
@triton.jit
def sum_squares_kernel(x_ptr,  # the (batch, R, C) view x
                       part_ptr,  # (batch, P) fp32 partial sums, contiguous
                       R, C, P,  # one matrix's rows and columns; the partial sums per matrix
                       stride_b, stride_r, stride_c,  # x's strides (batch, row, column)
                       BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """part[b, pid] = sum of x[b]^2 over rows [pid*BLOCK_R, +BLOCK_R) of matrix b, in fp32."""
    pid = tl.program_id(0)
    batch = tl.program_id(1).to(tl.int64)
    x_ptr += batch * stride_b
    part_ptr += batch * P
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_C)
    acc = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    ### BEGIN SOLUTION
    for c0 in range(0, C, BLOCK_C):
        mask = (rows[:, None] < R) & ((c0 + cols)[None, :] < C)
        x = tl.load(x_ptr + rows[:, None] * stride_r + (c0 + cols)[None, :] * stride_c,
                    mask=mask, other=0.0).to(tl.float32)
        acc += x * x
    ### END SOLUTION
    tl.store(part_ptr + pid, tl.sum(tl.sum(acc, axis=1), axis=0))


@fast_launch
@triton.jit
def inverse_norm_kernel(part_ptr, scale_ptr, P, eps, BLOCK_P: tl.constexpr):
    """scale[b] = 1 / (sqrt(sum of part[b, :P]) + eps): one program per matrix b, a fixed order."""
    batch = tl.program_id(0)
    part_ptr += batch * P
    scale_ptr += batch
    offs = tl.arange(0, BLOCK_P)
    acc = tl.zeros((BLOCK_P,), dtype=tl.float32)
    for p0 in range(0, P, BLOCK_P):
        acc += tl.load(part_ptr + p0 + offs, mask=p0 + offs < P, other=0.0)
    ### BEGIN SOLUTION
    total = tl.sum(acc, axis=0)
    tl.store(scale_ptr, 1.0 / (tl.sqrt(total) + tl.cast(eps, tl.float32)))
    ### END SOLUTION


@triton.jit
def lower_tile(pid):
    """(i, j), j <= i: the pid-th tile of the lower triangle, row by row (tile (i, j) is
    number i (i + 1) / 2 + j). i is the triangular root of pid, computed in fp32 and then
    corrected by one in either direction (the square root may round across an integer)."""
    ### BEGIN SOLUTION
    i = ((tl.sqrt(8.0 * pid.to(tl.float32) + 1.0) - 1.0) * 0.5).to(tl.int32)
    i = tl.where((i + 1) * (i + 2) // 2 <= pid, i + 1, i)
    i = tl.where(i * (i + 1) // 2 > pid, i - 1, i)
    return i, pid - i * (i + 1) // 2
    ### END SOLUTION


@triton.jit
def banded_lower_tile(pid, T, GROUP: tl.constexpr):
    """(i, j), j <= i: the pid-th tile of the lower triangle of T x T tiles, in bands of GROUP
    tile rows, each band column by column (its rectangle left of the diagonal: j < b, GROUP
    rows a column), then its own small triangle row by row. Programs run roughly in pid order,
    so a wave of them reads X_i for GROUP rows and X_j for about wave / GROUP columns: at 8192
    x 8192 bf16 (2 MB a 128-row panel) 8 + 17 panels a wave of 132, where row by row a wave
    spans 1-2 rows and up to all 64 columns (128 MB, past the H100's 50 MB of L2). A band is
    the same set of rows in both orders, so lower_tile finds it."""
    row, _ = lower_tile(pid)
    b = (row // GROUP) * GROUP  # the band's first tile row
    p = pid - b * (b + 1) // 2
    g = tl.minimum(GROUP, T - b)  # its rows (the last band may have fewer)
    li, lj = lower_tile(tl.maximum(p - b * g, 0))
    i = tl.where(p < b * g, b + p % g, b + li)
    j = tl.where(p < b * g, p // g, b + lj)
    return i, j


def banded_order(T: int, group: int) -> list[tuple[int, int]]:
    """banded_lower_tile's launch order written out in Python, tile by tile: what Level 4's
    kernel and Level 5's schedule (cuda_kernels/tile_order.h) are tested against."""
    order = []
    for b in range(0, T, group):
        rows = range(b, min(b + group, T))
        order += [(i, j) for j in range(b) for i in rows]  # the band's rectangle, column by column
        order += [(i, j) for i in rows for j in range(b, i + 1)]  # then its own triangle
    return order


@fast_launch
@triton.jit
def sym_kernel(x_ptr,  # X (batch, M, K), any strides
               y_ptr,  # Y (batch, M, M), symmetric (read if HAS_Y)
               out_ptr,  # out (batch, M, M)
               scale_ptr,  # (batch,) fp32: s per matrix (read if SCALED)
               M, K,
               stride_xb, stride_xm, stride_xk, stride_yb, stride_ym, stride_yn,
               stride_ob, stride_om, stride_on,
               alpha, beta,
               SCALED: tl.constexpr, HAS_Y: tl.constexpr, UPCAST: tl.constexpr,
               DOT_PRECISION: tl.constexpr, BLOCK: tl.constexpr, BLOCK_K: tl.constexpr,
               GROUP: tl.constexpr = 1):
    """out = alpha * s^2 * (X X^T) + beta * Y for X (M, K) and a symmetric Y (M, M); s = scale[0]
    if SCALED else 1. One program per tile (i, j) with j <= i; it stores its tile and, off the
    diagonal, the tile's transpose at (j, i). A = X X^T is (alpha, beta) = (1, 0); B = bA + cA^2
    is X = A, Y = A, (alpha, beta) = (c, b), since A A = A A^T. The grid's second axis is
    the batch: program (p, b) computes tile p of matrix b."""
    if GROUP > 1:
        ti, tj = banded_lower_tile(tl.program_id(0), tl.cdiv(M, BLOCK), GROUP)
    else:
        ti, tj = lower_tile(tl.program_id(0))
    batch = tl.program_id(1).to(tl.int64)
    x_ptr += batch * stride_xb
    y_ptr += batch * stride_yb
    out_ptr += batch * stride_ob
    scale_ptr += batch
    offs_i = ti * BLOCK + tl.arange(0, BLOCK)
    offs_j = tj * BLOCK + tl.arange(0, BLOCK)
    offs_k = tl.arange(0, BLOCK_K)
    # Rows past M are wrapped, not masked: they read valid rows that only feed output
    # elements the store masks away. K is masked: it is summed over.
    xi_ptrs = x_ptr + (offs_i % M)[:, None] * stride_xm + offs_k[None, :] * stride_xk
    xj_ptrs = x_ptr + (offs_j % M)[None, :] * stride_xm + offs_k[:, None] * stride_xk
    acc = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
    ### BEGIN SOLUTION
    for k0 in range(0, K, BLOCK_K):
        k_ok = offs_k < K - k0
        xi = tl.load(xi_ptrs, mask=k_ok[None, :], other=0.0)
        xj = tl.load(xj_ptrs, mask=k_ok[:, None], other=0.0)  # X_j^T: (BLOCK_K, BLOCK)
        if UPCAST:
            xi = xi.to(tl.float32)
            xj = xj.to(tl.float32)
        acc = tl.dot(xi, xj, acc, input_precision=DOT_PRECISION)
        xi_ptrs += BLOCK_K * stride_xk
        xj_ptrs += BLOCK_K * stride_xk
    if SCALED:
        s = tl.load(scale_ptr)
        acc = acc * (s * s)
    acc = acc * alpha
    mask = (offs_i[:, None] < M) & (offs_j[None, :] < M)
    if HAS_Y:
        y = tl.load(y_ptr + offs_i[:, None] * stride_ym + offs_j[None, :] * stride_yn,
                    mask=mask, other=0.0)
        acc += beta * y.to(tl.float32)
    tile = acc.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + offs_i[:, None] * stride_om + offs_j[None, :] * stride_on, tile, mask=mask)
    if ti != tj:
        # the mirror image: element (r, c) of this tile is element (c, r) of tile (j, i)
        tl.store(out_ptr + offs_i[:, None] * stride_on + offs_j[None, :] * stride_om, tile,
                 mask=mask)
    ### END SOLUTION


@fast_launch
@triton.jit
def update_kernel(b_ptr,  # B (batch, M, M)
                  x_ptr,  # X (batch, M, N), any strides
                  out_ptr,  # out (batch, M, N), any strides
                  scale_ptr,  # (batch,) fp32: s per matrix (read if SCALED)
                  M, N, K,
                  stride_bb, stride_bm, stride_bk, stride_xb, stride_xm, stride_xn,
                  stride_ob, stride_om, stride_on, a,
                  SCALED: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  GROUP_M: tl.constexpr):
    """out = s * (a X + B X) for B (M, M) and X (M, N), K = M (K = 0: out = s * a * X, the
    normalization alone, for steps=0); s = scale[0] if SCALED else 1. A GEMM whose epilogue
    adds a X from the tile of X it reads once more, where Level 1 makes a pass of its own.
    The grid's second axis is the batch."""
    pid_m, pid_n = grouped_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    batch = tl.program_id(1).to(tl.int64)
    b_ptr += batch * stride_bb
    x_ptr += batch * stride_xb
    out_ptr += batch * stride_ob
    scale_ptr += batch
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    b_ptrs = b_ptr + (offs_m % M)[:, None] * stride_bm + offs_k[None, :] * stride_bk
    x_ptrs = x_ptr + offs_k[:, None] * stride_xm + (offs_n % N)[None, :] * stride_xn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    ### BEGIN SOLUTION
    for k0 in range(0, K, BLOCK_K):
        k_ok = offs_k < K - k0
        bt = tl.load(b_ptrs, mask=k_ok[None, :], other=0.0)
        xt = tl.load(x_ptrs, mask=k_ok[:, None], other=0.0)
        if UPCAST:
            bt = bt.to(tl.float32)
            xt = xt.to(tl.float32)
        acc = tl.dot(bt, xt, acc, input_precision=DOT_PRECISION)
        b_ptrs += BLOCK_K * stride_bk
        x_ptrs += BLOCK_K * stride_xm
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_n[None, :] * stride_xn, mask=mask,
                other=0.0)
    acc += a * x.to(tl.float32)
    if SCALED:
        acc = acc * tl.load(scale_ptr)
    ### END SOLUTION
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on,
             acc.to(out_ptr.dtype.element_ty), mask=mask)


KERNELS = [sum_squares_kernel, inverse_norm_kernel, sym_kernel, update_kernel]


def uses_tf32(device, dtype) -> bool:
    return False  # fp32 dots are input_precision="ieee"


# The tiles, chosen from the problem's size (rows, columns, batch) and the GPU's SM count,
# by a rule read off scripts/sweep_newton_schulz.py's H100 sweep (bf16,
# reports/h100-sweep-newton-schulz.json; the sym / update kernels alone against the cuBLAS
# product each replaces, ratios > 1 faster):
#   - the biggest tile pays when there are enough of them to give every SM a program, the
#     smaller one when there are not: X X^T at 1024 x 1024 in 128-tiles is 36 programs on
#     132 SMs (0.67x cuBLAS), in 64-tiles 136 (0.93x); 12 x 768 x 768 in 128-tiles is 252
#     (1.36x, the 64-tile 1.09x);
#   - the update's 128 x 256 tile (each loaded B block reused 256 times) was the fastest
#     wherever it filled the GPU: 4096^2 1.04x vs 0.86x for 128 x 128, 4096 x 11008 0.99x
#     vs 0.81x, and within 3% of 128 x 128 at the batched GPT-2 shapes;
#   - the symmetric kernel stays square (a tile's mirror must be a tile): 128 x 128 with
#     64-wide K steps at 4 warps (1.49x at 4096^2, 1.52x at 8192 x 4096), 4 stages and 8
#     warps for a long K (4096 x 11008: 1.36x vs 1.31x).
_SYM_BIG = dict(BLOCK=128, BLOCK_K=64, num_warps=4, num_stages=3)
_SYM_LONG_K = dict(BLOCK=128, BLOCK_K=64, num_warps=8, num_stages=4)
_SYM_SMALL = dict(BLOCK=64, BLOCK_K=128, num_warps=4, num_stages=3)
_UPDATE_WIDE = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=3)
_UPDATE_BIG = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=3)
_UPDATE_SMALL = dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=4)
# fp32's ieee dots: three times the registers and shared memory per element
_SYM_FP32 = dict(BLOCK=64, BLOCK_K=32, num_warps=4, num_stages=3)
_UPDATE_FP32 = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, num_warps=4, num_stages=3)
# the interpreter runs every element in numpy: small tiles
_SYM_INTERPRETED = dict(BLOCK=32, BLOCK_K=32, num_warps=4, num_stages=1)
_UPDATE_INTERPRETED = dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, num_warps=4, num_stages=1)
LONG_K = 8192  # a symmetric product summing over more columns than this takes _SYM_LONG_K
SYM_GROUP = 8  # tile rows a band of the symmetric kernel's launch order (banded_lower_tile)


# The symmetric kernel's launch order. Row by row, a wave of programs reads X_j for up to
# all m_t column panels; once X (m x k) is larger than L2 those panels are read from DRAM
# again by every wave. In bands of SYM_GROUP tile rows a wave reads SYM_GROUP row panels and
# about wave / SYM_GROUP column panels. Measured on the H100 (scripts/probe_sym_order.py,
# reports/phased-rows-and-bands-2026-11-27/call6-sym-order.json, bf16, against torch.matmul(X,
# X.T)): X of 86 MB (4096 x 11008) 1.62x in bands against 1.49x row by row, 128 MB (8192^2)
# 1.66x against 1.53x; 64-72 MB (8192 x 4096, 6144^2) within 2% either way (the bench's
# figure of record at 8192 x 4096, in bands, 1.51x: call6-bench-newton_schulz.txt); 32 MB
# (4096^2) the same. So bands where X is larger than L2 (50 MB on the H100), row by row
# elsewhere.
def _sym_group(tiles: int, x_bytes: int, device) -> int:
    if tiles <= SYM_GROUP or x_bytes <= l2_bytes(device):
        return 1
    return SYM_GROUP


def _sym_tiles(M: int, K: int, batch: int, dtype: torch.dtype, sms: int) -> dict:
    if INTERPRETED:
        return _SYM_INTERPRETED
    if dtype == torch.float32:
        return _SYM_FP32
    tiles = cdiv(M, 128)
    if tiles * (tiles + 1) // 2 * batch < sms:
        return _SYM_SMALL
    return _SYM_LONG_K if K > LONG_K else _SYM_BIG


def _update_tiles(M: int, N: int, batch: int, dtype: torch.dtype, sms: int) -> dict:
    if INTERPRETED:
        return _UPDATE_INTERPRETED
    if dtype == torch.float32:
        return _UPDATE_FP32
    if cdiv(M, 128) * cdiv(N, 256) * batch >= sms:
        return _UPDATE_WIDE
    return _UPDATE_BIG if cdiv(M, 128) * cdiv(N, 128) * batch >= sms else _UPDATE_SMALL


def _common(dtype: torch.dtype) -> dict:
    return dict(UPCAST=INTERPRETED, DOT_PRECISION="ieee" if dtype == torch.float32 else "tf32")


MAX_BATCH = 65535  # the grid's second axis (CUDA's y dimension)


def _batched(t: torch.Tensor | None) -> torch.Tensor | None:
    """A (batch, rows, cols) view of t: a 2-D t is a batch of one."""
    return t if t is None or t.dim() == 3 else t.unsqueeze(0)


def symmetric_product(x: torch.Tensor, y: torch.Tensor | None = None, alpha: float = 1.0,
                      beta: float = 0.0, scale: torch.Tensor | None = None,
                      out: torch.Tensor | None = None, group: int | None = None) -> torch.Tensor:
    """alpha * s^2 * x x^T + beta * y (y symmetric, or None) for x (m, k) or a batch
    (batch, m, k) of any strides: one launch of m_t (m_t + 1) / 2 tile programs per matrix
    (m_t = ceil(m / BLOCK)). Public: the bench times it against torch.matmul(x, x.T)."""
    M, K = x.shape[-2:]
    if out is None:
        out = torch.empty((*x.shape[:-1], M), dtype=x.dtype, device=x.device)
    xb, yb, ob = _batched(x), _batched(out if y is None else y), _batched(out)
    t = _sym_tiles(M, K, xb.shape[0], x.dtype, sm_count(x.device))
    tiles = cdiv(M, t["BLOCK"])
    if group is None:  # bands where X's panels do not fit in L2 (_sym_group)
        group = _sym_group(tiles, M * K * x.element_size(), x.device)
    sym_kernel[(tiles * (tiles + 1) // 2, xb.shape[0])](
        xb, yb, ob, ob if scale is None else scale, M, K, *xb.stride(), *yb.stride(),
        *ob.stride(), float(alpha), float(beta),
        SCALED=scale is not None, HAS_Y=y is not None, GROUP=group, **_common(x.dtype), **t)
    return out


def _update(b, x, out, a, scale=None, K=None):
    """out = s * (a x + b x) for (batch, M, N) views x and out and (batch, M, M) b."""
    batch, M, N = x.shape
    t = _update_tiles(M, N, batch, x.dtype, sm_count(x.device))
    grid = (cdiv(M, t["BLOCK_M"]) * cdiv(N, t["BLOCK_N"]), batch)
    update_kernel[grid](
        b, x, out, out if scale is None else scale, M, N, M if K is None else K,
        *b.stride(), *x.stride(), *out.stride(),
        float(a), SCALED=scale is not None, GROUP_M=8, **t, **_common(x.dtype))


def inverse_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """A (batch,) fp32 tensor holding 1 / (||x[b]||_F + eps) for each matrix of the
    (batch, R, C) view x: two launches, no atomics."""
    batch, R, C = x.shape
    BLOCK_R = 16 if INTERPRETED else 32
    P = cdiv(R, BLOCK_R)
    parts = torch.empty((batch, P), dtype=torch.float32, device=x.device)
    sum_squares_kernel[(P, batch)](x, parts, R, C, P, *x.stride(),
                                   BLOCK_R=BLOCK_R, BLOCK_C=64 if INTERPRETED else 256)
    scale = torch.empty((batch,), dtype=torch.float32, device=x.device)
    inverse_norm_kernel[(batch,)](parts, scale, P, eps, BLOCK_P=64 if INTERPRETED else 1024)
    return scale


def check(G) -> None:
    """What only these kernels refuse (levels.triton runs it once per argument signature,
    after the contract): float64 (the dots have no fp64 path on a GPU), and a batch larger
    than the grid's second axis holds."""
    if G.dtype == torch.float64:
        raise TypeError("newton_schulz: argument 'G' must be float16, bfloat16 or float32 for "
                        "the Triton kernels; got torch.float64")
    if G.dim() == 3 and G.shape[0] > MAX_BATCH:
        raise ValueError(f"newton_schulz: argument 'G' must hold at most {MAX_BATCH} matrices "
                         f"for the Triton kernels (the batch is the grid's second axis); got a "
                         f"batch of {G.shape[0]}")


def newton_schulz(G, steps: int, a: float, b: float, c: float, eps: float):
    """Called by levels.triton.newton_schulz after the shared validation and `check`:
    2 + 3 * steps launches (steps=0: 3) for the whole batch, none for an empty one. No
    autograd: the contract refuses a G that requires grad, and the output is a new tensor
    in G's shape, dtype and orientation. On a GPU a signature's launches are recorded once
    and replayed from C++ after that (launch.forward_ahead): 17 Python launches a call at
    five steps were most of its host time."""
    return forward_ahead(_inference, G, steps, a, b, c, eps)


def _inference(G, steps: int, a: float, b: float, c: float, eps: float):
    result = torch.empty(G.shape, dtype=G.dtype, device=G.device)
    if G.numel() == 0:
        return result
    tall = G.shape[-2] > G.shape[-1]
    # views, read through their strides: (batch, m, n) with m <= n
    X = _batched(G.mT if tall else G)
    out = _batched(result.mT if tall else result)  # the last launch writes G's orientation
    batch, M, N = X.shape
    scale = inverse_norm(X, eps)
    if steps == 0:
        _update(X, X, out, 1.0, scale=scale, K=0)
        return result
    A = torch.empty((batch, M, M), dtype=G.dtype, device=G.device)
    B = torch.empty_like(A)
    spare = [torch.empty((batch, M, N), dtype=G.dtype, device=G.device)
             for _ in range(min(steps - 1, 2))]
    for step in range(steps):
        first = step == 0
        symmetric_product(X, scale=scale if first else None, out=A)  # A = X X^T
        symmetric_product(A, A, alpha=c, beta=b, out=B)  # B = b A + c A^2
        target = out if step == steps - 1 else spare[step % 2]
        _update(B, X, target, a, scale=scale if first else None)  # X <- a X + B X
        X = target
    return result
