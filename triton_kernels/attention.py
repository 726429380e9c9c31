"""Flash attention in Triton (FlashAttention-2 style), forward and backward.

What it adds over Levels 1-3: the (N x N) score matrix never exists. One program owns a
block of BLOCK_M queries, streams K and V through on-chip memory BLOCK_N keys at a time
and keeps a running softmax (the row maximum m, the row sum l and the unnormalized
output acc, all in fp32). Each K/V element is read once per query block instead of the
scores being written and read back: memory traffic drops from O(N^2) to O(N^2 D / BLOCK_M)
and the arithmetic runs on the tensor cores back to back.

    forward   (one program per query block and (batch, head)):
        for each key block j:   s = q k_j^T * scale * log2(e)      exp2 is the native op;
                                m' = max(m, rowmax s)               log2(e) is folded into
                                p = exp2(s - m'), a = exp2(m - m')  the scale once
                                l = a l + rowsum p ; acc = a acc + p v_j
        out = acc / l (one division per row, outside the loop); store lse = m + log2 l
    backward  (FlashAttention-2: recompute p from the stored lse instead of storing it):
        preprocess: delta_i = sum_d dO_id O_id                (the softmax Jacobian term)
        dK/dV kernel: one program per key block, loop over query blocks
                      dV += p^T dO ; dS = p (dO V^T - delta) ; dK += dS^T Q
        dQ kernel:    one program per query block, loop over key blocks: dQ += dS K

Causal masking costs nothing where it is not needed: key blocks entirely above the
diagonal are never visited, blocks entirely below it run without a mask, and only the
blocks that straddle the diagonal (or the ragged end of the sequence) pay for `tl.where`.

Measured on an H100 (reports/h100-triton-attention-lstm.json), bf16 B=4 H=16 N=4096 D=128:
forward 495 / 434 TFLOP/s (full / causal), 1.42x SDPA's FLASH backend, 0.79x / 0.80x its
cuDNN backend; backward 374 / 354 TFLOP/s, 1.28x / 1.41x SDPA FLASH backward.

What it costs: a kernel per pass, a backward that recomputes the scores (2.5x the forward
FLOPs instead of 2x), and block sizes that must be tuned per GPU and per head dimension.

Grown to what SDPA takes, each a constexpr switch (off in the common case, whose kernels are
unchanged) or a value read once per program, never a test in the inner loop it does not need:
  * grouped-query / multi-query attention: query head h reads K/V head h // GROUP through
    the pointer arithmetic (no repeat_interleave copy of K and V). dK/dV: one program per key
    block of a K/V head loops over the GROUP query heads that read it, in order, into the same
    accumulators: no atomics, the same bits every run. Its cost: the dK/dV grid has GROUP
    times fewer programs, each GROUP times longer (a small grid for MQA at small B).
  * head sizes up to 256 (PAD_D): the tile spans HEAD_DIM, the next power of two; loads of
    the padded columns are masked to 0 (they add nothing to q.k) and stores skip them. Its
    cost: the padded lanes' arithmetic (D = 80 computes 128 wide) and a column mask on every
    load. D = 256 takes smaller blocks (TUNED's d256 entries) so that the tiles fit.
  * causal with Nq != Nk (BOTTOM_RIGHT) and per-batch key lengths (HAS_LENS): a program reads
    its element's key count n_end and the diagonal's shift once (`_keys`); the loops' bounds
    come from them, so key blocks past n_end or above the diagonal are never loaded. A query
    that sees no key outputs 0 with lse = +inf, which makes every P the backward recomputes
    for it exactly 0, masked or not.
  * empty inputs: the launchers return before any launch (a grid of 0 programs is an error).
  * rotary embeddings fused in (ROPE, INTERLEAVED; attention's rope=): a rotation turns each
    row by its own position's angles, needing only that row and two rows of the tables, so
    it happens on the tile between the load and the dot. The forward turns its q tile once
    (query i at position i + rope_off) and each k tile as it streams in (key j at j); the
    backward's two kernels turn them again as they reload them, accumulate dq and dk for the
    turned tiles, and turn those back by -angle (rope's backward) before the store
    (`_rope_load`, `_rope_store`). Rotated q and k never exist in memory: no extra pass, no
    extra bytes of activations saved for the backward. Its cost: the tables' rows with every
    tile (from L2: they are small), four multiply-adds per pair on the CUDA cores beside the
    tensor cores, and the register shuffles that put each pair's two features side by side
    (one layout for both pair conventions, the same for q and k: a dot product does not see
    the order of its terms). Half-split pairs are two contiguous half-row loads; interleaved
    pairs one row load, split in registers: no stride-2 gathers. Measured on the H100
    (reports/h100-attention-rope-level4.json, B4 H32 N2048 D128 causal bf16): fused 0.70x the
    speed of attention alone, slower than turning q and k in a pass of their own (0.80x):
    the per-tile turning of K, once per query block, costs more than the pass it saves.
  * short keys (`_attn_bwd_short`): where all N_K <= SHORT_KEYS keys of a head fit one block,
    the backward is one launch instead of three (below, before the launch configuration).
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from .launch import apply_ahead, cdiv, fast_launch, forward_ahead, needs_grad, next_power_of_2

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"
LOG2E = 1.4426950408889634


def uses_tf32(device: torch.device, dtype: torch.dtype) -> bool:
    """fp32 dots run in TF32 only where the user asked for it, the same switch as torch's."""
    return (device.type == "cuda" and dtype == torch.float32
            and bool(torch.backends.cuda.matmul.allow_tf32))


# ---------------------------------------------------------------------------------------
# Masks: what each load and score needs, decided at compile time
# ---------------------------------------------------------------------------------------
# The common case (every key valid, D a power of two, H_kv == H, causal on the main
# diagonal) compiles with none of the masks below: each is a constexpr branch, so a kernel
# pays only for the feature its call uses.
#   ROWS      the ragged end of the sequence (or of a batch element's kv_lens)
#   PAD_D     a head size that is no power of two: the register tile spans HEAD_DIM, the
#             next power of two, and the columns D..HEAD_DIM are loaded as 0 and never
#             stored (0 adds nothing to q.k, and the padded output columns are dropped)

@triton.jit
def _load(ptrs, rows_ok, cols_ok, ROWS: tl.constexpr, PAD_D: tl.constexpr):
    """ptrs, zero where a masked row or a padded column is (never read there)."""
    if ROWS:
        if PAD_D:
            x = tl.load(ptrs, mask=rows_ok & cols_ok, other=0.0)
        else:
            x = tl.load(ptrs, mask=rows_ok, other=0.0)
    else:
        if PAD_D:
            x = tl.load(ptrs, mask=cols_ok, other=0.0)
        else:
            x = tl.load(ptrs)
    return x


@triton.jit
def _store(ptrs, x, rows_ok, cols_ok, PAD_D: tl.constexpr):
    """x at ptrs, only inside the view: valid rows, and the D real columns."""
    if PAD_D:
        tl.store(ptrs, x, mask=rows_ok & cols_ok)
    else:
        tl.store(ptrs, x, mask=rows_ok)


@triton.jit
def _keys(KV_LENS, stride_lens, b, N_Q, N_K, HAS_LENS: tl.constexpr, BOTTOM_RIGHT: tl.constexpr):
    """(n_end, shift) of batch element b: its keys are [0, n_end) (kv_lens[b] clipped to
    [0, N_K], else N_K), and query i sees key j <= i + shift when causal: shift = 0 for the
    top-left diagonal, n_end - N_Q for the bottom-right one."""
    if HAS_LENS:
        n_end = tl.minimum(tl.maximum(tl.load(KV_LENS + b * stride_lens).to(tl.int32), 0), N_K)
    else:
        n_end = N_K
    if BOTTOM_RIGHT:
        shift = n_end - N_Q
    else:
        shift = 0
    return n_end, shift


# ---------------------------------------------------------------------------------------
# Rotary embeddings at load (ROPE): q and k are turned as they arrive, never stored turned
# ---------------------------------------------------------------------------------------
# A rotation turns each row by its own position's angles: it needs nothing but the row and
# two table rows, so it can happen on the tile, in registers, between the load and the dot.
# The rotated tile comes out with each pair's two features side by side ((y1_0, y2_0,
# y1_1, y2_1, ...)) whatever the input layout: q and k are permuted alike, and a dot product
# does not see the order of its terms. The backward's dq and dk accumulate in that order;
# `_rope_store` turns them back by -angle (rope's backward: the inverse of a rotation is its
# transpose) and writes them in the input's layout.

@triton.jit
def _angles(COS, SIN, stride_cp, stride_ci, stride_sp, stride_si, pos, pos_ok, D,
            HALF: tl.constexpr, ROWS: tl.constexpr, PAD_D: tl.constexpr):
    """cos and sin of the positions `pos`, two (len(pos), HALF) fp32 tiles (0 where masked),
    read through the tables' strides (a slice of a longer table is the common case)."""
    offs_i = tl.arange(0, HALF)
    i_ok = (offs_i < D // 2)[None, :]
    c = _load(COS + pos[:, None] * stride_cp + offs_i[None, :] * stride_ci, pos_ok[:, None], i_ok,
              ROWS, PAD_D)
    s = _load(SIN + pos[:, None] * stride_sp + offs_i[None, :] * stride_si, pos_ok[:, None], i_ok,
              ROWS, PAD_D)
    return c.to(tl.float32), s.to(tl.float32)


@triton.jit
def _rope_load(base, stride_row, rows, rows_ok, COS, SIN, stride_cp, stride_ci, stride_sp,
               stride_si, pos, D, BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr,
               PAD_D: tl.constexpr, INTERLEAVED: tl.constexpr):
    """Rows `rows` of x (unit stride along D), turned by the angles of positions `pos`: a
    (BLOCK, HEAD_DIM) fp32 tile, pairs side by side. Interleaved pairs (2i, 2i + 1) are one
    contiguous load split in registers; half-split pairs (i, i + D/2) two contiguous loads
    of half a row each (no stride-2 gathers either way)."""
    HALF: tl.constexpr = HEAD_DIM // 2
    if INTERLEAVED:
        offs_d = tl.arange(0, HEAD_DIM)
        x = _load(base + rows[:, None] * stride_row + offs_d[None, :], rows_ok[:, None],
                  (offs_d < D)[None, :], ROWS, PAD_D)
        x1, x2 = tl.split(tl.reshape(x, [BLOCK, HALF, 2]))
    else:
        offs_i = tl.arange(0, HALF)
        i_ok = (offs_i < D // 2)[None, :]
        ptrs = base + rows[:, None] * stride_row + offs_i[None, :]
        x1 = _load(ptrs, rows_ok[:, None], i_ok, ROWS, PAD_D)
        if PAD_D:
            x2 = _load(ptrs + D // 2, rows_ok[:, None], i_ok, ROWS, PAD_D)
        else:  # the second half HALF elements on: a constant, so the loads stay wide
            x2 = _load(ptrs + HALF, rows_ok[:, None], i_ok, ROWS, PAD_D)
    c, s = _angles(COS, SIN, stride_cp, stride_ci, stride_sp, stride_si, pos, rows_ok, D, HALF,
                   ROWS, PAD_D)
    x1, x2 = x1.to(tl.float32), x2.to(tl.float32)
    return tl.reshape(tl.join(x1 * c - x2 * s, x2 * c + x1 * s), [BLOCK, HEAD_DIM])


@triton.jit
def _rope_store(base, stride_row, rows, rows_ok, g, COS, SIN, stride_cp, stride_ci, stride_sp,
                stride_si, pos, D, BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr,
                PAD_D: tl.constexpr, INTERLEAVED: tl.constexpr):
    """g, the gradient of `_rope_load`'s rotated tile (pairs side by side, fp32), turned back
    by -angle and stored at rows `rows` of x's layout: the gradient of x itself."""
    HALF: tl.constexpr = HEAD_DIM // 2
    g1, g2 = tl.split(tl.reshape(g, [BLOCK, HALF, 2]))
    c, s = _angles(COS, SIN, stride_cp, stride_ci, stride_sp, stride_si, pos, rows_ok, D, HALF,
                   True, PAD_D)
    d1 = (g1 * c + g2 * s).to(base.dtype.element_ty)
    d2 = (g2 * c - g1 * s).to(base.dtype.element_ty)
    if INTERLEAVED:
        offs_d = tl.arange(0, HEAD_DIM)
        _store(base + rows[:, None] * stride_row + offs_d[None, :],
               tl.reshape(tl.join(d1, d2), [BLOCK, HEAD_DIM]), rows_ok[:, None],
               (offs_d < D)[None, :], PAD_D)
    else:
        offs_i = tl.arange(0, HALF)
        i_ok = (offs_i < D // 2)[None, :]
        ptrs = base + rows[:, None] * stride_row + offs_i[None, :]
        _store(ptrs, d1, rows_ok[:, None], i_ok, PAD_D)
        if PAD_D:
            _store(ptrs + D // 2, d2, rows_ok[:, None], i_ok, PAD_D)
        else:
            _store(ptrs + HALF, d2, rows_ok[:, None], i_ok, PAD_D)


@triton.jit
def _q_tile(Q, q_off, stride_qm, offs_m, row_ok, offs_d, d_ok, COS, SIN, stride_cp, stride_ci,
            stride_sp, stride_si, rope_off, D, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr,
            PAD_D: tl.constexpr, UPCAST: tl.constexpr, ROPE: tl.constexpr,
            INTERLEAVED: tl.constexpr):
    """A program's query block (rows offs_m of the slice at Q + q_off); with ROPE, query i
    turned by position i + rope_off's angles, once per program, rounded to q's dtype as
    rope rounds its output."""
    if ROPE:
        q = _rope_load(Q + q_off, stride_qm, offs_m, row_ok, COS, SIN, stride_cp, stride_ci,
                       stride_sp, stride_si, offs_m + rope_off, D, BLOCK_M, HEAD_DIM, True, PAD_D,
                       INTERLEAVED)
        if not UPCAST:
            q = q.to(Q.dtype.element_ty)
    else:
        q = _load(Q + q_off + offs_m[:, None] * stride_qm + offs_d[None, :], row_ok[:, None],
                  d_ok[None, :], True, PAD_D)
    return q


# ---------------------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------------------

@triton.jit
def _query_block(CAUSAL: tl.constexpr):
    """Causal: the last query blocks see the most keys, so they are started first; the
    cheap ones fill the tail of the grid instead of leaving SMs idle at the end."""
    if CAUSAL:
        return tl.num_programs(0) - 1 - tl.program_id(0)
    return tl.program_id(0)


@triton.jit
def _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, offs_m, offs_d,
                    lo, hi, n_end, shift, D, qk_scale,
                    COS, SIN, stride_cp, stride_ci, stride_sp, stride_si,
                    BLOCK_N: tl.constexpr, CAUSAL_MASK: tl.constexpr, EDGE_MASK: tl.constexpr,
                    PAD_D: tl.constexpr, MAY_BE_EMPTY: tl.constexpr,
                    UPCAST: tl.constexpr, PRECISION: tl.constexpr,
                    HEAD_DIM: tl.constexpr, ROPE: tl.constexpr, INTERLEAVED: tl.constexpr):
    """Stream key blocks [lo, hi) through the running softmax of one query block."""
    offs_n0 = tl.arange(0, BLOCK_N)
    d_ok = offs_d < D
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        if ROPE:  # key j turned by position j's angles, in registers (v is never turned)
            v_ptrs = v_base + offs_n[:, None] * stride_vn + offs_d[None, :]
            kT = tl.trans(_rope_load(k_base, stride_kn, offs_n, offs_n < n_end, COS, SIN,
                                     stride_cp, stride_ci, stride_sp, stride_si, offs_n, D,
                                     BLOCK_N, HEAD_DIM, EDGE_MASK, PAD_D, INTERLEAVED))
            if not UPCAST:
                kT = kT.to(k_base.dtype.element_ty)  # rounded as rope rounds its output
        else:
            # K is loaded as (D, BLOCK_N) so that q @ kT needs no transpose in registers.
            kT_ptrs = k_base + offs_n[None, :] * stride_kn + offs_d[:, None]
            v_ptrs = v_base + offs_n[:, None] * stride_vn + offs_d[None, :]
            kT = _load(kT_ptrs, offs_n[None, :] < n_end, d_ok[:, None], EDGE_MASK, PAD_D)
        v = _load(v_ptrs, offs_n[:, None] < n_end, d_ok[None, :], EDGE_MASK, PAD_D)
        if UPCAST:  # the interpreter's 16-bit arithmetic is wrong: compute in fp32 there
            kT = kT.to(tl.float32)
            v = v.to(tl.float32)
        ### BEGIN SOLUTION
        s = tl.dot(q, kT, input_precision=PRECISION) * qk_scale  # log2 units
        if CAUSAL_MASK:
            s = tl.where(offs_m[:, None] + shift >= offs_n[None, :], s, float("-inf"))
        if EDGE_MASK:
            s = tl.where(offs_n[None, :] < n_end, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        if MAY_BE_EMPTY:
            # a row that has seen no key yet keeps m = -inf: subtract 0 instead, so that
            # -inf - (-inf) makes no NaN (its p are 0 either way)
            m_new = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
        ### END SOLUTION
    return acc, l_i, m_i


@triton.jit
def _visible_keys(start_m, n_end, shift, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """For a causal query block [start_m, start_m + BLOCK_M): the keys every row of it sees,
    [0, full) with full a multiple of BLOCK_N (no mask needed there), and the end of the
    keys its last row sees, hi (the blocks of [full, hi) straddle the diagonal)."""
    full = tl.minimum(tl.maximum(start_m + shift + 1, 0), n_end)
    full = (full // BLOCK_N) * BLOCK_N
    hi = tl.maximum(tl.minimum(start_m + BLOCK_M + shift, n_end), full)
    return full, hi


@fast_launch
@triton.jit
def _attn_fwd(Q, K, V, O, LSE, KV_LENS,
              stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
              stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om,
              H, GROUP, N_Q, N_K, D, stride_lens, qk_scale,
              COS, SIN,  # rope's tables (P, D/2), when ROPE; else any pointer, never read
              stride_cp, stride_ci, stride_sp, stride_si,  # their strides (position, pair)
              rope_off,  # the position of query 0 (keys start at 0)
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              CAUSAL: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
              SAVE_LSE: tl.constexpr,  # False under no_grad: no backward will read it
              PAD_D: tl.constexpr = False, HAS_LENS: tl.constexpr = False,
              BOTTOM_RIGHT: tl.constexpr = False, ROPE: tl.constexpr = False,
              INTERLEAVED: tl.constexpr = False):
    # Float arguments become fp32 here: a plain launch types a Python float as fp32, but
    # Inductor, compiling a model around this kernel, passes it as fp64, which would make
    # the running accumulator fp64 inside the loop (a compile error) and the math slow.
    qk_scale = tl.cast(qk_scale, tl.float32)
    start_m = _query_block(CAUSAL) * BLOCK_M
    bh = tl.program_id(1)
    # 64-bit batch/head offsets (b * stride_qb passes 2**31 for tensors of > 2**31
    # elements); offsets inside one (b, h) slice stay 32-bit, guarded by the launcher.
    # Grouped-query attention: query head h reads K/V head h // GROUP (no copy of K, V).
    b, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
    hk = h // GROUP
    n_end, shift = _keys(KV_LENS, stride_lens, b, N_Q, N_K, HAS_LENS, BOTTOM_RIGHT)
    # Some rows may see no key at all (a length of 0, or a bottom-right diagonal below them)
    MAY_BE_EMPTY: tl.constexpr = HAS_LENS or BOTTOM_RIGHT
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < N_Q
    d_ok = offs_d < D
    q = _q_tile(Q, b * stride_qb + h * stride_qh, stride_qm, offs_m, row_ok, offs_d, d_ok, COS, SIN,
                stride_cp, stride_ci, stride_sp, stride_si, rope_off, D, BLOCK_M, HEAD_DIM, PAD_D,
                UPCAST, ROPE, INTERLEAVED)
    if UPCAST:
        q = q.to(tl.float32)
    k_base = K + b * stride_kb + hk * stride_kh
    v_base = V + b * stride_vb + hk * stride_vh

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    if CAUSAL:
        # Stage 1: key blocks every row of the block sees, no mask at all.
        full, hi = _visible_keys(start_m, n_end, shift, BLOCK_M, BLOCK_N)
        acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn,
                                        offs_m, offs_d, 0, full, n_end, shift, D, qk_scale,
                                        COS, SIN, stride_cp, stride_ci, stride_sp, stride_si,
                                        BLOCK_N, False, False, PAD_D, MAY_BE_EMPTY, UPCAST,
                                        PRECISION, HEAD_DIM, ROPE, INTERLEAVED)
        # Stage 2: the blocks that straddle the diagonal; those above it are skipped.
        acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn,
                                        offs_m, offs_d, full, hi, n_end, shift, D, qk_scale,
                                        COS, SIN, stride_cp, stride_ci, stride_sp, stride_si,
                                        BLOCK_N, True, True, PAD_D, MAY_BE_EMPTY, UPCAST,
                                        PRECISION, HEAD_DIM, ROPE, INTERLEAVED)
    else:
        full = (n_end // BLOCK_N) * BLOCK_N
        acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn,
                                        offs_m, offs_d, 0, full, n_end, shift, D, qk_scale,
                                        COS, SIN, stride_cp, stride_ci, stride_sp, stride_si,
                                        BLOCK_N, False, False, PAD_D, MAY_BE_EMPTY, UPCAST,
                                        PRECISION, HEAD_DIM, ROPE, INTERLEAVED)
        acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn,
                                        offs_m, offs_d, full, n_end, n_end, shift, D, qk_scale,
                                        COS, SIN, stride_cp, stride_ci, stride_sp, stride_si,
                                        BLOCK_N, False, True, PAD_D, MAY_BE_EMPTY, UPCAST,
                                        PRECISION, HEAD_DIM, ROPE, INTERLEAVED)
    if MAY_BE_EMPTY:
        # A row that saw no key outputs 0 (as SDPA); its lse is +inf, so that the backward's
        # P = 2^(s - lse) is 0 for it wherever it is recomputed, mask or not.
        seen = l_i > 0
        out = acc / tl.where(seen, l_i, 1.0)[:, None]
        lse = tl.where(seen, m_i + tl.math.log2(tl.where(seen, l_i, 1.0)), float("inf"))
    else:
        # Every row saw at least one key (key 0 is visible to every query), so l_i > 0.
        out = acc / l_i[:, None]
        lse = m_i + tl.math.log2(l_i)
    if SAVE_LSE:
        tl.store(LSE + bh.to(tl.int64) * N_Q + offs_m, lse, mask=row_ok)
    _store(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :],
           out.to(O.dtype.element_ty), row_ok[:, None], d_ok[None, :], PAD_D)


# ---------------------------------------------------------------------------------------
# Backward
# ---------------------------------------------------------------------------------------

@fast_launch
@triton.jit
def _attn_bwd_preprocess(O, DO, DELTA, stride_ob, stride_oh, stride_om,
                         stride_db, stride_dh, stride_dm, H, N_Q, D,
                         HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, PAD_D: tl.constexpr = False):
    bh = tl.program_id(1)
    # 64-bit batch/head offsets (b * stride_qb passes 2**31 for tensors of > 2**31
    # elements); offsets inside one (b, h) slice stay 32-bit, guarded by the launcher.
    b, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    ok = (offs_m < N_Q)[:, None]
    d_ok = (offs_d < D)[None, :]
    o = _load(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :],
              ok, d_ok, True, PAD_D).to(tl.float32)
    do = _load(DO + b * stride_db + h * stride_dh + offs_m[:, None] * stride_dm + offs_d[None, :],
               ok, d_ok, True, PAD_D).to(tl.float32)
    tl.store(DELTA + bh.to(tl.int64) * N_Q + offs_m, tl.sum(o * do, 1), mask=offs_m < N_Q)


@triton.jit
def _attn_bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_dom,
                         offs_n, offs_d, lo, hi, N_Q, n_end, shift, D, qk_scale,
                         COS, SIN, stride_cp, stride_ci, stride_sp, stride_si, rope_off,
                         BLOCK_M: tl.constexpr, CAUSAL_MASK: tl.constexpr, EDGE_MASK: tl.constexpr,
                         PAD_D: tl.constexpr, HAS_LENS: tl.constexpr,
                         UPCAST: tl.constexpr, PRECISION: tl.constexpr,
                         HEAD_DIM: tl.constexpr, ROPE: tl.constexpr, INTERLEAVED: tl.constexpr):
    """Accumulate the contribution of query blocks [lo, hi) to one key block's dK, dV.

    Works in the transposed frame (keys along rows) so that p^T and dS^T come out of the
    dots directly and nothing is transposed in registers."""
    offs_m0 = tl.arange(0, BLOCK_M)
    d_ok = offs_d < D
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + offs_m0
        if ROPE:
            do_ptrs = do_base + offs_m[:, None] * stride_dom + offs_d[None, :]
            row_ok = offs_m < N_Q
            qT = tl.trans(_rope_load(q_base, stride_qm, offs_m, row_ok, COS, SIN, stride_cp,
                                     stride_ci, stride_sp, stride_si, offs_m + rope_off, D,
                                     BLOCK_M, HEAD_DIM, EDGE_MASK, PAD_D, INTERLEAVED))
            if not UPCAST:
                qT = qT.to(q_base.dtype.element_ty)
        else:
            qT_ptrs = q_base + offs_m[None, :] * stride_qm + offs_d[:, None]
            do_ptrs = do_base + offs_m[:, None] * stride_dom + offs_d[None, :]
            row_ok = offs_m < N_Q
            qT = _load(qT_ptrs, row_ok[None, :], d_ok[:, None], EDGE_MASK, PAD_D)
        do = _load(do_ptrs, row_ok[:, None], d_ok[None, :], EDGE_MASK, PAD_D)
        if EDGE_MASK:
            lse = tl.load(lse_base + offs_m, mask=row_ok, other=0.0)
            delta = tl.load(delta_base + offs_m, mask=row_ok, other=0.0)
        else:
            lse = tl.load(lse_base + offs_m)
            delta = tl.load(delta_base + offs_m)
        if UPCAST:
            qT = qT.to(tl.float32)
            do = do.to(tl.float32)
        ### BEGIN SOLUTION
        sT = tl.dot(k, qT, input_precision=PRECISION) * qk_scale  # (BLOCK_N, BLOCK_M)
        pT = tl.math.exp2(sT - lse[None, :])
        if CAUSAL_MASK:
            pT = tl.where(offs_m[None, :] + shift >= offs_n[:, None], pT, 0.0)
        if EDGE_MASK:
            pT = tl.where(offs_m[None, :] < N_Q, pT, 0.0)
        if HAS_LENS:  # keys past this element's length: no gradient
            pT = tl.where(offs_n[:, None] < n_end, pT, 0.0)
        dv += tl.dot(pT.to(do.dtype), do, input_precision=PRECISION)
        dpT = tl.dot(v, tl.trans(do), input_precision=PRECISION)
        dsT = pT * (dpT - delta[None, :])
        dk += tl.dot(dsT.to(qT.dtype), tl.trans(qT), input_precision=PRECISION)
        ### END SOLUTION
    return dk, dv


@triton.jit
def _kv_block(K, V, b, hk, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
              offs_n, offs_d, N_K, D, COS, SIN, stride_cp, stride_ci, stride_sp, stride_si,
              BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, PAD_D: tl.constexpr,
              UPCAST: tl.constexpr, ROPE: tl.constexpr, INTERLEAVED: tl.constexpr):
    """The key block a backward program keeps on chip, keys offs_n of K/V head hk of batch
    element b: (k, v), k turned by its positions' angles when ROPE (once, rounded as rope
    rounds), both fp32 in the interpreter."""
    key_ok = offs_n < N_K
    d_ok = offs_d < D
    if ROPE:
        k = _rope_load(K + b * stride_kb + hk * stride_kh, stride_kn, offs_n, key_ok, COS, SIN,
                       stride_cp, stride_ci, stride_sp, stride_si, offs_n, D, BLOCK_N, HEAD_DIM,
                       True, PAD_D, INTERLEAVED)
        if not UPCAST:
            k = k.to(K.dtype.element_ty)
    else:
        k = _load(K + b * stride_kb + hk * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :],
                  key_ok[:, None], d_ok[None, :], True, PAD_D)
    v = _load(V + b * stride_vb + hk * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :],
              key_ok[:, None], d_ok[None, :], True, PAD_D)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    return k, v


@fast_launch
@triton.jit
def _attn_bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV, KV_LENS,
                   stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
                   stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_dom,
                   stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                   H_KV, GROUP, N_Q, N_K, D, stride_lens, qk_scale, sm_scale,
                   COS, SIN, stride_cp, stride_ci, stride_sp, stride_si, rope_off,  # as _attn_fwd
                   HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   CAUSAL: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
                   PAD_D: tl.constexpr = False, HAS_LENS: tl.constexpr = False,
                   BOTTOM_RIGHT: tl.constexpr = False, ROPE: tl.constexpr = False,
                   INTERLEAVED: tl.constexpr = False):
    qk_scale, sm_scale = tl.cast(qk_scale, tl.float32), tl.cast(sm_scale, tl.float32)  # see _attn_fwd
    start_n = tl.program_id(0) * BLOCK_N
    bhk = tl.program_id(1)  # one program per key block of one (batch, K/V head)
    # 64-bit batch/head offsets (b * stride_qb passes 2**31 for tensors of > 2**31
    # elements); offsets inside one (b, h) slice stay 32-bit, guarded by the launcher.
    b, hk = (bhk // H_KV).to(tl.int64), (bhk % H_KV).to(tl.int64)
    n_end, shift = _keys(KV_LENS, stride_lens, b, N_Q, N_K, HAS_LENS, BOTTOM_RIGHT)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    col_ok = (offs_n < N_K)[:, None]
    d_ok = (offs_d < D)[None, :]
    # this block's keys turned once (ROPE); the streamed query blocks turn in the loop
    k, v = _kv_block(K, V, b, hk, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
                     offs_n, offs_d, N_K, D, COS, SIN, stride_cp, stride_ci, stride_sp, stride_si,
                     BLOCK_N, HEAD_DIM, PAD_D, UPCAST, ROPE, INTERLEAVED)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    # The queries this key block gets gradients from. Causal: queries before lo never see
    # it; [lo, diag_end) straddle the diagonal (masked); the rest see all of it.
    # Every bound is a multiple of BLOCK_M, so that the three loops below never visit a
    # query twice.
    if CAUSAL:
        lo = (tl.minimum(tl.maximum(start_n - shift, 0), N_Q) // BLOCK_M) * BLOCK_M
        diag_end = lo + tl.cdiv(tl.maximum(start_n + BLOCK_N - shift - lo, 0), BLOCK_M) * BLOCK_M
        diag_end = tl.minimum(diag_end, tl.cdiv(N_Q, BLOCK_M) * BLOCK_M)
    else:
        lo = 0
        diag_end = 0
    full = tl.maximum((N_Q // BLOCK_M) * BLOCK_M, diag_end)
    groups = GROUP
    if HAS_LENS:
        groups = tl.where(start_n < n_end, GROUP, 0)  # keys past the length: dK = dV = 0
    # Grouped-query attention: the GROUP query heads that read this K/V head all add to its
    # dK and dV. The loop over them is inside this one program, in a fixed order: no
    # atomics, the same bits on every run.
    for g in range(0, groups):
        h = hk * GROUP + g
        bh = b * (H_KV * GROUP) + h
        q_base = Q + b * stride_qb + h * stride_qh
        do_base = DO + b * stride_dob + h * stride_doh
        lse_base = LSE + bh * N_Q
        delta_base = DELTA + bh * N_Q
        if CAUSAL:
            dk, dv = _attn_bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, lse_base, delta_base,
                                          stride_qm, stride_dom, offs_n, offs_d, lo, diag_end,
                                          N_Q, n_end, shift, D, qk_scale, COS, SIN, stride_cp,
                                          stride_ci, stride_sp, stride_si, rope_off, BLOCK_M,
                                          True, True, PAD_D, HAS_LENS, UPCAST, PRECISION,
                                          HEAD_DIM, ROPE, INTERLEAVED)
        dk, dv = _attn_bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, lse_base, delta_base,
                                      stride_qm, stride_dom, offs_n, offs_d, diag_end, full,
                                      N_Q, n_end, shift, D, qk_scale, COS, SIN, stride_cp,
                                      stride_ci, stride_sp, stride_si, rope_off, BLOCK_M, False,
                                      False, PAD_D, HAS_LENS, UPCAST, PRECISION, HEAD_DIM, ROPE,
                                      INTERLEAVED)
        dk, dv = _attn_bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, lse_base, delta_base,
                                      stride_qm, stride_dom, offs_n, offs_d, full, N_Q,
                                      N_Q, n_end, shift, D, qk_scale, COS, SIN, stride_cp,
                                      stride_ci, stride_sp, stride_si, rope_off, BLOCK_M, False,
                                      True, PAD_D, HAS_LENS, UPCAST, PRECISION, HEAD_DIM, ROPE,
                                      INTERLEAVED)
    # dS was taken with respect to the scaled scores; the chain rule brings back `scale`.
    dk = dk * sm_scale
    if ROPE:  # dk of the turned keys, turned back: the gradient of k
        _rope_store(DK + b * stride_dkb + hk * stride_dkh, stride_dkn, offs_n, offs_n < N_K, dk,
                    COS, SIN, stride_cp, stride_ci, stride_sp, stride_si, offs_n, D, BLOCK_N,
                    HEAD_DIM, PAD_D, INTERLEAVED)
    else:
        _store(DK + b * stride_dkb + hk * stride_dkh + offs_n[:, None] * stride_dkn + offs_d[None, :],
               dk.to(DK.dtype.element_ty), col_ok, d_ok, PAD_D)
    _store(DV + b * stride_dvb + hk * stride_dvh + offs_n[:, None] * stride_dvn + offs_d[None, :],
           dv.to(DV.dtype.element_ty), col_ok, d_ok, PAD_D)


@triton.jit
def _attn_bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn, offs_m, offs_d,
                       lo, hi, n_end, shift, D, qk_scale,
                       COS, SIN, stride_cp, stride_ci, stride_sp, stride_si,
                       BLOCK_N: tl.constexpr, CAUSAL_MASK: tl.constexpr, EDGE_MASK: tl.constexpr,
                       PAD_D: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
                       HEAD_DIM: tl.constexpr, ROPE: tl.constexpr, INTERLEAVED: tl.constexpr):
    offs_n0 = tl.arange(0, BLOCK_N)
    d_ok = offs_d < D
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        if ROPE:
            vT_ptrs = v_base + offs_n[None, :] * stride_vn + offs_d[:, None]
            kT = tl.trans(_rope_load(k_base, stride_kn, offs_n, offs_n < n_end, COS, SIN,
                                     stride_cp, stride_ci, stride_sp, stride_si, offs_n, D,
                                     BLOCK_N, HEAD_DIM, EDGE_MASK, PAD_D, INTERLEAVED))
            if not UPCAST:
                kT = kT.to(k_base.dtype.element_ty)
        else:
            kT_ptrs = k_base + offs_n[None, :] * stride_kn + offs_d[:, None]
            vT_ptrs = v_base + offs_n[None, :] * stride_vn + offs_d[:, None]
            kT = _load(kT_ptrs, offs_n[None, :] < n_end, d_ok[:, None], EDGE_MASK, PAD_D)
        vT = _load(vT_ptrs, offs_n[None, :] < n_end, d_ok[:, None], EDGE_MASK, PAD_D)
        if UPCAST:
            kT = kT.to(tl.float32)
            vT = vT.to(tl.float32)
        ### BEGIN SOLUTION
        s = tl.dot(q, kT, input_precision=PRECISION) * qk_scale
        p = tl.math.exp2(s - lse[:, None])
        if CAUSAL_MASK:
            p = tl.where(offs_m[:, None] + shift >= offs_n[None, :], p, 0.0)
        if EDGE_MASK:
            p = tl.where(offs_n[None, :] < n_end, p, 0.0)
        dp = tl.dot(do, vT, input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(kT.dtype), tl.trans(kT), input_precision=PRECISION)
        ### END SOLUTION
    return dq


@fast_launch
@triton.jit
def _attn_bwd_dq(Q, K, V, DO, LSE, DELTA, DQ, KV_LENS,
                 stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
                 stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_dom,
                 stride_dqb, stride_dqh, stride_dqm,
                 H, GROUP, N_Q, N_K, D, stride_lens, qk_scale, sm_scale,
                 COS, SIN, stride_cp, stride_ci, stride_sp, stride_si, rope_off,  # as _attn_fwd
                 HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 CAUSAL: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
                 PAD_D: tl.constexpr = False, HAS_LENS: tl.constexpr = False,
                 BOTTOM_RIGHT: tl.constexpr = False, ROPE: tl.constexpr = False,
                 INTERLEAVED: tl.constexpr = False):
    qk_scale, sm_scale = tl.cast(qk_scale, tl.float32), tl.cast(sm_scale, tl.float32)  # see _attn_fwd
    start_m = _query_block(CAUSAL) * BLOCK_M
    bh = tl.program_id(1)
    # 64-bit batch/head offsets (b * stride_qb passes 2**31 for tensors of > 2**31
    # elements); offsets inside one (b, h) slice stay 32-bit, guarded by the launcher.
    b, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
    hk = h // GROUP
    n_end, shift = _keys(KV_LENS, stride_lens, b, N_Q, N_K, HAS_LENS, BOTTOM_RIGHT)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < N_Q
    d_ok = offs_d < D
    q = _q_tile(Q, b * stride_qb + h * stride_qh, stride_qm, offs_m, row_ok, offs_d, d_ok, COS, SIN,
                stride_cp, stride_ci, stride_sp, stride_si, rope_off, D, BLOCK_M, HEAD_DIM, PAD_D,
                UPCAST, ROPE, INTERLEAVED)
    do = _load(DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_dom + offs_d[None, :],
               row_ok[:, None], d_ok[None, :], True, PAD_D)
    if UPCAST:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    lse = tl.load(LSE + bh.to(tl.int64) * N_Q + offs_m, mask=row_ok, other=0.0)
    delta = tl.load(DELTA + bh.to(tl.int64) * N_Q + offs_m, mask=row_ok, other=0.0)
    k_base = K + b * stride_kb + hk * stride_kh
    v_base = V + b * stride_vb + hk * stride_vh
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    if CAUSAL:
        full, hi = _visible_keys(start_m, n_end, shift, BLOCK_M, BLOCK_N)
        dq = _attn_bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn,
                                offs_m, offs_d, 0, full, n_end, shift, D, qk_scale,
                                COS, SIN, stride_cp, stride_ci, stride_sp, stride_si,
                                BLOCK_N, False, False, PAD_D, UPCAST, PRECISION, HEAD_DIM, ROPE,
                                INTERLEAVED)
        dq = _attn_bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn,
                                offs_m, offs_d, full, hi, n_end, shift, D, qk_scale,
                                COS, SIN, stride_cp, stride_ci, stride_sp, stride_si,
                                BLOCK_N, True, True, PAD_D, UPCAST, PRECISION, HEAD_DIM, ROPE,
                                INTERLEAVED)
    else:
        full = (n_end // BLOCK_N) * BLOCK_N
        dq = _attn_bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn,
                                offs_m, offs_d, 0, full, n_end, shift, D, qk_scale,
                                COS, SIN, stride_cp, stride_ci, stride_sp, stride_si,
                                BLOCK_N, False, False, PAD_D, UPCAST, PRECISION, HEAD_DIM, ROPE,
                                INTERLEAVED)
        dq = _attn_bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn,
                                offs_m, offs_d, full, n_end, n_end, shift, D, qk_scale,
                                COS, SIN, stride_cp, stride_ci, stride_sp, stride_si,
                                BLOCK_N, False, True, PAD_D, UPCAST, PRECISION, HEAD_DIM, ROPE,
                                INTERLEAVED)
    dq = dq * sm_scale
    if ROPE:  # dq of the turned queries, turned back: the gradient of q
        _rope_store(DQ + b * stride_dqb + h * stride_dqh, stride_dqm, offs_m, row_ok, dq, COS, SIN,
                    stride_cp, stride_ci, stride_sp, stride_si, offs_m + rope_off, D, BLOCK_M,
                    HEAD_DIM, PAD_D, INTERLEAVED)
    else:
        _store(DQ + b * stride_dqb + h * stride_dqh + offs_m[:, None] * stride_dqm + offs_d[None, :],
               dq.to(DQ.dtype.element_ty), row_ok[:, None], d_ok[None, :], PAD_D)


# ---------------------------------------------------------------------------------------
# Backward of short key sequences, in one pass
# ---------------------------------------------------------------------------------------
# The backward above is three launches: delta = rowsum(O * dO), then dK/dV (a key block
# on chip, query blocks streaming past) and dQ (the mirror image), each recomputing the
# scores P. That split is what long sequences need (dQ of a query block needs every key
# block, dK of a key block every query block). When a head's keys all fit ONE key block
# (N_K <= SHORT_KEYS: CLIP's 77 tokens, a short prompt, a decoder's cross-attention to a
# short context), one program holds that head's whole K and V, and every query block it
# streams past sees all the keys: its dQ is complete in that one visit. So one launch does
# everything: delta from O and dO on the spot, P once per query block, dV and dK
# accumulated on chip, dQ stored as each query block finishes. It saves two launches, the
# delta round trip and the second computation of P; what it costs is a program per K/V
# head (fewer, longer programs than the key-block split had), so it is used only where the
# key block it needs is small: many heads and batch elements fill the GPU instead.
# Measured on the H100 (bf16, kernel time, reports/h100-attention-short.json): forward +
# backward at B64 H12 N77 D64 99 us against 106 us split (SDPA FLASH 151, cuDNN 89), at
# B32 H12 N128 causal 62 against 71 us, with 16 query heads on 4 K/V heads (N100) 59 vs 63.

@fast_launch
@triton.jit
def _attn_bwd_short(Q, K, V, O, DO, LSE, DQ, DK, DV, KV_LENS,
                    stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
                    stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om,
                    stride_dob, stride_doh, stride_dom, stride_dqb, stride_dqh, stride_dqm,
                    stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                    H_KV, GROUP, N_Q, N_K, D, stride_lens, qk_scale, sm_scale,
                    COS, SIN, stride_cp, stride_ci, stride_sp, stride_si, rope_off,  # as _attn_fwd
                    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    CAUSAL: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
                    PAD_D: tl.constexpr = False, HAS_LENS: tl.constexpr = False,
                    BOTTOM_RIGHT: tl.constexpr = False, ROPE: tl.constexpr = False,
                    INTERLEAVED: tl.constexpr = False):
    """dQ, dK, dV of one (batch, K/V head) whose N_K <= BLOCK_N keys are one block: its GROUP
    query heads' query blocks stream past, in a fixed order (no atomics)."""
    qk_scale, sm_scale = tl.cast(qk_scale, tl.float32), tl.cast(sm_scale, tl.float32)  # see _attn_fwd
    bhk = tl.program_id(0)
    b, hk = (bhk // H_KV).to(tl.int64), (bhk % H_KV).to(tl.int64)  # 64-bit, as in _attn_fwd
    n_end, shift = _keys(KV_LENS, stride_lens, b, N_Q, N_K, HAS_LENS, BOTTOM_RIGHT)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    key_ok = offs_n < N_K
    d_ok = offs_d < D
    k, v = _kv_block(K, V, b, hk, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
                     offs_n, offs_d, N_K, D, COS, SIN, stride_cp, stride_ci, stride_sp, stride_si,
                     BLOCK_N, HEAD_DIM, PAD_D, UPCAST, ROPE, INTERLEAVED)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    for g in range(0, GROUP):
        h = hk * GROUP + g
        bh = b * (H_KV * GROUP) + h
        for start_m in range(0, N_Q, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            row_ok = offs_m < N_Q
            q = _q_tile(Q, b * stride_qb + h * stride_qh, stride_qm, offs_m, row_ok, offs_d, d_ok,
                        COS, SIN, stride_cp, stride_ci, stride_sp, stride_si, rope_off, D,
                        BLOCK_M, HEAD_DIM, PAD_D, UPCAST, ROPE, INTERLEAVED)
            rows = offs_m[:, None]
            do = _load(DO + b * stride_dob + h * stride_doh + rows * stride_dom + offs_d[None, :],
                       row_ok[:, None], d_ok[None, :], True, PAD_D)
            o = _load(O + b * stride_ob + h * stride_oh + rows * stride_om + offs_d[None, :],
                      row_ok[:, None], d_ok[None, :], True, PAD_D)
            lse = tl.load(LSE + bh * N_Q + offs_m, mask=row_ok, other=0.0)
            delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)  # the preprocess, here
            if UPCAST:
                q = q.to(tl.float32)
                do = do.to(tl.float32)
            # query i sees key j: a real query, a key inside its element's length, and
            # (causal) on or left of the diagonal
            seen = row_ok[:, None] & (offs_n[None, :] < n_end)
            if CAUSAL:
                seen = seen & (rows + shift >= offs_n[None, :])
            ### BEGIN SOLUTION
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # log2 units
            p = tl.where(seen, tl.math.exp2(s - lse[:, None]), 0.0)
            dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PRECISION)
            dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
            ds = p * (dp - delta[:, None])
            dq = tl.dot(ds.to(k.dtype), k, input_precision=PRECISION) * sm_scale
            dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
            ### END SOLUTION
            if ROPE:  # dq of the turned queries, turned back
                _rope_store(DQ + b * stride_dqb + h * stride_dqh, stride_dqm, offs_m, row_ok, dq,
                            COS, SIN, stride_cp, stride_ci, stride_sp, stride_si,
                            offs_m + rope_off, D, BLOCK_M, HEAD_DIM, PAD_D, INTERLEAVED)
            else:
                _store(DQ + b * stride_dqb + h * stride_dqh + rows * stride_dqm + offs_d[None, :],
                       dq.to(DQ.dtype.element_ty), row_ok[:, None], d_ok[None, :], PAD_D)
    dk = dk * sm_scale
    if ROPE:
        _rope_store(DK + b * stride_dkb + hk * stride_dkh, stride_dkn, offs_n, key_ok, dk,
                    COS, SIN, stride_cp, stride_ci, stride_sp, stride_si, offs_n, D, BLOCK_N,
                    HEAD_DIM, PAD_D, INTERLEAVED)
    else:
        _store(DK + b * stride_dkb + hk * stride_dkh + offs_n[:, None] * stride_dkn + offs_d[None, :],
               dk.to(DK.dtype.element_ty), key_ok[:, None], d_ok[None, :], PAD_D)
    _store(DV + b * stride_dvb + hk * stride_dvh + offs_n[:, None] * stride_dvn + offs_d[None, :],
           dv.to(DV.dtype.element_ty), key_ok[:, None], d_ok[None, :], PAD_D)


KERNELS = [_attn_fwd, _attn_fwd_inner, _query_block, _load, _store, _keys, _visible_keys,
           _angles, _rope_load, _rope_store, _q_tile, _kv_block, _attn_bwd_preprocess,
           _attn_bwd_dkdv,
           _attn_bwd_dkdv_inner, _attn_bwd_dq, _attn_bwd_dq_inner, _attn_bwd_short]


# ---------------------------------------------------------------------------------------
# Launch configuration
# ---------------------------------------------------------------------------------------
# Block shapes. The causal loops take any BLOCK_M and BLOCK_N (their bounds are rounded to
# whole blocks); the 16-bit entries were measured on an H100
# (scripts/device_triton_attention_lstm.py sweeps them); fp32 tiles are twice as large, so
# they get smaller blocks to fit shared memory, and the interpreter gets small blocks
# because it is slow. Keys are the padded head size (a power of two, 16..256).
TUNED = {
    # H100, bf16, B4 H16 N4096 D128 (scripts/device_triton_attention_lstm.py --sweep, 2026-11-21):
    # BLOCK_N=128 stages 3: 495/436 TFLOP/s full/causal; BLOCK_N=64: 486/427; 4 stages or
    # 2 stages: 473/414 and 468/391.
    "fwd_d128": dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3),
    # D <= 64: 64-query blocks. H100 kernel times (reports/h100-small-shapes.json), against
    # 128 x 64: GPT-2 small (B8 H12 N1024 causal) 49 vs 61 us, ViT-B/16 (N197) 51 vs 59,
    # BERT-base (N512) 79 vs 87.
    "fwd_small_d": dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3),
    # D = 256 (Gemma's head; 192 pads to it): not measured yet. Sized so that the tiles fit:
    # acc 64 x 256 fp32 is 64 registers a thread at 8 warps, q 32 more; two stages of a
    # 32-key K and V tile are 64 KB of shared memory (of the H100's 227 KB).
    "fwd_d256": dict(BLOCK_M=64, BLOCK_N=32, num_warps=8, num_stages=2),
    "fwd_fp32": dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2),
    "fwd_fp32_d256": dict(BLOCK_M=32, BLOCK_N=32, num_warps=8, num_stages=1),
    # Backward: BLOCK_N = the key block of dK/dV (and query block of dQ), BLOCK_M the
    # streamed block (query block of dK/dV, key block of dQ).
    # 8 warps: dK and dV of a 128-key block are two 128 x D fp32 accumulators (4 warps
    # spill: 171 TFLOP/s). Streamed block 64: 372/354 TFLOP/s full/causal, 32: 304/301.
    "bwd": dict(BLOCK_M=64, BLOCK_N=128, num_warps=8, num_stages=3),
    # D = 256, not measured yet: dK, dV of a 64-key block are 2 x 64 KB fp32 (64 registers a
    # thread each at 8 warps); the streamed q and dO tiles of 16 rows are 16 KB a stage.
    "bwd_d256": dict(BLOCK_M=16, BLOCK_N=64, num_warps=8, num_stages=2),
    # D = 64 was tried with 32 x 64 and 64 x 64 blocks, 4 warps: within 2% of this entry at
    # GPT-2 small, ViT-B/16 and BERT-base's shapes in one run, 9-17% faster in an earlier
    # run in which this entry itself took 9-17% longer than in the later one
    # (reports/h100-small-shapes*.json): within the spread between runs, so kept.
    "bwd_fp32": dict(BLOCK_M=16, BLOCK_N=64, num_warps=4, num_stages=2),
    "bwd_fp32_d256": dict(BLOCK_M=16, BLOCK_N=32, num_warps=8, num_stages=1),
    "interpreted_fwd": dict(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1),
    "interpreted_bwd": dict(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1),
}


def head_tile(D: int) -> int:
    """The register tile's width for head size D: the next power of two, at least 16 (the
    smallest tl.dot operand). D = 8 computes on a 16-wide tile, 80 and 96 on 128."""
    return max(16, next_power_of_2(D))


# What one block may hold in shared memory on an H100 (227 KB, opted in), against which the
# rope-fused tiles are sized below.
SHARED_LIMIT = 227 * 1024


def _shared_estimate(cfg: dict, tile: int, elem: int, rope: bool, streamed: str) -> int:
    """Bytes of shared memory a kernel with these tiles asks for: every pipeline stage holds
    the two streamed tiles (K and V in the forward; q and dO, or K and V, in the backward)
    and, with rope, the cos and sin rows of the streamed block (half a tile each). Measured:
    the forward at fwd_d128's tiles with rope asked 294,912 B on the H100 (Triton 3.6), the
    stages' share exactly (its q tile stays in registers). The backward's resident tiles (a
    key block in dK/dV, a query block in dQ, with their tables) feed transposed products and
    are counted once as well: not measured, so the estimate errs on the large side there."""
    per_row = (2 * tile + (tile if rope else 0)) * elem  # two tiles (+ cos and sin, D/2 each)
    total = cfg["num_stages"] * cfg[streamed] * per_row
    if streamed == "BLOCK_M":  # the backward
        total += cfg["BLOCK_N"] * per_row
    return total


def _fit_rope(cfg: dict, D: int, dtype: torch.dtype, streamed: str) -> dict:
    """The tiles for a rope-fused call: the table's, made smaller until they fit shared memory.
    The tables' rows ride in the same pipeline as the tiles they turn, so a tile measured to
    fit without rope (fwd_d128: 192 KB of stages) may not with it (288 KB: the H100 refused
    the launch). The streamed block is halved first while above 64 rows (fwd_d128 with 64-key
    blocks measured within 2% of 128 without rope), then the stages cut to 2, then the block
    halved again, never below 16 rows."""
    cfg, tile, elem = dict(cfg), head_tile(D), dtype.itemsize
    while _shared_estimate(cfg, tile, elem, True, streamed) > SHARED_LIMIT:
        if cfg[streamed] > 64:
            cfg[streamed] //= 2
        elif cfg["num_stages"] > 2:
            cfg["num_stages"] -= 1
        elif cfg[streamed] > 16:
            cfg[streamed] //= 2
        else:
            break
    return cfg


def _fwd_table(tile: int, dtype: torch.dtype) -> dict:
    """TUNED's forward tiles on a GPU for a head tile and dtype."""
    if dtype == torch.float32:
        return TUNED["fwd_fp32_d256"] if tile == 256 else TUNED["fwd_fp32"]
    return {256: TUNED["fwd_d256"], 128: TUNED["fwd_d128"]}.get(tile, TUNED["fwd_small_d"])


def _bwd_table(tile: int, dtype: torch.dtype) -> dict:
    """TUNED's backward tiles on a GPU for a head tile and dtype."""
    if dtype == torch.float32:
        return TUNED["bwd_fp32_d256"] if tile == 256 else TUNED["bwd_fp32"]
    return TUNED["bwd_d256"] if tile == 256 else TUNED["bwd"]


@functools.lru_cache(maxsize=None)  # on every call's path: the rope fit is worked out once
def _fwd_config(D: int, dtype: torch.dtype, rope: bool = False) -> dict:
    if INTERPRETED:
        return TUNED["interpreted_fwd"]
    cfg = _fwd_table(head_tile(D), dtype)
    return _fit_rope(cfg, D, dtype, "BLOCK_N") if rope else cfg


@functools.lru_cache(maxsize=None)
def _bwd_config(D: int, dtype: torch.dtype, rope: bool = False) -> dict:
    if INTERPRETED:
        return TUNED["interpreted_bwd"]
    # both backward kernels share these tiles: BLOCK_M streams in each (q and dO past a key
    # block in dK/dV; K and V past a query block in dQ)
    cfg = _bwd_table(head_tile(D), dtype)
    return _fit_rope(cfg, D, dtype, "BLOCK_M") if rope else cfg


# The one-pass backward (_attn_bwd_short) holds a head's whole K and V, its dK and dV
# accumulators and a (BLOCK_M x keys) score tile in registers: keys up to SHORT_KEYS, at head
# tiles up to SHORT_HEAD (16-bit; fp32's elements are twice the bytes: half the keys). In
# the interpreter the limit is its key block (TUNED["interpreted_bwd"]), so that the CPU
# tests run both backward paths at their small sizes.
SHORT_KEYS = 16 if INTERPRETED else 128
SHORT_HEAD = 64


@functools.lru_cache(maxsize=None)  # on every backward's path
def _short_config(Nq: int, Nk: int, head_dim: int, dtype: torch.dtype) -> dict | None:
    """The one-pass backward's tiles for these sizes, or None where it does not apply."""
    keys = max(16, next_power_of_2(Nk))
    limit = SHORT_KEYS // 2 if dtype == torch.float32 and not INTERPRETED else SHORT_KEYS
    if keys > limit or head_dim > SHORT_HEAD:
        return None
    rows = 16 if INTERPRETED else min(64, max(16, next_power_of_2(Nq)))
    return dict(BLOCK_M=rows, BLOCK_N=keys, num_warps=4 if keys * head_dim <= 64 * 64 else 8,
                num_stages=2 if not INTERPRETED else 1)


def _precision(dtype: torch.dtype, device: torch.device) -> str:
    if INTERPRETED or dtype == torch.float32:
        # Exact fp32 products (the interpreter upcasts 16-bit inputs to fp32 too), unless
        # the user switched TF32 on, which the harness is told about through uses_tf32.
        return "tf32" if uses_tf32(device, dtype) else "ieee"
    return "tf32"  # 16-bit operands: the setting only concerns fp32, keep the default path


def _strides(t: torch.Tensor):
    # The kernels assume a unit stride along D (for wide loads); everything else is free.
    return t.stride(0), t.stride(1), t.stride(2)


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _lens_stride(kv_lens) -> int:
    return 0 if kv_lens is None else kv_lens.stride(0)  # kv_lens may be a view too


def _features(q, k, bottom_right: bool, kv_lens, rope: tuple | None = None) -> tuple[tuple, dict]:
    """The runtime sizes and the constexpr switches of the features a call uses: (D, group)
    and PAD_D / HAS_LENS / BOTTOM_RIGHT / ROPE / INTERLEAVED (all False in the common case:
    its kernels are the ones they were before these features existed)."""
    D = q.shape[-1]
    switches = dict(HEAD_DIM=head_tile(D), PAD_D=head_tile(D) != D, HAS_LENS=kv_lens is not None,
                    BOTTOM_RIGHT=bool(bottom_right), ROPE=rope is not None,
                    INTERLEAVED=rope is not None and bool(rope[2]))
    return (D, q.shape[1] // k.shape[1]), switches


def _rope_args(rope: tuple | None, stand_in: torch.Tensor) -> tuple:
    """The kernels' table arguments for rope = (cos, sin, interleaved, offset): the tables
    (read in place, through their strides) and the position of query 0; without rope a
    stand-in pointer and zeros (never read: ROPE is off, and its code is not compiled)."""
    if rope is None:
        return (stand_in, stand_in, 0, 0, 0, 0, 0)
    cos, sin, _, offset = rope
    return (cos, sin, *cos.stride(), *sin.stride(), int(offset))


def _forward(q, k, v, causal: bool, scale: float, save: bool, config=None, bottom_right=False,
             kv_lens=None, rope: tuple | None = None):
    """(o, lse) without autograd; the log-sum-exp only when a backward will read it.
    config: the caller's block shapes (a TUNED-style dict), else the table's."""
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    # o is (B, H, Nq, D) laid out as (B, Nq, H, D), as torch's flash attention returns it:
    # a model then merges the heads with a view (out.transpose(1, 2).reshape(B, Nq, H * D)),
    # not a copy, and the gradient that comes back through that view already has o's layout
    # (the replay's backward would otherwise copy it into the layout it was recorded with).
    # The kernels store through o's strides; a row of D stays contiguous.
    o = q.new_empty((B, Nq, H, D)).transpose(1, 2)
    lse = q.new_empty((B, H, Nq), dtype=torch.float32) if save else o
    if o.numel() == 0:
        return o, lse  # nothing to compute: no launch with an empty grid
    if Nk == 0:  # no key at all: every query sees none, out = 0 (as SDPA); lse = +inf
        return o.zero_(), lse.fill_(float("inf")) if save else lse
    (D, group), switches = _features(q, k, bottom_right, kv_lens, rope)
    cfg = _fwd_config(D, q.dtype, rope is not None) if config is None else config
    _attn_fwd[(cdiv(Nq, cfg["BLOCK_M"]), B * H)](
        q, k, v, o, lse, kv_lens if kv_lens is not None else lse,
        *_strides(q), *_strides(k), *_strides(v), *_strides(o),
        H, group, Nq, Nk, D, _lens_stride(kv_lens), scale * LOG2E, *_rope_args(rope, lse),
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], CAUSAL=causal,
        UPCAST=INTERPRETED and q.dtype != torch.float32, PRECISION=_precision(q.dtype, q.device),
        SAVE_LSE=save, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **switches)
    return o, lse


def _backward(q, k, v, o, lse, do, causal: bool, scale: float, config=None, bottom_right=False,
              kv_lens=None, rope: tuple | None = None):
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    if dq.numel() == 0 or dk.numel() == 0:
        # no query or no key: every gradient is 0 (or empty); no launch with an empty grid
        return dq.zero_(), dk.zero_(), dv.zero_()
    do = _unit_last(do)
    (D, group), switches = _features(q, k, bottom_right, kv_lens, rope)
    tables = _rope_args(rope, lse)
    lens = kv_lens if kv_lens is not None else lse
    short = _short_config(Nq, Nk, switches["HEAD_DIM"], q.dtype) if config is None else None
    if short is not None:  # every key of a head in one block: one launch does it all
        _attn_bwd_short[(B * Hkv,)](
            q, k, v, o, do, lse, dq, dk, dv, lens, *_strides(q), *_strides(k), *_strides(v),
            *_strides(o), *_strides(do), *_strides(dq), *_strides(dk), *_strides(dv), Hkv, group,
            Nq, Nk, D, _lens_stride(kv_lens), scale * LOG2E, scale, *tables, CAUSAL=causal,
            UPCAST=INTERPRETED and q.dtype != torch.float32,
            PRECISION=_precision(q.dtype, q.device), **short, **switches)
        return dq, dk, dv
    delta = q.new_empty((B, H, Nq), dtype=torch.float32)
    pre_block = 64
    _attn_bwd_preprocess[(cdiv(Nq, pre_block), B * H)](
        o, do, delta, *_strides(o), *_strides(do), H, Nq, D, HEAD_DIM=switches["HEAD_DIM"],
        BLOCK_M=pre_block, PAD_D=switches["PAD_D"])
    cfg = _bwd_config(D, q.dtype, rope is not None) if config is None else config
    common = dict(CAUSAL=causal, UPCAST=INTERPRETED and q.dtype != torch.float32,
                  PRECISION=_precision(q.dtype, q.device), num_warps=cfg["num_warps"],
                  num_stages=cfg["num_stages"], **switches)
    small, large = cfg["BLOCK_M"], cfg["BLOCK_N"]
    # dK/dV: a large key block stays on chip while small query blocks stream past; one
    # program per key block of each K/V head, looping over that head's group of query heads.
    _attn_bwd_dkdv[(cdiv(Nk, large), B * Hkv)](
        q, k, v, do, lse, delta, dk, dv, lens, *_strides(q), *_strides(k), *_strides(v),
        *_strides(do), *_strides(dk), *_strides(dv), Hkv, group, Nq, Nk, D, _lens_stride(kv_lens),
        scale * LOG2E, scale, *tables,
        BLOCK_M=small, BLOCK_N=large, **common)
    # dQ: the mirror image, a large query block and small key blocks.
    _attn_bwd_dq[(cdiv(Nq, large), B * H)](
        q, k, v, do, lse, delta, dq, lens, *_strides(q), *_strides(k), *_strides(v), *_strides(do),
        *_strides(dq), H, group, Nq, Nk, D, _lens_stride(kv_lens), scale * LOG2E, scale, *tables,
        BLOCK_M=large, BLOCK_N=small, **common)
    return dq, dk, dv


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, config=None, backward_config=None, bottom_right=False,
                kv_lens=None, rope_cos=None, rope_sin=None, rope_interleaved=False, rope_offset=0):
        q, k, v = _unit_last(q), _unit_last(k), _unit_last(v)
        rope = None if rope_cos is None else (rope_cos, rope_sin, rope_interleaved, rope_offset)
        o, lse = _forward(q, k, v, causal, scale, save=True, config=config,
                          bottom_right=bottom_right, kv_lens=kv_lens, rope=rope)
        # q and k are saved as given, never rotated: the backward turns them again as it
        # loads them (the tables are read twice; no rotated copy is ever written)
        ctx.save_for_backward(q, k, v, o, lse, kv_lens, rope_cos, rope_sin)
        ctx.causal, ctx.scale, ctx.backward_config = causal, scale, backward_config
        ctx.bottom_right, ctx.rope_layout = bottom_right, (rope_interleaved, rope_offset)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, kv_lens, rope_cos, rope_sin = ctx.saved_tensors
        rope = None if rope_cos is None else (rope_cos, rope_sin, *ctx.rope_layout)
        dq, dk, dv = _backward(q, k, v, o, lse, do, ctx.causal, ctx.scale, ctx.backward_config,
                               ctx.bottom_right, kv_lens, rope)
        return dq, dk, dv, None, None, None, None, None, None, None, None, None, None


MAX_HEAD_DIM = 256


def check(q, k, v, rope_tables=()) -> None:
    """What only these kernels refuse (levels.triton runs it once per argument signature,
    after the contract): a head size past the largest tile, and a (batch, head) slice (or a
    rope table) too long for their 32-bit offsets."""
    D = q.shape[-1]
    if D > MAX_HEAD_DIM:
        raise ValueError(f"attention: argument 'q' must have a head dimension D <= {MAX_HEAD_DIM} "
                         f"for the Triton kernel (one register tile spans D, padded to a power "
                         f"of two); got D={D} in shape {tuple(q.shape)}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        # Inside one (b, h) slice the kernels index with 32-bit offsets (fast address math
        # in the inner loop); the batch and head offsets are 64-bit.
        span = (t.shape[2] - 1) * abs(t.stride(2)) + (t.shape[3] - 1) * abs(t.stride(3))
        if span >= 2 ** 31:
            raise ValueError(f"attention: argument '{name}' spans {span} elements within one "
                             f"(batch, head) slice; the Triton kernels need < 2**31 there "
                             f"(shape {tuple(t.shape)}, strides {t.stride()})")
    for t in rope_tables:
        span = (t.shape[0] - 1) * abs(t.stride(0)) + (t.shape[1] - 1) * abs(t.stride(1))
        if span >= 2 ** 31:
            raise ValueError(f"attention: argument 'rope' holds a table spanning {span} elements; "
                             f"the Triton kernels index it with 32-bit offsets, < 2**31 "
                             f"(shape {tuple(t.shape)}, strides {t.stride()})")


def attention(q, k, v, causal: bool, scale: float, config=None, backward_config=None,
              bottom_right: bool = False, kv_lens=None, rope: tuple | None = None):
    """softmax(q k^T * scale) v for q (B, H, Nq, D) and k, v (B, H_kv, Nk, D); inputs already
    validated (the contract, then `check`). bottom_right: the causal diagonal aligned to the
    last key (the contract's causal_alignment="bottom_right"); kv_lens: (B,) valid keys per
    batch element, or None; rope: None or (cos, sin, interleaved, offset), the contract's
    rope= with the position of query 0 (levels.contract.validate_attention's rope_offset).

    config=None, backward_config=None: the block shapes of TUNED for this head size and
    dtype. A dict with TUNED's keys (BLOCK_M, BLOCK_N, num_warps, num_stages) pins the
    forward's or the backward's for this call: what scripts/device_triton_attention_lstm.py
    --sweep times, passing them as arguments."""
    if needs_grad(q, k, v):
        return apply_ahead(_FlashAttention, q, k, v, causal, scale, config, backward_config,
                           bottom_right, kv_lens, *(rope if rope is not None else (None, None)))
    return forward_ahead(_inference, q, k, v, causal, scale, config, bottom_right, kv_lens,
                         *(rope if rope is not None else (None, None, False, 0)))


def _inference(q, k, v, causal, scale, config, bottom_right, kv_lens, rope_cos, rope_sin,
               rope_interleaved, rope_offset):
    """The forward of a call that computes no gradient (launch.forward_ahead replays it)."""
    rope = None if rope_cos is None else (rope_cos, rope_sin, rope_interleaved, rope_offset)
    return _forward(_unit_last(q), _unit_last(k), _unit_last(v), causal, scale, save=False,
                    config=config, bottom_right=bottom_right, kv_lens=kv_lens, rope=rope)[0]
