"""LayerNorm in Triton: one pass over memory forward, one backward (plus a tiny reduction).

What it adds over torch.compile: nothing magic, and that is the lesson. A row is loaded
once into registers, its mean and variance are computed there in fp32 (two-pass over the
*registers*, not over memory: numerically exact, free in bandwidth), and y is written
once: 2 bytes moved per byte of x, the floor. Inductor generates much the same kernel;
writing it by hand shows what "fused" means and what the floor is.

Forward: each program owns BLOCK_M rows x BLOCK_N columns (BLOCK_N = the row width
rounded up to a power of two, masked); narrow rows get several rows per program so each
program still moves a useful amount of memory. mean and 1/std are saved (8 bytes a row).

Backward: dx = rstd * (w*dy - mean(w*dy) - xhat * mean(w*dy * xhat)) needs whole rows
again, so the same row tiling; dweight = sum_rows dy*xhat and dbias = sum_rows dy are
reductions *across* programs. Each program loops over its own chunk of rows, accumulates
its partial sums in registers and writes them to its own row of a (programs, N) buffer;
a second small kernel sums both buffers in one launch. No atomics: deterministic.

Measured (H100, 16384x4096, kernel time, reports/h100-bench.json): forward fp32 2.92 TB/s
(0.99x copy; 0.99x torch.compile, both at the copy floor), bf16 2.82 TB/s (0.98x copy,
1.11x compile); backward fp32 2.57 TB/s (0.87x copy, 1.02x compile), bf16 2.37 TB/s
(0.83x copy, 1.17x compile). End to end the backward is the CPU's: Python and autograd
need ~0.35-0.45 ms to enqueue its launches (three then; two now), longer than the kernels run.

What it costs: a row must fit in registers. Up to 8192 columns it does (16384 forward
for unaligned rows, 32768 for aligned ones); wider rows (to 65536, the limit shared with rms_norm) are walked in chunks by three kernels
of their own (below: the statistics merged chunk by chunk, the backward's row dots first),
which read x twice forward and x and dy twice backward. Wider still is refused with a
ValueError.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .gemm import sm_count
from .launch import apply_ahead, cdiv, fast_launch, forward_ahead, needs_grad, next_power_of_2

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"
MAX_WIDTH = 65536


@fast_launch
@triton.jit
def layer_norm_fwd_kernel(x_ptr,  # (M, N) rows, row stride stride_xm, columns adjacent
                          w_ptr, b_ptr,  # (N,) contiguous
                          y_ptr,  # (M, N) output, row stride stride_ym
                          stats_ptr,  # (2, M) fp32: mean, then 1/std (read by backward)
                          M, N, stride_xm, stride_ym, eps,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          STATS: tl.constexpr):  # False under no_grad: nothing to save
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < M
    # 64-bit row offsets: M * N reaches 2**31 at realistic sizes (65536 x 32768 in bf16 is
    # 4 GiB), and a 32-bit product would wrap around silently.
    row_off = rows.to(tl.int64)
    col_ok = cols < N
    mask = row_ok[:, None] & col_ok[None, :]
    ### BEGIN SOLUTION
    x = tl.load(x_ptr + row_off[:, None] * stride_xm + cols[None, :], mask=mask, other=0.0)
    x = x.to(tl.float32)
    mean = tl.sum(x, axis=1) / N
    # Centre before squaring (masked lanes must not contribute -mean).
    xc = tl.where(mask, x - mean[:, None], 0.0)
    var = tl.sum(xc * xc, axis=1) / N
    # tl.cast: Inductor, compiling a model around this kernel, passes a Python float as fp64
    rstd = 1.0 / tl.sqrt(var + tl.cast(eps, tl.float32))
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    y = xc * rstd[:, None] * w[None, :] + b[None, :]
    tl.store(y_ptr + row_off[:, None] * stride_ym + cols[None, :], y.to(y_ptr.dtype.element_ty),
             mask=mask)
    if STATS:
        tl.store(stats_ptr + rows, mean, mask=row_ok)
        tl.store(stats_ptr + M + rows, rstd, mask=row_ok)
    ### END SOLUTION


@fast_launch
@triton.jit
def layer_norm_bwd_kernel(x_ptr, w_ptr, dy_ptr, dx_ptr,  # rows as in the forward; w (N,)
                          stats_ptr,  # (2, M) fp32: the forward's mean and 1/std
                          part_ptr,  # (2, programs, N) fp32: dweight's, then dbias's partial sums
                          M, N, stride_xm, stride_dym, stride_dxm, rows_per_program, programs,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    dw_acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    db_acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    first = pid * rows_per_program
    for r in range(0, rows_per_program, BLOCK_M):
        rows = first + r + tl.arange(0, BLOCK_M)
        row_ok = rows < M
        row_off = rows.to(tl.int64)  # as in the forward: M * N may exceed 2**31
        mask = row_ok[:, None] & col_ok[None, :]
        ### BEGIN SOLUTION
        x = tl.load(x_ptr + row_off[:, None] * stride_xm + cols[None, :], mask=mask,
                    other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + row_off[:, None] * stride_dym + cols[None, :], mask=mask,
                     other=0.0).to(tl.float32)
        mean = tl.load(stats_ptr + rows, mask=row_ok, other=0.0)
        rstd = tl.load(stats_ptr + M + rows, mask=row_ok, other=0.0)
        xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
        wdy = dy * w[None, :]  # zero on masked lanes (dy and w loaded as 0 there)
        c1 = tl.sum(xhat * wdy, axis=1) / N
        c2 = tl.sum(wdy, axis=1) / N
        dx = (wdy - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
        tl.store(dx_ptr + row_off[:, None] * stride_dxm + cols[None, :],
                 dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw_acc += tl.sum(dy * xhat, axis=0)
        db_acc += tl.sum(dy, axis=0)
        ### END SOLUTION
    tl.store(part_ptr + pid * N + cols, dw_acc, mask=col_ok)
    tl.store(part_ptr + (programs + pid) * N + cols, db_acc, mask=col_ok)


@fast_launch
@triton.jit
def sum_partials_kernel(part_ptr, out_ptr, P, N, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    """out[h, n] = sum_p part[h, p, n]: the second stage of the dweight (h = 0) and dbias
    (h = 1) reductions, both in one launch (grid axis 1 picks the half): a launch costs
    the host more (~25 us) than this kernel costs the GPU."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    half = tl.program_id(1)
    part_ptr += half * P * N
    acc = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
    for p0 in range(0, P, BLOCK_P):
        p = p0 + tl.arange(0, BLOCK_P)
        mask = (p[:, None] < P) & (cols[None, :] < N)
        acc += tl.load(part_ptr + p[:, None] * N + cols[None, :], mask=mask, other=0.0)
    tl.store(out_ptr + half * N + cols, tl.sum(acc, axis=0).to(out_ptr.dtype.element_ty),
             mask=cols < N)


def partials_tile(N: int, P: int, device: torch.device, halves: int) -> tuple[int, int]:
    """(BLOCK_N, BLOCK_P) of sum_partials_kernel for P partial rows of N columns (halves: 2
    for dweight and dbias, 1 for rms_norm's dweight alone). The second stage reads P x N fp32
    partials that sit in L2: little work, in series after the main kernel. At 256 columns and
    32 partial rows a step, a 4096-wide row gave it 16 programs (32 with two halves), an
    eighth of an H100's SMs, each reading ~300 KB from L2 in nine dependent steps: 16 us
    alone (scripts/probe_partials_tile.py). Columns a program are halved (down to 32: one
    128-byte segment of a partials row) until the programs cover the SMs, and each step reads
    up to 8K partials (BLOCK_P rows), so a program's loads are in flight together."""
    if INTERPRETED or device.type != "cuda":
        return min(next_power_of_2(N), 64), 32
    return partials_tile_rule(N, P, halves, sm_count(device))


def partials_tile_rule(N: int, P: int, halves: int, sms: int) -> tuple[int, int]:
    """partials_tile on a GPU with `sms` SMs (testable without one)."""
    width = min(next_power_of_2(N), 256)
    while width > 32 and cdiv(N, width) * halves < sms:
        width //= 2
    return width, max(32, min(next_power_of_2(P), 8192 // width))


# ---------------------------------------------------------------------------------------
# Rows wider than registers hold (N > WIDE): the row in chunks
# ---------------------------------------------------------------------------------------
# Wide rows make a whole row per program 32+ fp32 values per thread for each of x, xc, w, b
# (and dy, xhat, the dweight/dbias accumulators in backward): the kernels above spill, and
# the H100 sweep (reports/h100-sweep-layer-norm-before.json) measured the backward at
# 0.02-0.07x of copy bandwidth at 16385-65536 columns. So wide rows are walked
# in CHUNK-column pieces instead: what stays in registers is one chunk and a few scalars.
# What it costs: the forward reads each row twice (statistics, then the output: the second
# read comes from L2 while the row is recent), and the backward becomes two kernels that
# read x and dy twice (the row's two dot products first, then dx and the column sums), five
# tensor passes where three are the floor.

@fast_launch
@triton.jit
def layer_norm_fwd_wide_kernel(x_ptr, w_ptr, b_ptr, y_ptr, stats_ptr, M, N, stride_xm, stride_ym,
                               eps, CHUNK: tl.constexpr, STATS: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row.to(tl.int64) * stride_xm
    y_row = y_ptr + row.to(tl.int64) * stride_ym
    cols = tl.arange(0, CHUNK)
    # Mean and M2 (the sum of squared deviations) chunk by chunk: each chunk's own pair is
    # exact (centred in registers), and Chan's formula merges it into the running pair
    # without the cancellation of E[x^2] - E[x]^2.
    mean = tl.zeros((), dtype=tl.float32)
    m2 = tl.zeros((), dtype=tl.float32)
    for c0 in range(0, N, CHUNK):
        ok = c0 + cols < N
        x = tl.load(x_row + c0 + cols, mask=ok, other=0.0).to(tl.float32)
        n_before = c0 * 1.0  # columns merged so far, as a float
        n_chunk = tl.minimum(N - c0, CHUNK).to(tl.float32)
        chunk_mean = tl.sum(x, axis=0) / n_chunk
        xc = tl.where(ok, x - chunk_mean, 0.0)
        delta = chunk_mean - mean
        total = n_before + n_chunk
        mean += delta * (n_chunk / total)
        m2 += tl.sum(xc * xc, axis=0) + delta * delta * (n_before * n_chunk / total)
    rstd = 1.0 / tl.sqrt(m2 / N + tl.cast(eps, tl.float32))
    for c0 in range(0, N, CHUNK):
        ok = c0 + cols < N
        x = tl.load(x_row + c0 + cols, mask=ok, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + c0 + cols, mask=ok, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + c0 + cols, mask=ok, other=0.0).to(tl.float32)
        y = (x - mean) * rstd * w + b
        tl.store(y_row + c0 + cols, y.to(y_ptr.dtype.element_ty), mask=ok)
    if STATS:
        tl.store(stats_ptr + row, mean)
        tl.store(stats_ptr + M + row, rstd)


@fast_launch
@triton.jit
def layer_norm_row_dots_kernel(x_ptr, w_ptr, dy_ptr, stats_ptr, dots_ptr, M, N, stride_xm,
                               stride_dym, CHUNK: tl.constexpr):
    """dots[0, row] = mean(xhat * w*dy), dots[1, row] = mean(w*dy): the two row reductions
    dx needs, chunk by chunk (the first kernel of a wide row's backward)."""
    row = tl.program_id(0)
    x_row = x_ptr + row.to(tl.int64) * stride_xm
    dy_row = dy_ptr + row.to(tl.int64) * stride_dym
    mean = tl.load(stats_ptr + row)
    rstd = tl.load(stats_ptr + M + row)
    cols = tl.arange(0, CHUNK)
    acc1 = tl.zeros((CHUNK,), dtype=tl.float32)
    acc2 = tl.zeros((CHUNK,), dtype=tl.float32)
    for c0 in range(0, N, CHUNK):
        ok = c0 + cols < N
        x = tl.load(x_row + c0 + cols, mask=ok, other=0.0).to(tl.float32)
        dy = tl.load(dy_row + c0 + cols, mask=ok, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + c0 + cols, mask=ok, other=0.0).to(tl.float32)
        wdy = dy * w  # zero past N (dy and w loaded as 0 there)
        acc1 += (x - mean) * rstd * wdy
        acc2 += wdy
    tl.store(dots_ptr + row, tl.sum(acc1, axis=0) / N)
    tl.store(dots_ptr + M + row, tl.sum(acc2, axis=0) / N)


@fast_launch
@triton.jit
def layer_norm_bwd_wide_kernel(x_ptr, w_ptr, dy_ptr, dx_ptr, stats_ptr, dots_ptr, part_ptr,
                               M, N, stride_xm, stride_dym, stride_dxm, rows_per_program,
                               programs, CHUNK: tl.constexpr):
    """dx, and the dweight/dbias partial sums, of CHUNK columns (program_id(1)) of one chunk
    of rows (program_id(0)), the row reductions read from `dots`: the persistent backward
    above, cut along the columns as well, so the accumulators are one chunk wide."""
    pid = tl.program_id(0)
    cols = tl.program_id(1) * CHUNK + tl.arange(0, CHUNK)
    ok = cols < N
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    dw_acc = tl.zeros((CHUNK,), dtype=tl.float32)
    db_acc = tl.zeros((CHUNK,), dtype=tl.float32)
    first = pid * rows_per_program
    for i in range(0, rows_per_program):
        r = first + i
        m = ok & ((r + cols * 0) < M)  # the last program's share may be short
        r64 = r.to(tl.int64)
        x = tl.load(x_ptr + r64 * stride_xm + cols, mask=m, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + r64 * stride_dym + cols, mask=m, other=0.0).to(tl.float32)
        rs = tl.minimum(r, M - 1)  # a row past M reads row M-1's scalars, stores nothing
        mean = tl.load(stats_ptr + rs)
        rstd = tl.load(stats_ptr + M + rs)
        c1 = tl.load(dots_ptr + rs)
        c2 = tl.load(dots_ptr + M + rs)
        xhat = tl.where(m, (x - mean) * rstd, 0.0)
        dx = (dy * w - (xhat * c1 + c2)) * rstd
        tl.store(dx_ptr + r64 * stride_dxm + cols, dx.to(dx_ptr.dtype.element_ty), mask=m)
        dw_acc += dy * xhat
        db_acc += dy
    tl.store(part_ptr + pid * N + cols, dw_acc, mask=ok)
    tl.store(part_ptr + (programs + pid) * N + cols, db_acc, mask=ok)


KERNELS = [layer_norm_fwd_kernel, layer_norm_bwd_kernel, sum_partials_kernel,
           layer_norm_fwd_wide_kernel, layer_norm_row_dots_kernel, layer_norm_bwd_wide_kernel]
# Above WIDE columns a row goes in CHUNK-column pieces (the kernels just above); the
# interpreter's values are small so that the CPU tests walk that path at CPU sizes.
# Thresholds read off the H100 (reports/h100-sweep-layer-norm-level4.json, kernel time):
# the whole-row backward holds seven row-wide arrays and spills from 16384-wide tiles on
# (8193-16384 columns: 0.05-0.45x copy, the chunked backward 0.57x), so it walks chunks
# past 8192 columns. The forward holds fewer: its whole-row kernel still ran at 0.89-0.92x
# at 32768 aligned columns where the chunked one ran at 0.66x (the second read of each row),
# and spilled only at 65536 (0.55x; chunked 0.60x in 4096-column chunks, 0.68x in 16384-column
# ones, which ptxas says spill 68 bytes at 16 warps: the longer loop body still won); an
# unaligned row's 32768-wide tile ran at 0.12-0.30x (16385 columns), so those go by chunks
# past 16384.
WIDE = 256 if INTERPRETED else 8192
CHUNK = 64 if INTERPRETED else 4096
FWD_WIDE = WIDE if INTERPRETED else 32768
FWD_WIDE_UNALIGNED = WIDE if INTERPRETED else 16384
FWD_CHUNK = CHUNK if INTERPRETED else 16384
WIDE_WARPS = 4 if INTERPRETED else 16  # 80-128 registers a thread (ptxas, sm_90)


def uses_tf32(device, dtype) -> bool:
    return False  # no dot products


def _tiling(N: int, tiling=None, aligned: bool = True):
    """(BLOCK_M, BLOCK_N, num_warps): about 4-8K elements per program, whole rows.

    tiling: the caller's (BLOCK_M, num_warps) instead of the rule (layer_norm's `tiling`
    argument: `levels bench` times alternatives so, all within 1.5% of the rule at
    16384x4096, fp32 and bf16: the rule stays).

    aligned: whether the rows can be read in 16-byte vectors (row strides a multiple of 16
    elements and a 16-byte aligned base: what Triton's specialization can prove). When they
    cannot (N = 4097, a slice), every element is its own 2- or 4-byte load; rows of 8192
    columns or more then go four rows (32K elements) to a program, 8 warps: more independent
    loads in flight (up to 16384 columns). H100, bf16, kernel time
    (reports/h100-sweep-layer-norm-level4.json):
    16380x4097 0.24x -> 0.40x copy, 8193x8191 0.35x -> 0.58x. Narrower unaligned rows keep
    the rule (1023 columns: 0.80x; no candidate did better). Still far from the aligned
    rows' 0.95x: Triton cannot peel a row's unaligned head to vectorize its body.
    """
    BLOCK_N = next_power_of_2(N)
    if tiling is not None:
        BLOCK_M, num_warps = tiling
        return BLOCK_M, BLOCK_N, num_warps
    if INTERPRETED:
        return max(1, min(16, 1024 // BLOCK_N)), BLOCK_N, 4
    if not aligned and 8192 <= BLOCK_N <= 16384:
        return max(1, 32768 // BLOCK_N), BLOCK_N, 8
    BLOCK_M = max(1, 4096 // BLOCK_N)  # narrow rows: several rows per program
    elems = BLOCK_M * BLOCK_N
    num_warps = 4 if elems <= 2048 else (8 if elems <= 8192 else 16)
    return BLOCK_M, BLOCK_N, num_warps


def _aligned(x2: torch.Tensor, stride_xm: int) -> bool:
    """Whether x2's rows (and an output's, N apart) can be loaded as 16-byte vectors."""
    return x2.data_ptr() % 16 == 0 and stride_xm % 16 == 0 and x2.shape[-1] % 16 == 0


def _rows(t: torch.Tensor) -> torch.Tensor:
    """(M, N) view with unit column stride; an explicit copy only if strides forbid it."""
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def _backward_tiling(N: int, tiling=None):
    """(BLOCK_M, BLOCK_N, num_warps, programs per SM) of the backward pass; tiling: the
    caller's (BLOCK_M, num_warps, programs per SM) instead (layer_norm's `backward_tiling`).

    The backward is a loop over its rows with two row reductions between load and store,
    so each iteration should carry many bytes: 16K elements (4 rows of 4096) per iteration
    with 16 warps and 2 programs per SM. Measured at 16384x4096 on an H100 (`levels bench`
    "backward sweep", kernel time): bf16 0.171 ms (0.83x copy) vs 0.222 ms (0.64x) for one
    row per iteration, 8 warps, 4 programs per SM; fp32 0.315 vs 0.327 ms.

    Rows of up to 2048 columns (a model's hidden size: GPT-2 small's 768) take 8K elements
    per iteration over 4 warps instead: with 16 warps such a row is spread over several
    warps, and each of its two reductions crosses them through shared memory and a
    barrier, on rows too short to hide it. Measured on an H200 at 8192 rows, bf16
    (scripts/sweep_layer_norm_bwd_narrow.py, reports/gemm-tiles-and-layer-norm-backward/):
    768 columns 28 us (0.57x copy) against 66 us (0.24x) with 16 warps; 2048 columns 47 us
    against 90; at 32768 rows the same tiles stay within 4% of the fastest candidate. Rows
    narrower than 768 columns take the same rule, not measured."""
    BLOCK_N = next_power_of_2(N)
    if tiling is not None:
        BLOCK_M, num_warps, per_sm = tiling
        return BLOCK_M, BLOCK_N, num_warps, per_sm
    if INTERPRETED:
        return (*_tiling(N), 1)
    if BLOCK_N <= 2048:
        return min(64, 8192 // BLOCK_N), BLOCK_N, 4, 2
    BLOCK_M = min(64, max(1, 16384 // BLOCK_N))
    elems = BLOCK_M * BLOCK_N
    num_warps = 4 if elems <= 2048 else (8 if elems < 8192 else 16)
    return BLOCK_M, BLOCK_N, num_warps, 2


def _n_programs(device: torch.device, M: int, BLOCK_M: int, per_sm: int = 4) -> int:
    if INTERPRETED or device.type != "cuda":
        return min(2, cdiv(M, BLOCK_M))
    return min(sm_count(device) * per_sm, cdiv(M, BLOCK_M))


def _forward(x, weight, bias, eps, save: bool, tiling=None):
    """(y, x2, stats): the launch, without autograd. A contiguous x is passed as it is (its
    row stride is N): no reshape view, and y = empty_like(x) has x's shape already. The
    statistics (mean and 1/std, one (2, M) fp32 buffer) are kept only for a backward:
    under no_grad the kernel stores none and the call allocates y alone, as eager does."""
    N = x.shape[-1]
    if x.is_contiguous():
        x2, stride_xm, M = x, N, x.numel() // N
    else:
        x2 = _rows(x)
        stride_xm, M = x2.stride(0), x2.shape[0]
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    stats = x.new_empty((2, M), dtype=torch.float32) if save else y
    if M == 0:
        return y, x2, stats  # no rows: nothing to launch (a grid of 0 programs is an error)
    # only rows of more than 4096 columns have tiles that depend on it: no work for the rest
    aligned = N <= 4096 or _aligned(x2, stride_xm)
    if tiling is None and (N > FWD_WIDE or (N > FWD_WIDE_UNALIGNED and not aligned)):
        layer_norm_fwd_wide_kernel[(M,)](x2, weight, bias, y, stats, M, N, stride_xm, N, eps,
                                         CHUNK=FWD_CHUNK, STATS=save, num_warps=WIDE_WARPS)
        return y, x2, stats
    BLOCK_M, BLOCK_N, num_warps = _tiling(N, tiling, aligned)
    layer_norm_fwd_kernel[(cdiv(M, BLOCK_M),)](
        x2, weight, bias, y, stats, M, N, stride_xm, N, eps,
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, STATS=save, num_warps=num_warps)
    return y, x2, stats


def _backward_wide(dy2, x2, weight, stats, dx, stride_xm):
    """dx (written into `dx`) and (dweight, dbias) of rows wider than WIDE: the row dots,
    then dx and the column partials by (chunk of rows, CHUNK columns), then their sums."""
    M, N = dx.shape
    dots = stats.new_empty((2, M))
    layer_norm_row_dots_kernel[(M,)](x2, weight, dy2, stats, dots, M, N, stride_xm,
                                     dy2.stride(0), CHUNK=CHUNK, num_warps=WIDE_WARPS)
    col_chunks = cdiv(N, CHUNK)
    # about two programs per SM in all (at least two row programs: the column sums then
    # always add partials, in the interpreter's tests too), the rows shared out among them
    programs = min(M, max(2, _n_programs(dx.device, M * col_chunks, 1, 2) // col_chunks))
    rows = cdiv(M, programs)
    programs = cdiv(M, rows)
    parts = stats.new_empty((2, programs, N))
    layer_norm_bwd_wide_kernel[(programs, col_chunks)](
        x2, weight, dy2, dx, stats, dots, parts, M, N, stride_xm, dy2.stride(0), N, rows,
        programs, CHUNK=CHUNK, num_warps=WIDE_WARPS)
    dwb = weight.new_empty((2, N))
    RB_N, RB_P = partials_tile(N, programs, parts.device, 2)
    sum_partials_kernel[(cdiv(N, RB_N), 2)](parts, dwb, programs, N, BLOCK_P=RB_P, BLOCK_N=RB_N)
    return dwb


class _LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps, tiling=None, backward_tiling=None):
        y, x2, stats = _forward(x, weight, bias, eps, save=True, tiling=tiling)
        ctx.save_for_backward(x2, weight, stats)
        ctx.x_shape = x.shape
        ctx.backward_tiling = backward_tiling
        return y

    @staticmethod
    def backward(ctx, dy):
        x2, weight, stats = ctx.saved_tensors
        N = ctx.x_shape[-1]
        M = stats.shape[1]
        stride_xm = x2.stride(0) if x2.dim() == 2 and not x2.is_contiguous() else N
        dy2 = _rows(dy)
        dx = x2.new_empty((M, N))
        if M == 0:  # no rows: dweight and dbias are sums of nothing
            zeros = weight.new_zeros((2, N))
            return dx.reshape(ctx.x_shape), zeros[0], zeros[1], None, None, None
        if N > WIDE and ctx.backward_tiling is None:
            dwb = _backward_wide(dy2, x2, weight, stats, dx, stride_xm)
            return dx.reshape(ctx.x_shape), dwb[0], dwb[1], None, None, None
        BLOCK_M, BLOCK_N, num_warps, per_sm = _backward_tiling(N, ctx.backward_tiling)
        programs = _n_programs(x2.device, M, BLOCK_M, per_sm)
        # Whole BLOCK_M groups per program, so programs never share a row.
        rows = cdiv(cdiv(M, programs), BLOCK_M) * BLOCK_M
        programs = cdiv(M, rows)
        # dweight's and dbias's partial sums: one allocation, two halves
        parts = x2.new_empty((2, programs, N), dtype=torch.float32)
        layer_norm_bwd_kernel[(programs,)](
            x2, weight, dy2, dx, stats, parts, M, N, stride_xm, dy2.stride(0), N, rows, programs,
            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, num_warps=num_warps)
        dwb = weight.new_empty((2, N))  # dweight, dbias: one allocation, one launch
        RB_N, RB_P = partials_tile(N, programs, parts.device, 2)
        sum_partials_kernel[(cdiv(N, RB_N), 2)](parts, dwb, programs, N, BLOCK_P=RB_P, BLOCK_N=RB_N)
        return dx.reshape(ctx.x_shape), dwb[0], dwb[1], None, None, None


def check(x, component: str = "layer_norm") -> None:
    """What only these kernels refuse (levels.triton runs it once per argument signature,
    after the contract): rows too wide for registers, float64. (rms_norm's kernels, built
    the same way, refuse the same: `component` names the one whose call it is.)"""
    N = x.shape[-1]
    if N > MAX_WIDTH:
        raise ValueError(f"{component}: argument 'x' must have a last dimension <= {MAX_WIDTH} "
                         f"for the Triton kernel (one row lives in registers); got {N}")
    if x.dtype == torch.float64:
        raise TypeError(f"{component}: argument 'x' must be float16, bfloat16 or float32 for the "
                        "Triton kernels; got torch.float64")


def layer_norm(x, weight, bias, eps=1e-5, tiling=None, backward_tiling=None):
    """Called by levels.triton.layer_norm after the shared validation and `check`.

    tiling=None, backward_tiling=None: the tiles follow from the row width (_tiling,
    _backward_tiling). (BLOCK_M, num_warps) and (BLOCK_M, num_warps, programs per SM) pin
    the forward's and the backward's instead, for this call: `levels bench` times its
    sweeps so, passing them as arguments.

    Layouts: x may have any strides: its (M, N) row view keeps a row stride (a copy only
    when the last dimension itself is strided, see _rows). weight and bias are indexed
    `w_ptr + cols` by the kernels, so they are made contiguous here: a no-op for ordinary
    parameters, an N-element copy for a strided view (autograd carries the gradient back
    through the copy to the view)."""
    weight, bias = weight.contiguous(), bias.contiguous()
    if needs_grad(x, weight, bias):
        return apply_ahead(_LayerNorm, x, weight, bias, eps, tiling, backward_tiling)
    # Nothing to differentiate: autograd.Function.apply would only cost microseconds
    return forward_ahead(_inference, x, weight, bias, eps, tiling)


def _inference(x, weight, bias, eps, tiling):
    """The forward of a call that computes no gradient (launch.forward_ahead replays it)."""
    return _forward(x, weight, bias, eps, save=False, tiling=tiling)[0]
