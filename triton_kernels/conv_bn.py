"""Conv2d + BatchNorm2d in Triton: implicit-GEMM convolution, BN folded or fused around it.

What it adds over torch.compile / cuDNN + a BN kernel:
- Eval: BatchNorm is an affine map per output channel, so it folds into the convolution:
  w' = w * gamma / sqrt(var + eps),  b' = (b - mean) * gamma / sqrt(var + eps) + beta.
  One tiny kernel folds (and re-lays the weight out as (C_out, kH, kW, C_in), K-major),
  then a single convolution writes the final output: no BN pass over the activations.
- The convolution is an *implicit GEMM*: out[p, o] = sum_k A[p, k] * B[k, o] with
  p = (n, h_out, w_out), k = (i, j, c). A = im2col(x) is never built in memory: each
  program gathers its (BLOCK_M x BLOCK_K) slice of it straight from x (masked at the
  padding), so the GEMM reads x about kH*kW times from L2/SMEM, not from a 9x larger
  im2col buffer. k is ordered (i, j, c) so that with channels_last x consecutive k are
  consecutive addresses (wide, coalesced loads).
- Train: the convolution writes y in the input's dtype and, from its fp32 accumulator,
  each output tile's per-channel mean and M2 (sum of squared deviations); a small kernel
  merges the tiles per chunk of rows, and the apply kernel's programs each merge the
  chunks, both with Chan's formula (exact, no E[y^2] - E[y]^2 cancellation), apply the
  per-channel scale/shift to their own rows, and one of them per channel updates
  running_mean / running_var in place (unbiased variance, as BatchNorm2d).
- Backward, all with this file's kernels: dX is a transposed convolution, one implicit
  GEMM per stride phase (gathering dY at only the taps that reach each input pixel), dW
  an implicit GEMM over the p axis (split over chunks of p, as many as fill the GPU,
  partial sums reduced by a second kernel, no atomics; one split writes dW itself). Tiles
  follow the problem's channels (_fwd_tile, _wgrad_plan). In eval mode
  dgamma = rstd * (sum_k w[o,k] G[o,k] + (b - mean) sum_p dY[p,o]) with G = dY^T im2col(x),
  the same G that gives dW: y is never recomputed or stored.

Measured (H100, bf16 channels_last, N=32, 128 -> 256, 64x64, 3x3 pad 1,
reports/h100-bench.json and h100-triton-layer-norm-mlp-conv-bn.json): eval forward 0.26-0.34 ms =
228-301 TFLOP/s, 0.83-1.10x eager cuDNN Conv2d + BatchNorm2d over three runs (goal
0.75x; measured when an autotuner picked between two close tiles, which the size rule of
_fwd_tile now does without timing them); train forward
0.63-0.76x, train forward+backward 0.43-0.60x (the statistics and BN-backward passes over
y are separate kernels).

ResNet-50's shapes (reports/h100-conv-bn-level4.json, bf16 channels_last, N=32,
scripts/device_conv_bn_level4.py): the stem's train forward+backward 1.23 ms against
cuDNN's 1.38 (9.9 ms before the dgrad's stride phases and narrow tiles and the forward's
flat k), its eval forward 0.23 ms against 0.39. At the other shapes the kernels take
88-201 us a train step (torch.profiler) and the step ~0.5-1.2 ms: host time (9-10
launches, autograd, allocations; noisy on a shared host) is what is left to cut there,
against cuDNN's 0.26-0.64 ms in the same run.

What it costs: our own tiling and tuning instead of cuDNN's; the output needs a pass over
y after the convolution, since the statistics are only known once every tile is done
(train mode is not the fast path). The CNN's training step on an H100 after the statistics
moved into the epilogue and the weight gradient's rule was swept: the BatchNorm kernels
1.2 ms a step (were 2.0), Level 4's step 1.03x torch's with both as CUDA graphs
(reports/conv-bn-tile-statistics/). After the weight gradient's row steps (0.86 -> 0.60 ms
over the eight convolutions, cuDNN 0.57): 1.02-1.10x torch eager in three tables, 1.09x as
CUDA graphs, and Level 4's step 4.84 ms of GPU time against torch's 5.59
(reports/wgrad-row-steps/); after the forward's loop stopped dividing (0.77 -> 0.69 ms,
cuDNN 0.70): 1.08x and 1.14x (reports/conv-loop-counters/).

Layouts: x, conv_weight and the incoming gradient may have any strides (NCHW or
channels_last); kernels take all four strides. The output is allocated channels_last
(the natural layout of an implicit GEMM's (p, o) tile). The incoming gradient is copied
to channels_last once if it is not already (`.contiguous(memory_format=...)`, a no-op
when it is), so that it can be read as a (P, C_out) matrix.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from . import tuning
from .launch import (apply_ahead, autotuning, cdiv, fast_launch, forward_ahead, needs_grad,
                     next_power_of_2)
from .gemm import column_sum, column_sum_kernel, grouped_tile, sm_count

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"


# ---------------------------------------------------------------------------------------
# Convolution forward: out[p, o] = bias[o] + sum_{i,j,c} x[n, c, h*sh-ph+i, w*sw-pw+j] w[o,c,i,j]
# ---------------------------------------------------------------------------------------

@triton.jit
def _next_tap_step(block, col, row, blocks, cols):
    """The next step of a flat loop over (tap row, tap column, channel block): the block
    counts up to `blocks`, then the tap's column up to `cols`, then its row. Counters carried
    from step to step instead of the step index divided by run-time counts (conv_fwd_kernel
    says what that saved)."""
    block += 1
    tap_done = block == blocks
    block = tl.where(tap_done, 0, block)
    col += tap_done.to(tl.int32)
    row_done = col == cols
    col = tl.where(row_done, 0, col)
    row += row_done.to(tl.int32)
    return block, col, row


@fast_launch
@triton.jit
def conv_fwd_kernel(x_ptr, w_ptr, bias_ptr, out_ptr, gamma_ptr, beta_ptr, mean_ptr, var_ptr,
                    tile_mean_ptr, tile_m2_ptr, P, C_in, H, W, C_out, H_out, W_out,
                    sxn, sxc, sxh, sxw, swo, swc, swi, swj, sop, soo,
                    sh, sw, ph, pw, eps,
                    KH: tl.constexpr, KW: tl.constexpr, HAS_BIAS: tl.constexpr,
                    UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    GROUP_M: tl.constexpr, BN_EPILOGUE: tl.constexpr = False,
                    FLAT_K: tl.constexpr = False, TILE_STATS: tl.constexpr = False):
    pid_m, pid_n = grouped_tile(P, C_out, BLOCK_M, BLOCK_N, GROUP_M)

    offs_p = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_o = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_c = tl.arange(0, BLOCK_K)
    p_ok = offs_p < P
    o_ok = offs_o < C_out
    n = offs_p // (H_out * W_out)
    hw = offs_p % (H_out * W_out)
    h0 = (hw // W_out) * sh - ph
    w0 = (hw % W_out) * sw - pw
    x_row = x_ptr + n * sxn
    w_col = w_ptr + offs_o * swo

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if FLAT_K:
        # Few input channels (the stem's 3): the reduction index k = (i, j, c) is walked as
        # one flat range, BLOCK_K at a time, instead of one channel block per tap. Per tap a
        # 16-wide channel block (tl.dot's narrowest) would be 13 masked zeros for 3 channels:
        # 49 steps over 784 columns for 147 real ones at the 7x7 stem, against 5 steps of 32
        # here. With channels_last x one kernel row's (j, c) are adjacent addresses, so the
        # gather still reads runs of KW * C_in elements. Cost: the tap and channel of every
        # column are computed per step (a division and two modulos on a BLOCK_K vector) and
        # the bounds mask is 2-D.
        K_total = KH * KW * C_in
        for k0 in range(0, K_total, BLOCK_K):
            k = k0 + offs_c
            k_ok = k < K_total
            i = k // (KW * C_in)
            j = (k // C_in) % KW
            c = k % C_in
            hi = h0[:, None] + i[None, :]
            wi = w0[:, None] + j[None, :]
            in_img = p_ok[:, None] & k_ok[None, :] & (hi >= 0) & (hi < H) & (wi >= 0) & (wi < W)
            a = tl.load(x_row[:, None] + hi * sxh + wi * sxw + (c * sxc)[None, :], mask=in_img,
                        other=0.0)
            b = tl.load(w_col[None, :] + (c * swc + i * swi + j * swj)[:, None],
                        mask=k_ok[:, None] & o_ok[None, :], other=0.0)
            if UPCAST:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    else:
        c_blocks = tl.cdiv(C_in, BLOCK_K)
        # One flat loop over (kernel offset, channel block): a single loop the compiler can
        # software-pipeline, instead of a short inner loop restarted kH*kW times. The tap
        # (i, j) and channel block are counters carried from step to step, not a division
        # of t (a 32-bit division by the run-time c_blocks is a subroutine of ~20
        # instructions, every thread, every step), and each pixel's offset in x is computed
        # once (x_off): a step adds the tap's offset, a scalar, to it. The PTX loop at the
        # CNN's 3x3 tile went from 285 instructions (and the division) to 272, for eight
        # wgmma; over the CNN's eight convolutions, 0.77 -> 0.69 ms on an H100, cuDNN's
        # 0.70 (reports/conv-loop-counters/, the old kernel timed in the same run).
        x_off = n * sxn + h0 * sxh + w0 * sxw
        i = tl.zeros((), tl.int32)
        j = tl.zeros((), tl.int32)
        cb = tl.zeros((), tl.int32)
        for t in range(0, KH * KW * c_blocks):
            c = cb * BLOCK_K + offs_c
            hi = h0 + i
            wi = w0 + j
            in_img = p_ok & (hi >= 0) & (hi < H) & (wi >= 0) & (wi < W)
            c_ok = c < C_in
            a = tl.load(x_ptr + (x_off + (i * sxh + j * sxw))[:, None] + c[None, :] * sxc,
                        mask=in_img[:, None] & c_ok[None, :], other=0.0)
            b = tl.load(w_col[None, :] + c[:, None] * swc + i * swi + j * swj,
                        mask=c_ok[:, None] & o_ok[None, :], other=0.0)
            if UPCAST:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
            cb, j, i = _next_tap_step(cb, j, i, c_blocks, KW)

    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_o, mask=o_ok, other=0.0).to(tl.float32)[None, :]
    if TILE_STATS:
        # Training BatchNorm's batch statistics start here, on the tile still in registers:
        # its rows' mean and sum of squared deviations per output channel (exact in fp32,
        # two passes over registers). stats_merge_kernel merges the tiles with Chan's formula.
        # What it buys: the pass that read the whole fp32 conv output back from memory to
        # compute them (a stats_partial_kernel did: 0.53 ms of a 6.1 ms CNN step on an
        # H100). What it costs: two column sums per tile in the epilogue (+0.09 ms on that
        # step) and 8 bytes per tile and channel.
        tile_ok = p_ok[:, None] & o_ok[None, :]
        rows = tl.minimum(P - pid_m * BLOCK_M, BLOCK_M).to(tl.float32)
        t_mean = tl.sum(tl.where(tile_ok, acc, 0.0), axis=0) / rows
        dev = tl.where(tile_ok, acc - t_mean[None, :], 0.0)
        tl.store(tile_mean_ptr + pid_m * C_out + offs_o, t_mean, mask=o_ok)
        tl.store(tile_m2_ptr + pid_m * C_out + offs_o, tl.sum(dev * dev, axis=0), mask=o_ok)
    if BN_EPILOGUE:
        # Eval BatchNorm as the epilogue: (conv + b - mean) * gamma / sqrt(var + eps) + beta,
        # per output channel, on the tile in registers (fold_bn_kernel's job, without a
        # launch or a folded copy of the weight).
        ### BEGIN SOLUTION
        var = tl.load(var_ptr + offs_o, mask=o_ok, other=1.0).to(tl.float32)
        scale = tl.load(gamma_ptr + offs_o, mask=o_ok, other=0.0).to(tl.float32) \
            / tl.sqrt(var + tl.cast(eps, tl.float32))
        mean = tl.load(mean_ptr + offs_o, mask=o_ok, other=0.0).to(tl.float32)
        beta = tl.load(beta_ptr + offs_o, mask=o_ok, other=0.0).to(tl.float32)
        acc = (acc - mean[None, :]) * scale[None, :] + beta[None, :]
        ### END SOLUTION
    tl.store(out_ptr + offs_p[:, None] * sop + offs_o[None, :] * soo,
             acc.to(out_ptr.dtype.element_ty), mask=p_ok[:, None] & o_ok[None, :])


# ---------------------------------------------------------------------------------------
# dX: a transposed convolution. dx[n, c, h, w] = sum_{i,j,o} dy[n, o, ho, wo] w[o, c, i, j]
# where h = ho*sh - ph + i, i.e. ho = (h + ph - i) / sh when that divides exactly.
#
# One implicit GEMM per *stride phase*. With stride s, an input row h receives only from
# the taps i with i = (h + ph) mod s (mod s): for any other tap (h + ph - i) / s is not an
# integer. Gathering every tap and masking the wrong ones (the first version of this
# kernel) makes a stride-2 3x3 spend 3/4 of its loads and MMAs on zeros, the stem's 7x7/2
# about 3/4 too. So the input pixels are split by (h mod sh, w mod sw): each phase is a
# dense GEMM of its own pixels against only its own taps (ceil(KH / sh) x ceil(KW / sw) of
# them, or none: a 1x1 stride-2 conv's odd rows get no gradient, and their programs write
# zeros). The phases are the grid's second axis, one launch for all of them. Stride 1 is
# one phase with every tap: the plain transposed convolution.
# Cost: a division per pixel more (the phase's pixel -> (n, h, w)), and the grid covers the
# largest phase, so with odd H the smaller phases' last programs are partly masked.
# ---------------------------------------------------------------------------------------

@fast_launch
@triton.jit
def conv_dgrad_kernel(dy_ptr, w_ptr, dx_ptr,
                      N, C_in, H, W, C_out, H_out, W_out,
                      sdp, sdo, swo, swc, swi, swj, sxn, sxc, sxh, sxw,
                      sh, sw, ph, pw,
                      KH: tl.constexpr, KW: tl.constexpr,
                      UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      GROUP_M: tl.constexpr):
    phase = tl.program_id(1)
    rh = phase // sw  # this phase's input rows are h = rh + sh * t, columns w = rw + sw * v
    rw = phase % sw
    Ht = tl.cdiv(H - rh, sh)
    Wt = tl.cdiv(W - rw, sw)
    Q = N * Ht * Wt  # pixels of this phase (0 when rh >= H)
    # Its taps: i = i0 + sh * u for u < TH, with ho = t + bh - u (exact: no remainder to test).
    i0 = (rh + ph) % sh
    j0 = (rw + pw) % sw
    TH = tl.cdiv(KH - i0, sh)
    TW = tl.cdiv(KW - j0, sw)
    bh = (rh + ph - i0) // sh
    bw = (rw + pw - j0) // sw

    pid_m, pid_n = grouped_tile(N * tl.cdiv(H, sh) * tl.cdiv(W, sw), C_in,
                                BLOCK_M, BLOCK_N, GROUP_M)
    offs_q = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # this phase's input pixels (n, t, v)
    offs_c = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # input channels
    offs_o = tl.arange(0, BLOCK_K)
    q_ok = offs_q < Q
    c_ok = offs_c < C_in
    n = offs_q // tl.maximum(Ht * Wt, 1)
    tv = offs_q % tl.maximum(Ht * Wt, 1)
    t = tv // tl.maximum(Wt, 1)
    v = tv % tl.maximum(Wt, 1)
    # each pixel's dY row at tap (0, 0); a step's tap (u, vv) moves it by a scalar (as the
    # forward's x_off), and the tap and output-channel block are counters carried from step
    # to step, not divisions of the step index by run-time values
    dy_off = (n * (H_out * W_out) + (t + bh) * W_out + (v + bw)) * sdp
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    o_blocks = tl.cdiv(C_out, BLOCK_K)
    u = tl.zeros((), tl.int32)
    vv = tl.zeros((), tl.int32)
    ob = tl.zeros((), tl.int32)
    for step in range(0, TH * TW * o_blocks):
        o = ob * BLOCK_K + offs_o
        ho = t + (bh - u)
        wo = v + (bw - vv)
        ok = q_ok & (ho >= 0) & (ho < H_out) & (wo >= 0) & (wo < W_out)
        o_ok = o < C_out
        a = tl.load(dy_ptr + (dy_off - (u * W_out + vv) * sdp)[:, None] + o[None, :] * sdo,
                    mask=ok[:, None] & o_ok[None, :], other=0.0)
        b = tl.load(w_ptr + o[:, None] * swo + offs_c[None, :] * swc
                    + (i0 + sh * u) * swi + (j0 + sw * vv) * swj,
                    mask=o_ok[:, None] & c_ok[None, :], other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        ob, vv, u = _next_tap_step(ob, vv, u, o_blocks, TW)
    h = rh + sh * t
    w = rw + sw * v
    dx_ptrs = dx_ptr + (n * sxn + h * sxh + w * sxw)[:, None] + offs_c[None, :] * sxc
    tl.store(dx_ptrs, acc.to(dx_ptr.dtype.element_ty), mask=q_ok[:, None] & c_ok[None, :])


# ---------------------------------------------------------------------------------------
# dW: G[o, (i, j, c)] = sum_p dy[p, o] * x[n, c, ho*sh-ph+i, wo*sw-pw+j], split over chunks
# of p (P is large, C_out x K small: without the split only a handful of programs run).
# Each split writes its own fp32 slice of `part`; wgrad_finish_kernel sums them in a fixed
# order (deterministic, no atomics). The split count comes from the GPU (_wgrad_plan): just
# enough programs to fill every SM twice, no more, since each split costs an fp32 copy of
# G written and read again. When the tiles alone fill the GPU there is one split and the
# kernel writes dW itself (DIRECT): no partials, no finish launch.
#
# Every step takes a new block of BLOCK_K pixels apart into (image, row, column): two integer
# divisions and two remainders per pixel, and every thread holding a pixel's values repeats
# them. A 32-bit division by a value known only at run time is not an instruction but a
# subroutine of tens of them (the H200's wgrad, 6x cuDNN's, ran 96 divisions and 64
# remainders per thread per step: more integer work than its tensor cores had math). The
# divisors, H_out*W_out and W_out, are the same for the whole launch, so the host computes
# for each a "magic" multiplier and shift once (_divisor_magic, as CUTLASS's FastDivmod) and
# the kernel divides by a multiply-high and a shift (_fast_div). Cost: four more scalar
# arguments.
#
# Row steps (ROW_W > 0), the next idea: after the divisions were cheap, the loop was still
# issue-bound. ncu at the CNN's 3x3 64 -> 64 (reports/conv-bn-layout-and-suite/10-ncu-*):
# 75.6 M instructions for 38.7 GFLOP, 4.2 cycles per issued instruction, and its PTX loop
# 376 instructions per warp a step for four wgmma (Triton compiles it for sm_90 on a machine
# without a GPU: tests/triton_sm90_compile.py). Each thread rebuilds, for each of its pixels, the
# image, row and column, the bounds and the address. But when a step covers whole output
# rows of one image (BLOCK_K // ROW_W rows, ROW_W a power of two >= W_out; or one ROW_W-wide
# chunk of a longer row), the image and first row are the step's scalars, and everything
# that depends on where a pixel sits inside the step (its row and column offsets, the x
# address relative to the step's corner, the dY row) is the same at every step: computed
# once, before the loop. A step then costs two scalar divisions and, per element, the two
# bound checks and one add. The 64x256 tile's loop fell from 376 to 214 instructions; with
# the tile the row rule picks (_wgrad_plan), ncu counts 28.4 M instructions and 103 us at
# that shape (was 174 us; reports/wgrad-row-steps/).
# What it costs: a step whose rows are narrower than ROW_W (W_out not a power of two)
# carries masked pixels (wgrad_row_width allows a quarter), the rows of a step must not
# cross an image (H_out a multiple of them), and three more scalar arguments. Where either
# fails the kernel steps flat, as before.
# ---------------------------------------------------------------------------------------

def _divisor_magic(d: int) -> tuple[int, int]:
    """(multiplier, shift) with x // d == umulhi(x, multiplier) >> shift for every
    0 <= x < 2**31 (the pixel indices: int32 offsets); d == 1 is (0, 0), which _fast_div
    answers without them. The multiplier is ceil(2**p / d) with p = 31 + ceil(log2 d),
    which fits in 32 bits (Granlund and Montgomery's division by invariant integers)."""
    if d < 1:
        raise ValueError(f"conv_bn: a divisor of the pixel index must be >= 1; got {d}")
    if d == 1:
        return 0, 0
    p = 31 + (d - 1).bit_length()  # 31 + ceil(log2 d)
    return ((1 << p) + d - 1) // d, p - 32


def _divisor_args(d: int) -> tuple[int, int]:
    """_divisor_magic(d) as the kernel's two int32 arguments: the multiplier's 32 bits as a
    signed int32 (_fast_div reads them back as unsigned). A Python int of 2**31 or more as a
    kernel argument is an int64 to Triton and, in a model compiled whole, fails Inductor's
    code generation for user kernels (torch 2.11: "'int' object has no attribute
    'xreplace'" in expr_fits_within_32bit)."""
    magic, shift = _divisor_magic(d)
    return (magic - (1 << 32) if magic >= 1 << 31 else magic), shift


@triton.jit
def _fast_div(x, d, magic, shift):
    """x // d for 0 <= x < 2**31; magic and shift from _divisor_args(d) (the multiplier's
    bits in an int32). They may arrive as compile-time constants: Inductor compiles an
    argument equal to 1 (a shift of 1: d = 3 or 4) into the kernel, whatever
    do_not_specialize says, and a constant has no .to(); tl.full takes a constant and a
    scalar tensor alike."""
    m = tl.full((1,), magic, tl.int32).to(tl.uint32, bitcast=True)
    s = tl.full((1,), shift, tl.uint32)
    q = (tl.umulhi(x.to(tl.uint32), m) >> s).to(tl.int32)
    return tl.where(d == 1, x, q)


@fast_launch
# The divisors' multipliers and shifts are data, not specialized: Triton would compile an
# integer argument equal to 1 (shift 1: W_out = 3 or 4) into one more kernel as a constant
# (Inductor does so anyway, which _fast_div takes too).
@triton.jit(do_not_specialize=["hw_magic", "hw_shift", "w_magic", "w_shift"])
def conv_wgrad_kernel(dy_ptr, x_ptr, part_ptr,
                      P, C_in, H, W, C_out, H_out, W_out, K_total, per_split,
                      hw_magic, hw_shift, w_magic, w_shift, steps, row_steps, w_chunks,
                      sdp, sdo, sxn, sxc, sxh, sxw,
                      sh, sw, ph, pw, sdwo, sdwc, sdwi, sdwj,
                      KW: tl.constexpr, ROW_W: tl.constexpr,
                      UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      DIRECT: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    split = tl.program_id(2)
    offs_o = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # flat (i, j, c)
    o_ok = offs_o < C_out
    k_ok = offs_k < K_total
    i = offs_k // (KW * C_in)
    j = (offs_k // C_in) % KW
    c = offs_k % C_in
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if ROW_W == 0:
        # flat: a step is BLOCK_K consecutive pixels, wherever they fall, each taken apart
        # into (image, row, column) by two divisions
        p_first = split * per_split
        for p0 in range(0, per_split, BLOCK_K):
            p = p_first + p0 + tl.arange(0, BLOCK_K)
            p_ok = (p < P) & (p0 + tl.arange(0, BLOCK_K) < per_split)
            n = _fast_div(p, H_out * W_out, hw_magic, hw_shift)
            hw = p - n * (H_out * W_out)
            ho = _fast_div(hw, W_out, w_magic, w_shift)
            h0 = ho * sh - ph
            w0 = (hw - ho * W_out) * sw - pw
            a = tl.load(dy_ptr + p[None, :] * sdp + offs_o[:, None] * sdo,
                        mask=p_ok[None, :] & o_ok[:, None], other=0.0)
            hi = h0[:, None] + i[None, :]
            wi = w0[:, None] + j[None, :]
            ok = p_ok[:, None] & k_ok[None, :] & (hi >= 0) & (hi < H) & (wi >= 0) & (wi < W)
            b = tl.load(x_ptr + (n * sxn)[:, None] + c[None, :] * sxc + hi * sxh + wi * sxw,
                        mask=ok, other=0.0)
            if UPCAST:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    else:
        # rows: a step is BLOCK_K // ROW_W whole output rows of one image (or one ROW_W-wide
        # chunk of a longer row). Its image, first row and first column are the step's
        # scalars; where a pixel sits inside the step, and so every offset and bound but
        # those scalars, is the same at every step: computed once, before the loop.
        r = tl.arange(0, BLOCK_K) // ROW_W
        w = tl.arange(0, BLOCK_K) % ROW_W
        hi_in = (r * sh)[:, None] + i[None, :]
        wi_in = (w * sw)[:, None] + j[None, :]
        b_in = (r * sh * sxh + w * sw * sxw)[:, None] + (c * sxc + i * sxh + j * sxw)[None, :]
        a_in = (r * W_out + w)[None, :] * sdp + offs_o[:, None] * sdo
        t_first = split * per_split
        for q in range(0, tl.minimum(per_split, steps - t_first)):
            t = t_first + q
            n = _fast_div(t, row_steps, hw_magic, hw_shift)
            rest = t - n * row_steps
            g = _fast_div(rest, w_chunks, w_magic, w_shift)
            ho0 = g * (BLOCK_K // ROW_W)
            wo0 = (rest - g * w_chunks) * ROW_W
            w_ok = (wo0 + w) < W_out
            h0 = ho0 * sh - ph
            w0 = wo0 * sw - pw
            a = tl.load(dy_ptr + ((n * H_out + ho0) * W_out + wo0) * sdp + a_in,
                        mask=w_ok[None, :] & o_ok[:, None], other=0.0)
            hi = h0 + hi_in
            wi = w0 + wi_in
            ok = w_ok[:, None] & k_ok[None, :] & (hi >= 0) & (hi < H) & (wi >= 0) & (wi < W)
            b = tl.load(x_ptr + (n * sxn + h0 * sxh + w0 * sxw) + b_in, mask=ok, other=0.0)
            if UPCAST:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    if DIRECT:  # one split: part_ptr is dW itself, (o, c, i, j) through its strides
        dw = part_ptr + offs_o[:, None] * sdwo + (c * sdwc + i * sdwi + j * sdwj)[None, :]
        tl.store(dw, acc.to(part_ptr.dtype.element_ty), mask=o_ok[:, None] & k_ok[None, :])
    else:
        part = part_ptr + split * C_out * K_total + offs_o[:, None] * K_total + offs_k[None, :]
        tl.store(part, acc, mask=o_ok[:, None] & k_ok[None, :])


@fast_launch
@triton.jit
def wgrad_finish_kernel(part_ptr, splits, C_out, K_total, C_in,
                        dw_ptr, sdwo, sdwc, sdwi, sdwj, w_ptr, swo, swc, swi, swj,
                        scale_ptr, invstd_ptr, mean_ptr, bias_ptr, sum_dy_ptr,
                        dgamma_ptr, dbeta_ptr, dbias_ptr,
                        KW: tl.constexpr, EVAL: tl.constexpr, HAS_BIAS: tl.constexpr,
                        BLOCK: tl.constexpr):
    """Program (o, b): G[o, k] = sum of the split partials for the k of block b, b + (grid's
    second axis), ..., then train: dW = G.  eval (conv ran on w' = w * scale): dW = scale * G,
    and the BN grads, which need all of row o: eval launches one program per row. (Train
    launches one per BLOCK of the row: with one per row, ResNet's 64-channel layers ran 64
    programs over the partials, half the SMs idle.)"""
    o = tl.program_id(0)
    if EVAL:
        scale = tl.load(scale_ptr + o)
    wdot = tl.zeros((BLOCK,), dtype=tl.float32)
    for k0 in range(tl.program_id(1) * BLOCK, K_total, BLOCK * tl.num_programs(1)):
        k = k0 + tl.arange(0, BLOCK)
        k_ok = k < K_total
        g = tl.zeros((BLOCK,), dtype=tl.float32)
        for s in range(0, splits):
            g += tl.load(part_ptr + (s * C_out + o) * K_total + k, mask=k_ok, other=0.0)
        i = k // (KW * C_in)
        j = (k // C_in) % KW
        c = k % C_in
        if EVAL:
            w = tl.load(w_ptr + o * swo + c * swc + i * swi + j * swj, mask=k_ok, other=0.0)
            wdot += w.to(tl.float32) * g
            g = g * scale
        tl.store(dw_ptr + o * sdwo + c * sdwc + i * sdwi + j * sdwj,
                 g.to(dw_ptr.dtype.element_ty), mask=k_ok)
    if EVAL:
        # sum_p dY[p,o] * (y[p,o] - mean[o]) with y = conv(x, w) + b: the conv part is
        # sum_k w[o,k] G[o,k], the rest is (b - mean) * sum_p dY.
        s_dy = tl.load(sum_dy_ptr + o)
        shift = -tl.load(mean_ptr + o).to(tl.float32)
        if HAS_BIAS:
            shift += tl.load(bias_ptr + o).to(tl.float32)
            tl.store(dbias_ptr + o, (scale * s_dy).to(dbias_ptr.dtype.element_ty))
        dgamma = tl.load(invstd_ptr + o) * (tl.sum(wdot, axis=0) + shift * s_dy)
        tl.store(dgamma_ptr + o, dgamma.to(dgamma_ptr.dtype.element_ty))
        tl.store(dbeta_ptr + o, s_dy.to(dbeta_ptr.dtype.element_ty))


# ---------------------------------------------------------------------------------------
# Eval: fold BatchNorm into the convolution's weight and bias.
# ---------------------------------------------------------------------------------------

@fast_launch
@triton.jit
def fold_bn_kernel(w_ptr, swo, swc, swi, swj, bias_ptr, gamma_ptr, beta_ptr, mean_ptr, var_ptr,
                   wf_ptr, bf_ptr, scale_ptr, invstd_ptr, C_in, K_total, eps,
                   KW: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    """Program o: w'[o, i, j, c] = w[o, c, i, j] * s,  b'[o] = (b - mean) * s + beta,
    s = gamma / sqrt(var + eps). w' is written K-major, (C_out, kH, kW, C_in)."""
    o = tl.program_id(0)
    ### BEGIN SOLUTION
    invstd = 1.0 / tl.sqrt(tl.load(var_ptr + o).to(tl.float32) + eps)
    scale = tl.load(gamma_ptr + o).to(tl.float32) * invstd
    ### END SOLUTION
    for k0 in range(0, K_total, BLOCK):
        k = k0 + tl.arange(0, BLOCK)
        k_ok = k < K_total
        i = k // (KW * C_in)
        j = (k // C_in) % KW
        c = k % C_in
        w = tl.load(w_ptr + o * swo + c * swc + i * swi + j * swj, mask=k_ok, other=0.0)
        tl.store(wf_ptr + o * K_total + k, (w.to(tl.float32) * scale).to(wf_ptr.dtype.element_ty),
                 mask=k_ok)
    shift = -tl.load(mean_ptr + o).to(tl.float32)
    if HAS_BIAS:
        shift += tl.load(bias_ptr + o).to(tl.float32)
    tl.store(bf_ptr + o, shift * scale + tl.load(beta_ptr + o).to(tl.float32))
    tl.store(scale_ptr + o, scale)
    tl.store(invstd_ptr + o, invstd)


# ---------------------------------------------------------------------------------------
# Train: batch statistics of y (P, C), from the conv's tiles, merged with Chan's formula.
# ---------------------------------------------------------------------------------------

@triton.jit
def _chan_merge(mean_ptr, m2_ptr, first, last, size, P, C, count, cols, c_ok,
                BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr):
    """(mean, M2) per column of the `count` rows held by partials first..last-1 (row-major,
    C columns), partial s summarizing `size` rows (the last one of P fewer), by Chan's
    formula: the mean weighted by the counts, then M2 = sum of M2_s + n_s (mean_s - mean)^2.
    Read BLOCK_S partials a step as 2-D tiles."""
    total = tl.zeros((BLOCK_S, BLOCK_C), dtype=tl.float32)
    for s0 in range(first, last, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        ok = (s < last)[:, None] & c_ok[None, :]
        n_s = tl.maximum(tl.minimum(size, P - s * size), 0).to(tl.float32)
        total += n_s[:, None] * tl.load(mean_ptr + s[:, None] * C + cols[None, :], mask=ok,
                                        other=0.0)
    mean = tl.sum(total, axis=0) / count
    m2 = tl.zeros((BLOCK_S, BLOCK_C), dtype=tl.float32)
    for s0 in range(first, last, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        ok = (s < last)[:, None] & c_ok[None, :]
        n_s = tl.maximum(tl.minimum(size, P - s * size), 0).to(tl.float32)
        d = tl.load(mean_ptr + s[:, None] * C + cols[None, :], mask=ok, other=0.0) - mean[None, :]
        m2 += tl.where(ok, tl.load(m2_ptr + s[:, None] * C + cols[None, :], mask=ok,
                                   other=0.0) + n_s[:, None] * d * d, 0.0)
    return mean, tl.sum(m2, axis=0)


@fast_launch
@triton.jit
def stats_merge_kernel(tile_mean_ptr, tile_m2_ptr, part_mean_ptr, part_m2_ptr, P, C,
                       tiles, tiles_per_chunk, TILE_M: tl.constexpr,
                       BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr):
    """Program (chunk, column block): the (mean, M2) of a chunk of rows from those of the
    conv tiles inside it (TILE_M rows each, the last one short), the per-chunk partials
    bn_fwd_apply_kernel merges. It reads 8 bytes per tile and channel instead of the conv
    output."""
    chunk = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = cols < C
    first = chunk * tiles_per_chunk
    last = tl.minimum(first + tiles_per_chunk, tiles)
    count = tl.minimum(tiles_per_chunk * TILE_M, P - first * TILE_M).to(tl.float32)
    mean, m2 = _chan_merge(tile_mean_ptr, tile_m2_ptr, first, last, TILE_M, P, C, count, cols,
                           c_ok, BLOCK_S, BLOCK_C)
    tl.store(part_mean_ptr + chunk * C + cols, mean, mask=c_ok)
    tl.store(part_m2_ptr + chunk * C + cols, m2, mask=c_ok)


@fast_launch
@triton.jit
def bn_fwd_apply_kernel(y_ptr, part_mean_ptr, part_m2_ptr, chunks, rows_per_chunk, P, C,
                        gamma_ptr, beta_ptr, run_mean_ptr, run_var_ptr, mean_ptr, invstd_ptr,
                        out_ptr, sop, soo, eps, momentum,
                        BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr):
    """Program (chunk, column block): merge every chunk's (mean, M2) of its columns with
    Chan's formula, then out = y * scale + shift over its own chunk of rows; chunk 0 also
    stores mean and 1/std for the backward and updates the running statistics.

    Finalizing and applying were two launches (a finalize kernel over the columns, then an
    elementwise one); here each program redoes the small merge itself (chunks x BLOCK_C
    partials, read BLOCK_S chunks a step as 2-D tiles) instead. What that buys: one launch
    less per training step, whose host time is most of a step at ResNet's small layers (H100,
    layer4 3x3: 146 us of kernels, ~650 us of host per train step). What it costs: the
    partials are read once per chunk instead of once (chunks = one per SM, so ~130 x 32
    floats a program, from L2)."""
    chunk = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = cols < C
    mean, m2 = _chan_merge(part_mean_ptr, part_m2_ptr, 0, chunks, rows_per_chunk, P, C,
                           P * 1.0, cols, c_ok, BLOCK_S, BLOCK_C)
    ### BEGIN SOLUTION
    invstd = 1.0 / tl.sqrt(m2 / P + eps)  # normalize with the biased variance
    scale = tl.load(gamma_ptr + cols, mask=c_ok, other=0.0).to(tl.float32) * invstd
    shift = tl.load(beta_ptr + cols, mask=c_ok, other=0.0).to(tl.float32) - mean * scale
    # ...but track the unbiased variance, exactly as BatchNorm2d does.
    rm = tl.load(run_mean_ptr + cols, mask=c_ok, other=0.0).to(tl.float32)
    rv = tl.load(run_var_ptr + cols, mask=c_ok, other=0.0).to(tl.float32)
    rm = (1.0 - momentum) * rm + momentum * mean
    rv = (1.0 - momentum) * rv + momentum * (m2 / (P - 1))
    ### END SOLUTION
    if chunk == 0:  # one program per column writes the per-channel results
        tl.store(mean_ptr + cols, mean, mask=c_ok)
        tl.store(invstd_ptr + cols, invstd, mask=c_ok)
        tl.store(run_mean_ptr + cols, rm.to(run_mean_ptr.dtype.element_ty), mask=c_ok)
        tl.store(run_var_ptr + cols, rv.to(run_var_ptr.dtype.element_ty), mask=c_ok)
    first = chunk * rows_per_chunk
    for r in range(0, rows_per_chunk, BLOCK_P):
        rows = first + r + tl.arange(0, BLOCK_P)
        mask = ((rows < P) & (r + tl.arange(0, BLOCK_P) < rows_per_chunk))[:, None] & c_ok[None, :]
        y = tl.load(y_ptr + rows[:, None] * C + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        out = y * scale[None, :] + shift[None, :]
        tl.store(out_ptr + rows[:, None] * sop + cols[None, :] * soo,
                 out.to(out_ptr.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------------------------------
# Train backward through BN: dy_conv = gamma * invstd * (dY - mean(dY) - xhat * mean(dY xhat)).
# ---------------------------------------------------------------------------------------

@fast_launch
@triton.jit
def bn_bwd_partial_kernel(dy_ptr, sdp, sdo, y_ptr, mean_ptr, invstd_ptr, part_ptr,
                          P, C, rows_per_chunk, chunks,
                          BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    chunk = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = cols < C
    mean = tl.load(mean_ptr + cols, mask=c_ok, other=0.0)
    invstd = tl.load(invstd_ptr + cols, mask=c_ok, other=0.0)
    s_dy = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
    s_dyx = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
    first = chunk * rows_per_chunk
    for r in range(0, rows_per_chunk, BLOCK_P):
        rows = first + r + tl.arange(0, BLOCK_P)
        mask = ((rows < P) & (r + tl.arange(0, BLOCK_P) < rows_per_chunk))[:, None] & c_ok[None, :]
        dy = tl.load(dy_ptr + rows[:, None] * sdp + cols[None, :] * sdo, mask=mask,
                     other=0.0).to(tl.float32)
        y = tl.load(y_ptr + rows[:, None] * C + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        s_dy += dy
        s_dyx += dy * (y - mean[None, :]) * invstd[None, :]
    tl.store(part_ptr + chunk * C + cols, tl.sum(s_dy, axis=0), mask=c_ok)
    tl.store(part_ptr + (chunks + chunk) * C + cols, tl.sum(s_dyx, axis=0), mask=c_ok)


@fast_launch
@triton.jit
def bn_bwd_apply_kernel(dy_ptr, sdp, sdo, y_ptr, mean_ptr, invstd_ptr, gamma_ptr, part_ptr,
                        chunks, dgamma_ptr, dbeta_ptr, dyc_ptr, dbias_part_ptr, P, C,
                        rows_per_chunk,
                        HAS_BIAS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
                        BLOCK_S: tl.constexpr):
    """Program (chunk, column block): sum_p dY and sum_p dY xhat of its columns from every
    chunk's partials (bn_bwd_partial_kernel's; chunk 0 stores them as dbeta and dgamma), then
    dyc over its own chunk of rows, stored in the input's dtype for the dgrad and wgrad GEMMs.
    The merge is redone by every program instead of by a finalize launch of its own
    (bn_fwd_apply_kernel says what that buys and costs).

    With a conv bias it also sums dyc per channel *before* that rounding: grad conv_bias =
    sum_p dyc is mathematically 0 (the batch mean absorbs the bias), so what is computed is
    rounding noise, and summing the bf16-rounded dyc would make that noise several times
    larger than the fp32 sum's (at the stem's P = 401408 it failed the check)."""
    chunk = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = cols < C
    t_dy = tl.zeros((BLOCK_S, BLOCK_C), dtype=tl.float32)
    t_dyx = tl.zeros((BLOCK_S, BLOCK_C), dtype=tl.float32)
    for s0 in range(0, chunks, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        ok = (s < chunks)[:, None] & c_ok[None, :]
        t_dy += tl.load(part_ptr + s[:, None] * C + cols[None, :], mask=ok, other=0.0)
        t_dyx += tl.load(part_ptr + (chunks + s)[:, None] * C + cols[None, :], mask=ok, other=0.0)
    sum_dy = tl.sum(t_dy, axis=0)
    sum_dyx = tl.sum(t_dyx, axis=0)
    if chunk == 0:
        tl.store(dbeta_ptr + cols, sum_dy.to(dbeta_ptr.dtype.element_ty), mask=c_ok)
        tl.store(dgamma_ptr + cols, sum_dyx.to(dgamma_ptr.dtype.element_ty), mask=c_ok)
    mean = tl.load(mean_ptr + cols, mask=c_ok, other=0.0)
    invstd = tl.load(invstd_ptr + cols, mask=c_ok, other=0.0)
    gamma = tl.load(gamma_ptr + cols, mask=c_ok, other=0.0).to(tl.float32)
    m_dy = sum_dy / P
    m_dyx = sum_dyx / P
    s_dyc = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
    first = chunk * rows_per_chunk
    for r in range(0, rows_per_chunk, BLOCK_P):
        rows = first + r + tl.arange(0, BLOCK_P)
        mask = ((rows < P) & (r + tl.arange(0, BLOCK_P) < rows_per_chunk))[:, None] & c_ok[None, :]
        dy = tl.load(dy_ptr + rows[:, None] * sdp + cols[None, :] * sdo, mask=mask,
                     other=0.0).to(tl.float32)
        y = tl.load(y_ptr + rows[:, None] * C + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        ### BEGIN SOLUTION
        xhat = (y - mean[None, :]) * invstd[None, :]
        dyc = (gamma * invstd)[None, :] * (dy - m_dy[None, :] - xhat * m_dyx[None, :])
        ### END SOLUTION
        if HAS_BIAS:
            s_dyc += tl.where(mask, dyc, 0.0)
        tl.store(dyc_ptr + rows[:, None] * C + cols[None, :], dyc.to(dyc_ptr.dtype.element_ty),
                 mask=mask)
    if HAS_BIAS:
        tl.store(dbias_part_ptr + chunk * C + cols, tl.sum(s_dyc, axis=0), mask=c_ok)


KERNELS = [conv_fwd_kernel, conv_dgrad_kernel, conv_wgrad_kernel, wgrad_finish_kernel,
           fold_bn_kernel, stats_merge_kernel, bn_fwd_apply_kernel,
           bn_bwd_partial_kernel, bn_bwd_apply_kernel]


def uses_tf32(device, dtype) -> bool:
    return False  # fp32 dots use input_precision="ieee"


# ---------------------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------------------

def _fwd_configs():
    return [_FWD_MID, _FWD_BIG]


_FWD_MID = triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8},
                         num_stages=3, num_warps=8)
_FWD_BIG = triton.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8},
                         num_stages=3, num_warps=8)

def _fwd_tile(P: int, C_in: int, C_out: int, device) -> dict:
    """The forward's 16-bit tile from the problem's size, as gemm.tile_for chooses a GEMM's
    (the implicit GEMM's output is P x C_out, its reduction kH*kW taps of C_in channels):

    - BLOCK_K, the channels of one step, is no wider than C_in rounded up to a power of two
      (16 at least, tl.dot's minimum): at ResNet's stem (C_in = 3) a 64-wide step would
      multiply 61 masked zeros for every 3 channels;
    - BLOCK_N follows C_out: 64 for C_out <= 64 (a 128 or 256 wide tile would be half or
      three-quarters masked columns), the wide 256 only when C_out fills it and its tiles
      alone fill every SM, else 128;
    - BLOCK_M is 64 instead of 128 when the 128-row tiles would leave half the SMs idle.

    LEVELS_TRITON_AUTOTUNE=1 times this tile and the two fixed ones instead, once per shape
    bucket, and keeps the winner on disk (triton_kernels/tuning.py)."""
    block_k = min(64, max(16, next_power_of_2(C_in)))
    sms = sm_count(device)
    if C_out <= 64:
        block_n, warps = 64, 4
    elif C_out >= 256 and cdiv(P, 128) * cdiv(C_out, 256) >= sms:
        block_n, warps = 256, 8
    else:
        block_n, warps = 128, 8
    block_m = 128
    if 2 * cdiv(P, 128) * cdiv(C_out, block_n) <= sms:
        # Few output pixels (ResNet's 7x7 stages: P = 32 x 49): half-height tiles, twice
        # the programs, when the 128-row tiles would leave half the SMs idle or more. H100
        # kernel times (reports/h100-small-shapes.json): layer4 3x3 43 us against 58; at
        # layer3 (98 tiles of 128 rows) the 64-row tile was slower, 32 us against 26.
        block_m, warps = 64, 4
    return dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8, num_warps=warps,
                num_stages=3)


def _dot_cfg(dtype):
    """(precision, fixed tile config) for the GEMM-like kernels without autotuning."""
    if INTERPRETED:
        return "ieee", dict(BLOCK_M=32, BLOCK_N=16, BLOCK_K=16, num_warps=4, num_stages=1)
    if dtype == torch.float32:  # "ieee" fp32 runs on CUDA cores: small tiles
        return "ieee", dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, num_warps=4, num_stages=3)
    return "tf32", dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=3)


def _w_strides(w):
    return w.stride(0), w.stride(1), w.stride(2), w.stride(3)


def _conv_fwd(x, w_ptr_t, w_strides, bias, out2d, s, kH, kW, bn=None, tile_stats=False):
    """out2d[p, o] = conv(x, w)[p, o] (+ bias). w given as a tensor + its (o, c, i, j) strides.
    bn: (gamma, beta, running_mean, running_var, eps) to apply eval BatchNorm in the epilogue.
    tile_stats: also each row tile's per-channel mean and M2 (conv_fwd_kernel's TILE_STATS);
    returns them, (tiles, C_out) each, and the tile's height."""
    N, C_in, H, W = x.shape
    P = N * s["H_out"] * s["W_out"]
    C_out = out2d.shape[1]
    precision, cfg = _dot_cfg(x.dtype)
    gamma, beta, mean, var, eps = bn if bn is not None else (out2d, out2d, out2d, out2d, 0.0)
    # BN_EPILOGUE, TILE_STATS and their pointers given even when unused: Inductor's wrapper
    # counts the arguments (gemm.py). Tensors go positionally: the launch key and the
    # compile-ahead record take keyword arguments by value.
    # FLAT_K for C_in <= 8: a channel block per tap would be at least half masked
    common = dict(KH=kH, KW=kW, HAS_BIAS=bias is not None, UPCAST=INTERPRETED,
                  DOT_PRECISION=precision, BN_EPILOGUE=bn is not None, FLAT_K=C_in <= 8,
                  TILE_STATS=tile_stats)

    def args_for(block_m: int) -> tuple:
        """The launch's positional arguments, with tile statistics buffers for this tile
        height (the dummy out2d without statistics)."""
        stats = (out2d, out2d)
        if tile_stats:
            stats = torch.empty((2, cdiv(P, block_m), C_out), device=x.device,
                                dtype=torch.float32).unbind(0)
        return (x, w_ptr_t, bias if bias is not None else out2d, out2d, gamma, beta, mean, var,
                *stats, P, C_in, H, W, C_out, s["H_out"], s["W_out"], *x.stride(), *w_strides,
                out2d.stride(0), out2d.stride(1), *s["stride"], *s["padding"], eps)

    if INTERPRETED or x.dtype == torch.float32:
        grid = (cdiv(P, cfg["BLOCK_M"]) * cdiv(C_out, cfg["BLOCK_N"]),)
        args = args_for(cfg["BLOCK_M"])
        conv_fwd_kernel[grid](*args, **common, GROUP_M=8, **cfg)
    else:
        cfg = _fwd_tile(P, C_in, C_out, x.device)
        if C_in <= 8:  # flat k: 32 columns a step (the stem's 147 in 5 steps, 9% masked)
            cfg = dict(cfg, BLOCK_K=32)
        if autotuning():  # the rule's tile and the fixed ones, timed once per shape bucket
            key = (str(x.dtype).removeprefix("torch."), tuning.bucket(P), tuning.bucket(C_in),
                   tuning.bucket(C_out), kH, kW, *s["stride"], x.stride(1) == 1,
                   w_strides[1] == 1, bias is not None, bn is not None)
            candidates = [cfg] + [dict(c.kwargs, num_warps=c.num_warps, num_stages=c.num_stages)
                                  for c in _fwd_configs()]
            candidates = [c for i, c in enumerate(candidates) if c not in candidates[:i]]

            def run(c):
                grid = (cdiv(P, c["BLOCK_M"]) * cdiv(C_out, c["BLOCK_N"]),)
                conv_fwd_kernel[grid](*args_for(c["BLOCK_M"]), **common, **c)
            cfg = tuning.pick("conv_fwd", key, candidates,
                              lambda c: tuning.benchmark(lambda: run(c)), x.device)
        grid = (cdiv(P, cfg["BLOCK_M"]) * cdiv(C_out, cfg["BLOCK_N"]),)
        args = args_for(cfg["BLOCK_M"])
        conv_fwd_kernel[grid](*args, **common, **cfg)
    if tile_stats:
        return args[8], args[9], cfg["BLOCK_M"]  # tile_mean_ptr, tile_m2_ptr
    return None


def _conv_dgrad(dy2d, w_t, w_strides, x_like, s, kH, kW):
    """dx = the transposed convolution of dy2d, one implicit GEMM per stride phase (see
    conv_dgrad_kernel), all phases in one launch. Its tile is the forward's size rule
    (_fwd_tile) read for this GEMM: output Q x C_in, reduction over taps of C_out channels,
    so the channels of one step follow C_out and the tile's width follows C_in (16 at the
    stem's C_in = 3, not 128: a fixed 128-wide tile there was 125 masked columns of 128)."""
    N, C_in, H, W = x_like.shape
    C_out = dy2d.shape[1]
    dx = torch.empty_like(x_like)  # keeps x's memory format
    (sh, sw), (ph, pw) = s["stride"], s["padding"]
    Q = N * cdiv(H, sh) * cdiv(W, sw)  # pixels of the largest phase (the grid covers it)
    precision, cfg = _dot_cfg(x_like.dtype)
    if not INTERPRETED and x_like.dtype != torch.float32:
        cfg = _fwd_tile(Q * sh * sw, C_out, C_in, x_like.device)
        if C_in < 64:
            # The forward never has fewer than 64 output channels in a CNN; this GEMM's
            # output has the *input's* channels, 3 at the stem, where the 64-wide tile would
            # be 61 masked columns of 64. tl.dot's narrowest is 16 (H100 profile of the
            # stem's dgrad: 1162 us with 64 columns).
            cfg = dict(cfg, BLOCK_N=max(16, next_power_of_2(C_in)), num_warps=4)
    grid = (cdiv(Q, cfg["BLOCK_M"]) * cdiv(C_in, cfg["BLOCK_N"]), sh * sw)
    conv_dgrad_kernel[grid](dy2d, w_t, dx, N, C_in, H, W, C_out, s["H_out"], s["W_out"],
                            dy2d.stride(0), dy2d.stride(1), *w_strides, *dx.stride(),
                            sh, sw, ph, pw, KH=kH, KW=kW, UPCAST=INTERPRETED,
                            DOT_PRECISION=precision, **_with_group(cfg))
    return dx


def _with_group(cfg: dict) -> dict:
    return cfg if "GROUP_M" in cfg else dict(cfg, GROUP_M=8)


def _wgrad_plan(P: int, C_in: int, C_out: int, K_total: int, dtype, device,
                H_out: int = 0, W_out: int = 0) -> tuple[dict, int]:
    """(tile, splits) of the weight-gradient GEMM G (C_out x K_total) = dY^T im2col(x),
    reduced over the P pixels, from the problem's size:

    - the tile's rows follow C_out (64 for C_out <= 64: a 128-row tile would be half masked
      rows at ResNet's 64-channel layers), its columns K_total (64 below 256 columns: the
      stem's 147 = 7x7x3 fills three 64-wide tiles to 77%, two 128-wide ones to 57%);
    - 256 columns where C_out is small (<= 128) and K_total from 512 to 1023 (a 3x3 conv
      of 64 input channels): the dY^T operand is read transposed (each pixel's channels are
      contiguous, the tile wants them as rows), the costlier load, and a wider tile reads it
      once for twice the columns. Measured, not derived: 179 against 240 us at 64 -> 64,
      76 against 101 at 64 -> 128 stride 2, but 190 against 158 at 128 -> 128 (K_total
      1152), so the rule stops there;
    - the split over P gives the (C_out x K_total) tiles enough programs to fill every SM
      twice (two 128x128 programs fit an SM's shared memory; a 256-wide one fills it: once),
      each at least 2048 pixels: a split costs an fp32 copy of G, written and read back by
      the finish kernel (at 512 pixels a 1x1 64->128 conv made 256 copies and took 80 us,
      at 64 copies 45 us).
    Measured at the CNN's eight convolutions on an H100 (scripts/sweep_conv_wgrad.py,
    reports/conv-bn-tile-statistics/sweep-conv-wgrad-*.json): 0.94 ms a step by the earlier
    rule, 0.77 ms for the best candidate of each, cuDNN 0.54.

    That rule holds for flat steps. Where the pixels go in row steps (wgrad_row_width), a
    step's gather costs about half the instructions, and the tile that wins changes
    (reports/wgrad-row-steps/, the sweep of every tile in row steps): 64 rows for every
    C_out, 128 columns (64 where fewer than 85% of those are real), 4 warps, so that two
    or three programs share an SM (72-96 KB of shared memory each) instead of one 64x256 program
    (123 KB) waiting on its own loads; three stages, four where a step holds four or more
    rows (16-wide rows: measured 62, 100 and 27 us with four stages against 77, 97 and 50
    with three at the CNN's last three convolutions; not derived)."""
    precision, cfg = _dot_cfg(dtype)
    waves = 2
    row_w = wgrad_row_width(H_out, W_out, 64) if ROW_STEPS and H_out else 0
    if not INTERPRETED and dtype != torch.float32 and row_w:
        cfg = dict(BLOCK_M=64, BLOCK_N=wgrad_row_columns(K_total), BLOCK_K=64, num_warps=4,
                   num_stages=4 if row_w <= 16 else 3)
    elif not INTERPRETED and dtype != torch.float32:
        bm = 64 if C_out <= 64 else 128
        bn = 64 if K_total < 256 else 128
        if C_out <= 128 and 512 <= K_total < 1024:
            bn, waves = 256, 1
        cfg = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=64, num_warps=8 if bm * bn >= 128 * 128 else 4,
                   num_stages=3)
    tiles = cdiv(C_out, cfg["BLOCK_M"]) * cdiv(K_total, cfg["BLOCK_N"])
    if INTERPRETED:
        splits = min(2, cdiv(P, cfg["BLOCK_K"]))
    else:
        splits = wgrad_splits(P, tiles, waves * sm_count(device))
    return wgrad_steps(dict(cfg, precision=precision), P, splits, H_out, W_out, ROW_STEPS)


def wgrad_steps(cfg: dict, P: int, splits: int, H_out: int, W_out: int,
                rows: bool = True) -> tuple[dict, int]:
    """The plan (cfg with per_split, ROW_W and, for row steps, (steps, steps per image,
    chunks per row)) and the split count, for about `splits` splits of the P pixels."""
    bk = cfg["BLOCK_K"]
    row_w = wgrad_row_width(H_out, W_out, bk) if rows and H_out else 0
    if row_w:  # per_split counts steps, each bk // row_w rows (or a row's chunk)
        w_chunks = cdiv(W_out, row_w)
        row_steps = H_out // (bk // row_w) * w_chunks
        steps = P // (H_out * W_out) * row_steps
        per_split = cdiv(steps, splits)
        return (dict(cfg, per_split=per_split, ROW_W=row_w, rows=(steps, row_steps, w_chunks)),
                cdiv(steps, per_split))
    per_split = cdiv(cdiv(P, splits), bk) * bk
    return dict(cfg, per_split=per_split, ROW_W=0), cdiv(P, per_split)


def wgrad_row_columns(K_total: int) -> int:
    """The row rule's tile width over K_total = kH*kW*C_in: 128 where at least 85% of the
    128-wide tiles' columns are real (576 = 3x3x64 in five: 90%), else 64. ResNet-50's stem,
    147 = 7x7x3, is 57% real in two 128-wide tiles and 77% in three 64-wide ones: it took
    1.36 ms forward+backward in 128-wide tiles against 1.08 in 64-wide ones (H100,
    reports/conv-loop-counters/, calls 8 and 9)."""
    return 128 if 100 * K_total >= 85 * cdiv(K_total, 128) * 128 else 64


# Step over whole output rows (conv_wgrad_kernel's ROW_W) where the shape allows it; off
# only to time the flat steps against it (scripts/sweep_conv_wgrad.py).
ROW_STEPS = True


def wgrad_row_width(H_out: int, W_out: int, block_k: int) -> int:
    """The width of the weight gradient's row steps (a power of two: each step is
    block_k // width rows), or 0 for flat steps: where a step's rows would cross an image
    (H_out not a multiple of them), or where rounding W_out up would leave more than a
    quarter of a step's pixels masked (W_out = 14 in steps 16 wide is fine; 5 in 8 is not)."""
    width = min(block_k, next_power_of_2(W_out))
    if H_out % (block_k // width) or 4 * W_out < 3 * cdiv(W_out, width) * width:
        return 0
    return width


def wgrad_splits(P: int, tiles: int, programs: int) -> int:
    """How many splits of the P pixels give `tiles` tiles about `programs` programs, each
    split at least 2048 pixels (_wgrad_plan says why)."""
    return max(1, min(cdiv(P, 2048), cdiv(programs, tiles)))


def train_wgrad(dyc, x, w, s, kH, kW):
    """dW of the training backward: G = dY^T im2col(x) in partials (or straight into dW when
    one split covers P), then their sum."""
    dw = torch.empty_like(w)
    part_w, splits = _conv_wgrad_partials(dyc, x, s, kH, kW, dw=dw)
    if part_w is not None:
        C_out, K_total = part_w.shape[1], part_w.shape[2]
        block = 256 if INTERPRETED else 512
        # the pointers past w's strides are eval's (unused here)
        wgrad_finish_kernel[(C_out, cdiv(K_total, block))](
            part_w, splits, C_out, K_total, x.shape[1], dw, *dw.stride(), w,
            *_w_strides(w), part_w, part_w, part_w, part_w, part_w, dw, dw, dw,
            KW=kW, EVAL=False, HAS_BIAS=False, BLOCK=block)
    return dw


def _conv_wgrad_partials(dy2d, x, s, kH, kW, dw=None):
    """fp32 partials (splits, C_out, kH*kW*C_in) of G = dY^T im2col(x), and their count.
    Given dw (train: dW = G) and a plan of one split, G goes straight into dw instead and
    the partials returned are None."""
    N, C_in, H, W = x.shape
    P, C_out = dy2d.shape
    K_total = kH * kW * C_in
    plan, splits = _wgrad_plan(P, C_in, C_out, K_total, x.dtype, x.device, s["H_out"],
                               s["W_out"])
    cfg = {k: v for k, v in plan.items() if k not in ("precision", "per_split", "rows")}
    if cfg["ROW_W"]:  # divisors: steps per image, then chunks per row
        steps, row_steps, w_chunks = plan["rows"]
        divisors = (*_divisor_args(row_steps), *_divisor_args(w_chunks))
    else:
        steps, row_steps, w_chunks = P, 1, 1
        divisors = (*_divisor_args(s["H_out"] * s["W_out"]), *_divisor_args(s["W_out"]))
    direct = dw is not None and splits == 1
    part = dw if direct else torch.empty((splits, C_out, K_total), device=x.device,
                                         dtype=torch.float32)
    dws = dw.stride() if direct else (0, 0, 0, 0)
    grid = (cdiv(C_out, cfg["BLOCK_M"]), cdiv(K_total, cfg["BLOCK_N"]), splits)
    conv_wgrad_kernel[grid](dy2d, x, part, P, C_in, H, W, C_out, s["H_out"], s["W_out"],
                            K_total, plan["per_split"], *divisors, steps, row_steps, w_chunks,
                            dy2d.stride(0), dy2d.stride(1),
                            *x.stride(), *s["stride"], *s["padding"], *dws, KW=kW,
                            UPCAST=INTERPRETED, DOT_PRECISION=plan["precision"], DIRECT=direct,
                            **cfg)
    return (None if direct else part), splits


def _chunks(P: int, BLOCK_P: int, device) -> tuple[int, int]:
    """(rows per chunk, chunks) for the per-channel reductions over P: two chunks per SM.
    More chunks would give the partial kernels more loads in flight, but every program of
    bn_fwd_apply_kernel and bn_bwd_apply_kernel merges all the chunks of its columns, so
    that work grows with the square of the count."""
    target = 3 if INTERPRETED else 2 * sm_count(device)
    rows = cdiv(cdiv(P, target), BLOCK_P) * BLOCK_P
    return rows, cdiv(P, rows)


def _dims(x, w, stride, padding):
    N, C_in, H, W = x.shape
    C_out, _, kH, kW = w.shape
    H_out = (H + 2 * padding[0] - kH) // stride[0] + 1
    W_out = (W + 2 * padding[1] - kW) // stride[1] + 1
    return dict(stride=tuple(stride), padding=tuple(padding), H_out=H_out, W_out=W_out)


def _k_major(w: torch.Tensor) -> torch.Tensor:
    """w with its input channels adjacent in memory: w itself when they are (channels_last
    weights, any 1x1 conv), else a (C_out, kH, kW, C_in) copy in channels_last. The training
    forward and the input gradient read a weight tile along C_in at each tap; in torch's
    default (C_out, C_in, kH, kW) layout those channels are kH*kW elements apart, one
    scattered 2-byte load each. On an H100 at the CNN's 3x3 convolutions (C_in >= 64) that
    made the forward 2.3-5.3x and the input gradient 5.6-14x slower than a K-major weight
    (reports/conv-weight-layout/: scripts/sweep_conv_fwd.py with and without
    --weight-layout contiguous; the stem's 3 channels and the 1x1s alike either way). The
    copy costs a launch and the weight's bytes (1.2 MB at 256x256x3x3 in bf16) per training
    call; a channels_last model (levels train's CNN) never pays it. The weight gradient keeps w's own layout (dW is
    allocated like w), so a parameter's .grad matches it and autograd copies nothing."""
    return w if w.stride(1) == 1 else w.contiguous(memory_format=torch.channels_last)


def _as_rows(t4: torch.Tensor) -> torch.Tensor:
    """(N, C, H, W) channels_last tensor -> its (N*H*W, C) matrix view (no copy)."""
    return t4.permute(0, 2, 3, 1).reshape(-1, t4.shape[1])


class _NoBackward:
    """Stands in for autograd's ctx when no backward will run (see launch.needs_grad)."""

    def save_for_backward(self, *tensors):
        pass


# Tiles of the per-channel reduction/elementwise kernels (16 rows in the interpreter, so
# its small tests run several steps of each chunk's loop)
_RED = dict(BLOCK_P=16 if INTERPRETED else 64, BLOCK_C=32)
_FIN_S = 2 if INTERPRETED else 64  # chunks per step of the finalize kernels (the interpreter
# runs 3 chunks: two steps, the second masked)


class _ConvBN(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, gamma, beta, running_mean, running_var, stride, padding, eps,
                momentum, training):
        s = _dims(x, w, stride, padding)
        N, C_in = x.shape[:2]
        C_out, _, kH, kW = w.shape
        P = N * s["H_out"] * s["W_out"]
        K_total = C_in * kH * kW
        dev = x.device
        f32 = dict(device=dev, dtype=torch.float32)
        out = torch.empty((N, C_out, s["H_out"], s["W_out"]), device=dev, dtype=x.dtype,
                          memory_format=torch.channels_last)
        out2d = _as_rows(out)
        # BatchNorm's gradients are made in BatchNorm's own dtype: under torch.autocast that is
        # float32 beside a 16-bit x (levels.contract.AUTOCAST), and a 16-bit dgamma would make
        # autograd cast each of them back to the parameter's dtype, two more launches and
        # allocations per call (18 a CNN step on the H100's host); the kernels accumulate in
        # float32 and store in whatever dtype their output pointers have.
        ctx.meta = (s, kH, kW, training, b is not None, P, gamma.dtype)
        if P == 0:
            # A batch of 0 images: nothing to convolve and no statistics to compute or track
            # (torch's batch_norm returns before it touches running_mean and running_var).
            ctx.save_for_backward(x, w)
            return out
        if not training and isinstance(ctx, _NoBackward) and w.stride(1) == 1:
            # Inference with a weight whose channels are already contiguous (any 1x1 conv,
            # channels_last weights): the fold's re-layout buys nothing, so BatchNorm rides
            # in the convolution's epilogue instead: one launch and no folded weight copy
            # (the host's time dominates small eval convs). A backward needs the fold's
            # scale and folded weight, and an NCHW 3x3 weight the fold's K-major re-layout
            # (its channels are 9 elements apart: scattered 2-byte loads in the main loop).
            _conv_fwd(x, w, _w_strides(w), b, out2d, s, kH, kW,
                      bn=(gamma, beta, running_mean, running_var, eps))
            return out
        if not training:
            w_f = torch.empty((C_out, kH, kW, C_in), device=dev, dtype=x.dtype)
            b_f, scale, invstd = (torch.empty((C_out,), **f32) for _ in range(3))
            fold_bn_kernel[(C_out,)](w, *_w_strides(w), b if b is not None else b_f, gamma,
                                     beta, running_mean, running_var, w_f, b_f, scale, invstd,
                                     C_in, K_total, eps, KW=kW, HAS_BIAS=b is not None,
                                     BLOCK=256 if INTERPRETED else 1024)
            wf_strides = (K_total, 1, kW * C_in, C_in)  # (o, c, i, j) of the (o, i, j, c) layout
            _conv_fwd(x, w_f, wf_strides, b_f, out2d, s, kH, kW)
            ctx.save_for_backward(x, w, w_f, b, running_mean, scale, invstd)
            return out
        # Training: conv (y, and each tile's statistics) -> the chunks' statistics ->
        # per-channel affine. y is stored in the input's dtype, as cuDNN's convolution
        # writes it for torch's BatchNorm: the statistics come from the fp32 accumulator
        # before that rounding, and y is read three times more (the apply, both backward
        # passes), so a 16-bit y halves those passes' bytes. (It was fp32 until the
        # statistics moved into the conv's epilogue: a 16-bit y would have fed them rounded
        # values.) At the CNN's gpu preset that is ~1.4 GB a step less, by count; measured on
        # an H100 with the epilogue statistics, the BatchNorm kernels went from 2.0 to 1.2 ms
        # a step (reports/conv-bn-tile-statistics/).
        y = torch.empty((P, C_out), device=dev, dtype=x.dtype)
        w_k = _k_major(w)
        t_mean, t_m2, tile_m = _conv_fwd(x, w_k, _w_strides(w_k), b, y, s, kH, kW,
                                         tile_stats=True)
        rows, chunks = _chunks(P, tile_m, dev)  # whole conv tiles per chunk
        part_mean, part_m2 = torch.empty((2, chunks, C_out), **f32).unbind(0)
        c_blocks = cdiv(C_out, _RED["BLOCK_C"])
        stats_merge_kernel[(chunks, c_blocks)](t_mean, t_m2, part_mean, part_m2, P, C_out,
                                               t_mean.shape[0], rows // tile_m, TILE_M=tile_m,
                                               BLOCK_S=_FIN_S, BLOCK_C=_RED["BLOCK_C"])
        mean, invstd = torch.empty((2, C_out), **f32).unbind(0)
        bn_fwd_apply_kernel[(chunks, c_blocks)](
            y, part_mean, part_m2, chunks, rows, P, C_out, gamma, beta, running_mean,
            running_var, mean, invstd, out2d, out2d.stride(0), out2d.stride(1), eps, momentum,
            BLOCK_S=_FIN_S, **_RED)
        ctx.save_for_backward(x, w, w_k, y, mean, invstd, gamma)  # w: dW's layout
        return out

    @staticmethod
    def backward(ctx, dout):
        s, kH, kW, training, has_bias, P, bn_dt = ctx.meta
        if P == 0:  # a batch of 0 images: every parameter's gradient is a sum over no pixel
            x, w = ctx.saved_tensors
            zeros = torch.zeros((2, w.shape[0]), device=x.device, dtype=bn_dt)
            return (torch.empty_like(x), torch.zeros_like(w),
                    torch.zeros((w.shape[0],), device=x.device, dtype=x.dtype) if has_bias else None,
                    zeros[0], zeros[1], None, None, None, None, None, None, None)
        # An explicit copy only when the incoming gradient is not channels_last already.
        dy2d = _as_rows(dout.contiguous(memory_format=torch.channels_last))
        C_out = dy2d.shape[1]
        dx = dw = db = dgamma = dbeta = None
        if not training:
            x, w, w_f, b, running_mean, scale, invstd = ctx.saved_tensors
            dev, dt = x.device, x.dtype
            sum_dy = column_sum(dy2d, out_dtype=torch.float32)
            part, splits = _conv_wgrad_partials(dy2d, x, s, kH, kW)
            dw = torch.empty_like(w)
            dgamma = torch.empty((C_out,), device=dev, dtype=bn_dt)
            dbeta = torch.empty((C_out,), device=dev, dtype=bn_dt)
            db = torch.empty((C_out,), device=dev, dtype=dt) if has_bias else None
            wgrad_finish_kernel[(C_out,)](part, splits, C_out, part.shape[2], x.shape[1],
                                          dw, *dw.stride(), w, *_w_strides(w),
                                          scale, invstd, running_mean,
                                          b if has_bias else scale, sum_dy, dgamma, dbeta,
                                          db if has_bias else dbeta,
                                          KW=kW, EVAL=True, HAS_BIAS=has_bias,
                                          BLOCK=256 if INTERPRETED else 1024)
            if ctx.needs_input_grad[0]:
                K_total = part.shape[2]
                dx = _conv_dgrad(dy2d, w_f, (K_total, 1, kW * x.shape[1], x.shape[1]), x, s,
                                 kH, kW)
            return dx, dw, db, dgamma, dbeta, None, None, None, None, None, None, None
        x, w, w_k, y, mean, invstd, gamma = ctx.saved_tensors
        dev, dt = x.device, x.dtype
        rows, chunks = _chunks(P, _RED["BLOCK_P"], dev)
        c_blocks = cdiv(C_out, _RED["BLOCK_C"])
        # sum dY and sum dY xhat per chunk, and (with a bias) sum dyc: one allocation
        part = torch.empty((2 + has_bias, chunks, C_out), device=dev, dtype=torch.float32)
        bn_bwd_partial_kernel[(chunks, c_blocks)](
            dy2d, dy2d.stride(0), dy2d.stride(1), y, mean, invstd, part, P, C_out, rows, chunks,
            **_RED)
        dgamma = torch.empty((C_out,), device=dev, dtype=bn_dt)  # two tensors: each becomes
        dbeta = torch.empty((C_out,), device=dev, dtype=bn_dt)   # a parameter's .grad
        dyc = torch.empty((P, C_out), device=dev, dtype=dt)  # gradient w.r.t. the conv output
        db_part = part[2] if has_bias else part
        bn_bwd_apply_kernel[(chunks, c_blocks)](
            dy2d, dy2d.stride(0), dy2d.stride(1), y, mean, invstd, gamma, part, chunks, dgamma,
            dbeta, dyc, db_part, P, C_out, rows, HAS_BIAS=has_bias, BLOCK_S=_FIN_S, **_RED)
        if has_bias:
            # Mathematically exactly 0 (the batch mean absorbs the bias); computed, not
            # assumed, from the fp32 dyc (bn_bwd_apply_kernel's per-chunk sums).
            # One program per 128 columns sums the chunks' partials (column_sum would take two
            # launches past 256 rows).
            db = torch.empty((C_out,), device=dev, dtype=dt)
            bm, bn = (16, 32) if INTERPRETED else (32, 128)
            column_sum_kernel[(1, cdiv(C_out, bn))](db_part, db, chunks, C_out, C_out, 1,
                                                    cdiv(chunks, bm) * bm, BLOCK_M=bm, BLOCK_N=bn)
        dw = train_wgrad(dyc, x, w, s, kH, kW)
        if ctx.needs_input_grad[0]:
            dx = _conv_dgrad(dyc, w_k, _w_strides(w_k), x, s, kH, kW)
        return dx, dw, db, dgamma, dbeta, None, None, None, None, None, None, None


def _inference(*args):
    """The forward of a call that computes no gradient (launch.forward_ahead replays it)."""
    return _ConvBN.forward(_NoBackward(), *args)


def check(x, conv_weight) -> None:
    """What only these kernels refuse (levels.triton runs it once per argument signature,
    after the contract): float64, and tensors too long for their 32-bit offsets."""
    if x.dtype == torch.float64:
        raise TypeError("conv_bn: argument 'x' must be float16, bfloat16 or float32 for the Triton "
                        "kernels; got torch.float64")
    for name, t in (("x", x), ("conv_weight", conv_weight)):
        span = sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride()))
        if span >= 2 ** 31:
            raise ValueError(f"conv_bn: argument '{name}' spans {span} elements; the Triton "
                             f"kernels use 32-bit offsets and need < 2**31")


def conv_bn(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var,
            stride, padding, eps, momentum, training):
    """Called by levels.triton.conv_bn after the shared validation and `check` (stride and
    padding as pairs).

    Layouts: x and conv_weight go to the kernels with all four strides (NCHW, channels_last
    or any view). The per-channel vectors are indexed `ptr + channel` by the kernels, so
    they are made contiguous here (C_out elements each; autograd carries the gradients of
    conv_bias, bn_weight and bn_bias back through the copies). The running statistics are
    updated in place: the kernels update contiguous copies when the caller's buffers are
    views, and the new values are then copied back through those views, so nothing but
    their own elements is ever written."""
    conv_bias = conv_bias.contiguous() if conv_bias is not None else None
    run_mean, run_var = running_mean.contiguous(), running_var.contiguous()
    args = (x, conv_weight, conv_bias, bn_weight.contiguous(), bn_bias.contiguous(), run_mean,
            run_var, tuple(stride), tuple(padding), eps, momentum, training)
    if needs_grad(*(t for t in args[:5] if t is not None)):
        out = apply_ahead(_ConvBN, *args)
    else:  # nothing to differentiate: the forward alone, without autograd's apply
        out = forward_ahead(_inference, *args)
    if training:
        for buffer, updated in ((running_mean, run_mean), (running_var, run_var)):
            if updated is not buffer:  # .contiguous() made a copy: write it back through the view
                buffer.copy_(updated)
    return out
