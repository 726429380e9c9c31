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
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .launch import apply_ahead, cdiv, fast_launch, needs_grad

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"
HEAD_DIMS = (16, 32, 64, 128)
LOG2E = 1.4426950408889634


def uses_tf32(device: torch.device, dtype: torch.dtype) -> bool:
    """fp32 dots run in TF32 only where the user asked for it, the same switch as torch's."""
    return (device.type == "cuda" and dtype == torch.float32
            and bool(torch.backends.cuda.matmul.allow_tf32))


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
                    lo, hi, N_K, qk_scale,
                    BLOCK_N: tl.constexpr, CAUSAL_MASK: tl.constexpr, EDGE_MASK: tl.constexpr,
                    UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    """Stream key blocks [lo, hi) through the running softmax of one query block."""
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        # K is loaded as (D, BLOCK_N) so that q @ kT needs no transpose in registers.
        kT_ptrs = k_base + offs_n[None, :] * stride_kn + offs_d[:, None]
        v_ptrs = v_base + offs_n[:, None] * stride_vn + offs_d[None, :]
        if EDGE_MASK:
            kT = tl.load(kT_ptrs, mask=offs_n[None, :] < N_K, other=0.0)
            v = tl.load(v_ptrs, mask=offs_n[:, None] < N_K, other=0.0)
        else:
            kT = tl.load(kT_ptrs)
            v = tl.load(v_ptrs)
        if UPCAST:  # the interpreter's 16-bit arithmetic is wrong: compute in fp32 there
            kT = kT.to(tl.float32)
            v = v.to(tl.float32)
        ### BEGIN SOLUTION
        s = tl.dot(q, kT, input_precision=PRECISION) * qk_scale  # log2 units
        if CAUSAL_MASK:
            s = tl.where(offs_m[:, None] >= offs_n[None, :], s, float("-inf"))
        if EDGE_MASK:
            s = tl.where(offs_n[None, :] < N_K, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
        ### END SOLUTION
    return acc, l_i, m_i


@fast_launch
@triton.jit
def _attn_fwd(Q, K, V, O, LSE,
              stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
              stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om,
              H, N_Q, N_K, qk_scale,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              CAUSAL: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
              SAVE_LSE: tl.constexpr):  # False under no_grad: no backward will read it
    # Float arguments become fp32 here: a plain launch types a Python float as fp32, but
    # Inductor, compiling a model around this kernel, passes it as fp64, which would make
    # the running accumulator fp64 inside the loop (a compile error) and the math slow.
    qk_scale = tl.cast(qk_scale, tl.float32)
    start_m = _query_block(CAUSAL) * BLOCK_M
    bh = tl.program_id(1)
    # 64-bit batch/head offsets (b * stride_qb passes 2**31 for tensors of > 2**31
    # elements); offsets inside one (b, h) slice stay 32-bit, guarded by the launcher.
    b, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < N_Q
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    if CAUSAL:
        # Stage 1: key blocks entirely at or below the diagonal, no mask at all
        # (needs BLOCK_M % BLOCK_N == 0, which the launcher guarantees).
        acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn,
                                        offs_m, offs_d, 0, start_m, N_K, qk_scale,
                                        BLOCK_N, False, False, UPCAST, PRECISION)
        # Stage 2: the blocks that straddle the diagonal; those above it are skipped.
        hi = tl.minimum(start_m + BLOCK_M, N_K)
        acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn,
                                        offs_m, offs_d, start_m, hi, N_K, qk_scale,
                                        BLOCK_N, True, True, UPCAST, PRECISION)
    else:
        full = (N_K // BLOCK_N) * BLOCK_N
        acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn,
                                        offs_m, offs_d, 0, full, N_K, qk_scale,
                                        BLOCK_N, False, False, UPCAST, PRECISION)
        acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn,
                                        offs_m, offs_d, full, N_K, N_K, qk_scale,
                                        BLOCK_N, False, True, UPCAST, PRECISION)
    # Every row saw at least one key (key 0 is visible to every query), so l_i > 0.
    out = acc / l_i[:, None]
    if SAVE_LSE:
        tl.store(LSE + bh.to(tl.int64) * N_Q + offs_m, m_i + tl.math.log2(l_i), mask=row_ok)
    tl.store(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :],
             out.to(O.dtype.element_ty), mask=row_ok[:, None])


# ---------------------------------------------------------------------------------------
# Backward
# ---------------------------------------------------------------------------------------

@fast_launch
@triton.jit
def _attn_bwd_preprocess(O, DO, DELTA, stride_ob, stride_oh, stride_om,
                         stride_db, stride_dh, stride_dm, H, N_Q,
                         HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    bh = tl.program_id(1)
    # 64-bit batch/head offsets (b * stride_qb passes 2**31 for tensors of > 2**31
    # elements); offsets inside one (b, h) slice stay 32-bit, guarded by the launcher.
    b, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    ok = (offs_m < N_Q)[:, None]
    o = tl.load(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :],
                mask=ok, other=0.0).to(tl.float32)
    do = tl.load(DO + b * stride_db + h * stride_dh + offs_m[:, None] * stride_dm + offs_d[None, :],
                 mask=ok, other=0.0).to(tl.float32)
    tl.store(DELTA + bh.to(tl.int64) * N_Q + offs_m, tl.sum(o * do, 1), mask=offs_m < N_Q)


@triton.jit
def _attn_bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_dom,
                         offs_n, offs_d, lo, hi, N_Q, qk_scale,
                         BLOCK_M: tl.constexpr, CAUSAL_MASK: tl.constexpr, EDGE_MASK: tl.constexpr,
                         UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    """Accumulate the contribution of query blocks [lo, hi) to one key block's dK, dV.

    Works in the transposed frame (keys along rows) so that p^T and dS^T come out of the
    dots directly and nothing is transposed in registers."""
    offs_m0 = tl.arange(0, BLOCK_M)
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + offs_m0
        qT_ptrs = q_base + offs_m[None, :] * stride_qm + offs_d[:, None]
        do_ptrs = do_base + offs_m[:, None] * stride_dom + offs_d[None, :]
        if EDGE_MASK:
            row_ok = offs_m < N_Q
            qT = tl.load(qT_ptrs, mask=row_ok[None, :], other=0.0)
            do = tl.load(do_ptrs, mask=row_ok[:, None], other=0.0)
            lse = tl.load(lse_base + offs_m, mask=row_ok, other=0.0)
            delta = tl.load(delta_base + offs_m, mask=row_ok, other=0.0)
        else:
            qT = tl.load(qT_ptrs)
            do = tl.load(do_ptrs)
            lse = tl.load(lse_base + offs_m)
            delta = tl.load(delta_base + offs_m)
        if UPCAST:
            qT = qT.to(tl.float32)
            do = do.to(tl.float32)
        ### BEGIN SOLUTION
        sT = tl.dot(k, qT, input_precision=PRECISION) * qk_scale  # (BLOCK_N, BLOCK_M)
        pT = tl.math.exp2(sT - lse[None, :])
        if CAUSAL_MASK:
            pT = tl.where(offs_m[None, :] >= offs_n[:, None], pT, 0.0)
        if EDGE_MASK:
            pT = tl.where(offs_m[None, :] < N_Q, pT, 0.0)
        dv += tl.dot(pT.to(do.dtype), do, input_precision=PRECISION)
        dpT = tl.dot(v, tl.trans(do), input_precision=PRECISION)
        dsT = pT * (dpT - delta[None, :])
        dk += tl.dot(dsT.to(qT.dtype), tl.trans(qT), input_precision=PRECISION)
        ### END SOLUTION
    return dk, dv


@fast_launch
@triton.jit
def _attn_bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV,
                   stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
                   stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_dom,
                   stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                   H, N_Q, N_K, qk_scale, sm_scale,
                   HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   CAUSAL: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    qk_scale, sm_scale = tl.cast(qk_scale, tl.float32), tl.cast(sm_scale, tl.float32)  # see _attn_fwd
    start_n = tl.program_id(0) * BLOCK_N
    bh = tl.program_id(1)
    # 64-bit batch/head offsets (b * stride_qb passes 2**31 for tensors of > 2**31
    # elements); offsets inside one (b, h) slice stay 32-bit, guarded by the launcher.
    b, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    col_ok = (offs_n < N_K)[:, None]
    k = tl.load(K + b * stride_kb + h * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :],
                mask=col_ok, other=0.0)
    v = tl.load(V + b * stride_vb + h * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :],
                mask=col_ok, other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    q_base = Q + b * stride_qb + h * stride_qh
    do_base = DO + b * stride_dob + h * stride_doh
    lse_base = LSE + bh.to(tl.int64) * N_Q
    delta_base = DELTA + bh.to(tl.int64) * N_Q
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    if CAUSAL:
        # Queries before start_n never see this key block; the next BLOCK_N queries
        # straddle the diagonal (masked); the rest see all of it.
        diag_end = tl.minimum(start_n + BLOCK_N, N_Q)
        dk, dv = _attn_bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, lse_base, delta_base,
                                      stride_qm, stride_dom, offs_n, offs_d, start_n, diag_end,
                                      N_Q, qk_scale, BLOCK_M, True, True, UPCAST, PRECISION)
        lo = start_n + BLOCK_N
    else:
        lo = 0
    full = tl.maximum((N_Q // BLOCK_M) * BLOCK_M, lo)
    dk, dv = _attn_bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, lse_base, delta_base,
                                  stride_qm, stride_dom, offs_n, offs_d, lo, full,
                                  N_Q, qk_scale, BLOCK_M, False, False, UPCAST, PRECISION)
    dk, dv = _attn_bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, lse_base, delta_base,
                                  stride_qm, stride_dom, offs_n, offs_d, full, N_Q,
                                  N_Q, qk_scale, BLOCK_M, False, True, UPCAST, PRECISION)
    # dS was taken with respect to the scaled scores; the chain rule brings back `scale`.
    dk = dk * sm_scale
    tl.store(DK + b * stride_dkb + h * stride_dkh + offs_n[:, None] * stride_dkn + offs_d[None, :],
             dk.to(DK.dtype.element_ty), mask=col_ok)
    tl.store(DV + b * stride_dvb + h * stride_dvh + offs_n[:, None] * stride_dvn + offs_d[None, :],
             dv.to(DV.dtype.element_ty), mask=col_ok)


@triton.jit
def _attn_bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn, offs_m, offs_d,
                       lo, hi, N_K, qk_scale,
                       BLOCK_N: tl.constexpr, CAUSAL_MASK: tl.constexpr, EDGE_MASK: tl.constexpr,
                       UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        kT_ptrs = k_base + offs_n[None, :] * stride_kn + offs_d[:, None]
        vT_ptrs = v_base + offs_n[None, :] * stride_vn + offs_d[:, None]
        if EDGE_MASK:
            kT = tl.load(kT_ptrs, mask=offs_n[None, :] < N_K, other=0.0)
            vT = tl.load(vT_ptrs, mask=offs_n[None, :] < N_K, other=0.0)
        else:
            kT = tl.load(kT_ptrs)
            vT = tl.load(vT_ptrs)
        if UPCAST:
            kT = kT.to(tl.float32)
            vT = vT.to(tl.float32)
        ### BEGIN SOLUTION
        s = tl.dot(q, kT, input_precision=PRECISION) * qk_scale
        p = tl.math.exp2(s - lse[:, None])
        if CAUSAL_MASK:
            p = tl.where(offs_m[:, None] >= offs_n[None, :], p, 0.0)
        if EDGE_MASK:
            p = tl.where(offs_n[None, :] < N_K, p, 0.0)
        dp = tl.dot(do, vT, input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(kT.dtype), tl.trans(kT), input_precision=PRECISION)
        ### END SOLUTION
    return dq


@fast_launch
@triton.jit
def _attn_bwd_dq(Q, K, V, DO, LSE, DELTA, DQ,
                 stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
                 stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_dom,
                 stride_dqb, stride_dqh, stride_dqm,
                 H, N_Q, N_K, qk_scale, sm_scale,
                 HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 CAUSAL: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    qk_scale, sm_scale = tl.cast(qk_scale, tl.float32), tl.cast(sm_scale, tl.float32)  # see _attn_fwd
    start_m = _query_block(CAUSAL) * BLOCK_M
    bh = tl.program_id(1)
    # 64-bit batch/head offsets (b * stride_qb passes 2**31 for tensors of > 2**31
    # elements); offsets inside one (b, h) slice stay 32-bit, guarded by the launcher.
    b, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < N_Q
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)
    do = tl.load(DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_dom + offs_d[None, :],
                 mask=row_ok[:, None], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    lse = tl.load(LSE + bh.to(tl.int64) * N_Q + offs_m, mask=row_ok, other=0.0)
    delta = tl.load(DELTA + bh.to(tl.int64) * N_Q + offs_m, mask=row_ok, other=0.0)
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    if CAUSAL:
        dq = _attn_bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn,
                                offs_m, offs_d, 0, start_m, N_K, qk_scale,
                                BLOCK_N, False, False, UPCAST, PRECISION)
        hi = tl.minimum(start_m + BLOCK_M, N_K)
        dq = _attn_bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn,
                                offs_m, offs_d, start_m, hi, N_K, qk_scale,
                                BLOCK_N, True, True, UPCAST, PRECISION)
    else:
        full = (N_K // BLOCK_N) * BLOCK_N
        dq = _attn_bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn,
                                offs_m, offs_d, 0, full, N_K, qk_scale,
                                BLOCK_N, False, False, UPCAST, PRECISION)
        dq = _attn_bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn,
                                offs_m, offs_d, full, N_K, N_K, qk_scale,
                                BLOCK_N, False, True, UPCAST, PRECISION)
    dq = dq * sm_scale
    tl.store(DQ + b * stride_dqb + h * stride_dqh + offs_m[:, None] * stride_dqm + offs_d[None, :],
             dq.to(DQ.dtype.element_ty), mask=row_ok[:, None])


KERNELS = [_attn_fwd, _attn_fwd_inner, _query_block, _attn_bwd_preprocess, _attn_bwd_dkdv, _attn_bwd_dkdv_inner,
           _attn_bwd_dq, _attn_bwd_dq_inner]


# ---------------------------------------------------------------------------------------
# Launch configuration
# ---------------------------------------------------------------------------------------
# Block shapes. Causal masking needs BLOCK_M % BLOCK_N == 0 in the forward and dQ kernels
# and BLOCK_N % BLOCK_M == 0 in the dK/dV kernel, so that the diagonal is covered by whole
# inner blocks. The 16-bit entries were measured on an H100 (scripts/device_triton_attention_lstm.py
# sweeps them); fp32 tiles are twice as large, so they get smaller blocks to fit shared
# memory, and the interpreter gets small blocks because it is slow.
TUNED = {
    # H100, bf16, B4 H16 N4096 D128 (scripts/device_triton_attention_lstm.py --sweep, 2026-11-21):
    # BLOCK_N=128 stages 3: 495/436 TFLOP/s full/causal; BLOCK_N=64: 486/427; 4 stages or
    # 2 stages: 473/414 and 468/391.
    "fwd_d128": dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3),
    # D <= 64: 64-query blocks. H100 kernel times (reports/h100-small-shapes.json), against
    # 128 x 64: GPT-2 small (B8 H12 N1024 causal) 49 vs 61 us, ViT-B/16 (N197) 51 vs 59,
    # BERT-base (N512) 79 vs 87.
    "fwd_small_d": dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3),
    "fwd_fp32": dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2),
    # Backward: BLOCK_N = the key block of dK/dV (and query block of dQ), BLOCK_M the
    # streamed block (query block of dK/dV, key block of dQ).
    # 8 warps: dK and dV of a 128-key block are two 128 x D fp32 accumulators (4 warps
    # spill: 171 TFLOP/s). Streamed block 64: 372/354 TFLOP/s full/causal, 32: 304/301.
    "bwd": dict(BLOCK_M=64, BLOCK_N=128, num_warps=8, num_stages=3),
    # D = 64 was tried with 32 x 64 and 64 x 64 blocks, 4 warps: within 2% of this entry at
    # GPT-2 small, ViT-B/16 and BERT-base's shapes in one run, 9-17% faster in an earlier
    # run in which this entry itself took 9-17% longer than in the later one
    # (reports/h100-small-shapes*.json): within the spread between runs, so kept.
    "bwd_fp32": dict(BLOCK_M=16, BLOCK_N=64, num_warps=4, num_stages=2),
    "interpreted_fwd": dict(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1),
    "interpreted_bwd": dict(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1),
}


def _fwd_config(D: int, dtype: torch.dtype) -> dict:
    if INTERPRETED:
        return TUNED["interpreted_fwd"]
    if dtype == torch.float32:
        return TUNED["fwd_fp32"]
    return TUNED["fwd_d128"] if D == 128 else TUNED["fwd_small_d"]


def _bwd_config(D: int, dtype: torch.dtype) -> dict:
    if INTERPRETED:
        return TUNED["interpreted_bwd"]
    return TUNED["bwd_fp32"] if dtype == torch.float32 else TUNED["bwd"]


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


def _forward(q, k, v, causal: bool, scale: float, save: bool, config=None):
    """(o, lse) without autograd; the log-sum-exp only when a backward will read it.
    config: the caller's block shapes (a TUNED-style dict), else the table's."""
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    o = q.new_empty((B, H, Nq, D))
    lse = q.new_empty((B, H, Nq), dtype=torch.float32) if save else o
    cfg = _fwd_config(D, q.dtype) if config is None else config
    _attn_fwd[(cdiv(Nq, cfg["BLOCK_M"]), B * H)](
        q, k, v, o, lse, *_strides(q), *_strides(k), *_strides(v), *_strides(o),
        H, Nq, Nk, scale * LOG2E,
        HEAD_DIM=D, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], CAUSAL=causal,
        UPCAST=INTERPRETED and q.dtype != torch.float32, PRECISION=_precision(q.dtype, q.device),
        SAVE_LSE=save, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return o, lse


def _backward(q, k, v, o, lse, do, causal: bool, scale: float, config=None):
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    do = _unit_last(do)
    delta = q.new_empty((B, H, Nq), dtype=torch.float32)
    pre_block = 64
    _attn_bwd_preprocess[(cdiv(Nq, pre_block), B * H)](
        o, do, delta, *_strides(o), *_strides(do), H, Nq, HEAD_DIM=D, BLOCK_M=pre_block)
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    cfg = _bwd_config(D, q.dtype) if config is None else config
    common = dict(HEAD_DIM=D, CAUSAL=causal, UPCAST=INTERPRETED and q.dtype != torch.float32,
                  PRECISION=_precision(q.dtype, q.device), num_warps=cfg["num_warps"],
                  num_stages=cfg["num_stages"])
    small, large = cfg["BLOCK_M"], cfg["BLOCK_N"]
    # dK/dV: a large key block stays on chip while small query blocks stream past.
    _attn_bwd_dkdv[(cdiv(Nk, large), B * H)](
        q, k, v, do, lse, delta, dk, dv, *_strides(q), *_strides(k), *_strides(v), *_strides(do),
        *_strides(dk), *_strides(dv), H, Nq, Nk, scale * LOG2E, scale,
        BLOCK_M=small, BLOCK_N=large, **common)
    # dQ: the mirror image, a large query block and small key blocks.
    _attn_bwd_dq[(cdiv(Nq, large), B * H)](
        q, k, v, do, lse, delta, dq, *_strides(q), *_strides(k), *_strides(v), *_strides(do),
        *_strides(dq), H, Nq, Nk, scale * LOG2E, scale,
        BLOCK_M=large, BLOCK_N=small, **common)
    return dq, dk, dv


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, config=None, backward_config=None):
        q, k, v = _unit_last(q), _unit_last(k), _unit_last(v)
        o, lse = _forward(q, k, v, causal, scale, save=True, config=config)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale, ctx.backward_config = causal, scale, backward_config
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = _backward(q, k, v, o, lse, do, ctx.causal, ctx.scale, ctx.backward_config)
        return dq, dk, dv, None, None, None, None


def check(q, k, v) -> None:
    """What only these kernels refuse (levels.triton runs it once per argument signature,
    after the contract): a head size the kernels are not templated for, and a (batch, head)
    slice too long for their 32-bit offsets."""
    D = q.shape[-1]
    if D not in HEAD_DIMS:
        raise ValueError(f"attention: argument 'q' must have a head dimension D in "
                         f"{', '.join(map(str, HEAD_DIMS))} for the Triton kernel "
                         f"(one register tile spans D); got D={D} in shape {tuple(q.shape)}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        # Inside one (b, h) slice the kernels index with 32-bit offsets (fast address math
        # in the inner loop); the batch and head offsets are 64-bit.
        span = (t.shape[2] - 1) * abs(t.stride(2)) + (t.shape[3] - 1) * abs(t.stride(3))
        if span >= 2 ** 31:
            raise ValueError(f"attention: argument '{name}' spans {span} elements within one "
                             f"(batch, head) slice; the Triton kernels need < 2**31 there "
                             f"(shape {tuple(t.shape)}, strides {t.stride()})")


def attention(q, k, v, causal: bool, scale: float, config=None, backward_config=None):
    """softmax(q k^T * scale) v for (B, H, N, D) tensors; inputs already validated (the
    contract, then `check`).

    config=None, backward_config=None: the block shapes of TUNED for this head size and
    dtype. A dict with TUNED's keys (BLOCK_M, BLOCK_N, num_warps, num_stages; causal calls
    need the divisibility above) pins the forward's or the backward's for this call: what
    scripts/device_triton_attention_lstm.py --sweep times, passing them as arguments."""
    if needs_grad(q, k, v):
        return apply_ahead(_FlashAttention, q, k, v, causal, scale, config, backward_config)
    return _forward(_unit_last(q), _unit_last(k), _unit_last(v), causal, scale, save=False,
                    config=config)[0]
