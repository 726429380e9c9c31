"""Flash attention, forward and backward, as CUDA kernels: the numba twin of the algorithm
of triton_kernels/attention.py (FlashAttention-2), written at thread level.

Level 5 has no attention kernel in C++ yet; this is what one looks like in CUDA's terms,
next to the block-level Triton kernels it mirrors (function for function):

    attn_fwd        _attn_fwd + _attn_fwd_inner: one block per (query block, batch*head),
                    one THREAD per query row. The block stages BLOCK_N keys and values in
                    shared memory, barrier, then each thread scores its row against the
                    tile (s = q.k * scale), updates its running max m, sum l and its
                    unnormalized output row acc (local memory) -- the online softmax:
                        m' = max(m, max_j s_j);  alpha = exp(m - m');  p_j = exp(s_j - m')
                        l = alpha l + sum_j p_j;   acc = alpha acc + sum_j p_j v_j
                    barrier (the tile is overwritten next), next tile. out = acc / l,
                    lse = m + log l stored for backward. The N x N scores never exist.
    attn_bwd_delta  _attn_bwd_preprocess: delta_i = sum_d dO_id O_id, a thread per row
    attn_bwd_dkdv   _attn_bwd_dkdv: a block per key block, a thread per key row holding
                    k, v, dk, dv; query tiles (q, dO, lse, delta) stream through shared
                    memory; P is recomputed from lse, never stored:
                        p = exp(q.k * scale - lse_i);  dv += p dO_i
                        ds = p (dO_i.v - delta_i);      dk += ds q_i
    attn_bwd_dq     _attn_bwd_dq: a block per query block, a thread per query row; key
                    tiles stream through shared memory:  dq += ds k_j
    (dk and dq are multiplied by `scale` once at the end: the chain rule through s.)

Causal: key tiles entirely above a query block's diagonal are never loaded (the loop
stops at min(start_m + BLOCK_M, Nk), dK/dV's starts at the first query tile that can see
its keys); inside a tile a key j > i is skipped. Causal query blocks run last-first (the
expensive ones first), as Triton's _query_block orders them.

Grown as Level 5's CUDA-core kernels grew (cuda_kernels/attention.cu, v2 and its backward):
  * grouped-query attention: k, v have H_kv heads; query head h reads K/V head h // group.
    dK/dV: a block per key block of one (batch, K/V head) loops over the group's query
    heads in turn, into the same dk, dv (no atomics);
  * causal with Nq != Nk: query i sees key n <= i + shift (0 top-left, L - Nq
    bottom-right); kv_lens: only keys n < L = kv_lens[b] (clipped to [0, Nk]). A query that
    sees no key outputs 0, and its lse is +inf (every P of it recomputed is 0);
  * empty inputs launch nothing. (Any head size already: the local arrays are sized by D.)

What the simulator cannot do, and what the twin does instead:
  * No tensor cores, no warp-level matrix fragments: a thread does its row's dot products
    one multiply-add at a time (what a CUDA kernel without mma would do). Triton's blocks
    run q @ k^T as one tl.dot on tensor cores; the twin shows the data movement (tiles
    through shared memory, running statistics per row) rather than the arithmetic's speed.
  * Natural units: Triton folds log2(e) into the scale to use exp2 (the GPU's native
    instruction, ex2); the twin uses exp and log (a CUDA kernel would use exp2f/__expf).
  * No timing. The simulator runs one block at a time, a thread per OS thread: BLOCK_M =
    BLOCK_N = 16 keeps tiny shapes quick while still crossing tiles (the tiny preset's
    N = 37 is three tiles, the last one ragged).
  * Any strides: q, k, v, dO are indexed with their four element strides (the harness's
    interleaved qkv layout works without copies). o, lse and the gradients are contiguous.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch
from numba import cuda, float32

from .binding import SIMULATED, Output, cdiv, launch, operand

BLOCK_M = 16  # queries per block (forward, dQ) and per streamed query tile (dK/dV)
BLOCK_N = 16  # keys per streamed tile (forward, dQ) and per block (dK/dV)


class AttentionKernels(NamedTuple):
    head_dim: int
    fwd: object
    bwd_delta: object
    bwd_dkdv: object
    bwd_dq: object


@functools.cache
def attention_kernels(head_dim: int) -> AttentionKernels:
    """The four kernels for one head dimension D: local and shared arrays are sized by D,
    and array shapes must be compile-time constants (numba freezes the captured ints)."""
    D = head_dim
    KV_TILE = BLOCK_N * D   # elements of one K or V tile
    Q_TILE = BLOCK_M * D

    @cuda.jit(device=True)
    def keys_of(LENS, b, Nq, Nk, bottom_right):
        """(end, shift) of batch element b: its keys [0, end), query i sees key n <= i + shift."""
        end = Nk
        if LENS.shape[0] > 0:  # clipped to [0, Nk] (conditionals: numba's CUDA target has
            end = LENS[b]      # no builtin min/max for these mixed integer types)
            end = 0 if end < 0 else (Nk if end > Nk else end)
        return end, (end - Nq if bottom_right else 0)

    @cuda.jit
    def attn_fwd(Q, sqb, sqh, sqm, sqd,   # (B, H, Nq, D) view
                 K, skb, skh, skn, skd,   # (B, H_kv, Nk, D) view
                 V, svb, svh, svn, svd,   # (B, H_kv, Nk, D) view
                 O,                       # (B, H, Nq, D) contiguous
                 LSE,                     # (B*H, Nq): m + log(l) per row
                 LENS,                    # (B,) int32 kv_lens, or empty: every key
                 H, group, Nq, Nk, scale, causal, bottom_right):
        Ks = cuda.shared.array((BLOCK_N, D), float32)
        Vs = cuda.shared.array((BLOCK_N, D), float32)
        q = cuda.local.array(D, float32)
        acc = cuda.local.array(D, float32)
        s = cuda.local.array(BLOCK_N, float32)
        t = cuda.threadIdx.x
        qb = cuda.gridDim.x - 1 - cuda.blockIdx.x if causal else cuda.blockIdx.x
        start_m = qb * BLOCK_M
        bh = cuda.blockIdx.y
        b = bh // H
        h = bh % H
        hk = h // group            # the K/V head this query head reads
        end, shift = keys_of(LENS, b, Nq, Nk, bottom_right)
        i = start_m + t            # this thread's query row
        row_ok = i < Nq            # a thread past the end still loads tiles and meets barriers
        for d in range(D):
            q[d] = Q[b * sqb + h * sqh + i * sqm + d * sqd] if row_ok else 0.0
            acc[d] = 0.0
        m_i = float32(-math.inf)
        l_i = float32(0.0)
        hi = end  # causal: key tiles past the block's last query are never loaded
        if causal and start_m + BLOCK_M + shift < end:
            hi = start_m + BLOCK_M + shift if start_m + BLOCK_M + shift > 0 else 0
        for start_n in range(0, hi, BLOCK_N):
            # The block loads the tile together: BLOCK_M threads, BLOCK_N * D elements.
            for e in range(t, KV_TILE, BLOCK_M):
                j = e // D
                d = e % D
                n = start_n + j
                Ks[j, d] = K[b * skb + hk * skh + n * skn + d * skd] if n < end else 0.0
                Vs[j, d] = V[b * svb + hk * svh + n * svn + d * svd] if n < end else 0.0
            cuda.syncthreads()
            if row_ok:
                ### BEGIN SOLUTION
                tile_max = float32(-math.inf)
                for j in range(BLOCK_N):
                    n = start_n + j
                    if n < end and (not causal or n <= i + shift):
                        dot = float32(0.0)
                        for d in range(D):
                            dot = cuda.fma(q[d], Ks[j, d], dot)
                        s[j] = dot * scale
                        if s[j] > tile_max:
                            tile_max = s[j]
                    else:
                        s[j] = -math.inf
                # A tile with no visible key (tile_max = -inf) changes nothing; before a
                # row's first visible key m_i is -inf, and then the rescale is skipped (no
                # -inf - (-inf)).
                m_new = m_i if m_i > tile_max else tile_max  # (no builtin max: see layer_norm.py)
                if m_new != -math.inf:
                    alpha = math.exp(m_i - m_new)
                    l_i *= alpha
                    for d in range(D):
                        acc[d] *= alpha
                    for j in range(BLOCK_N):
                        if s[j] != -math.inf:
                            p = math.exp(s[j] - m_new)
                            l_i += p
                            for d in range(D):
                                acc[d] = cuda.fma(p, Vs[j, d], acc[d])
                m_i = m_new
                ### END SOLUTION
            cuda.syncthreads()  # everyone is done with the tile before it is overwritten
        if row_ok:
            seen = l_i > 0.0  # a row that saw no key: out 0, lse +inf
            for d in range(D):
                O[((b * H + h) * Nq + i) * D + d] = acc[d] / l_i if seen else 0.0
            LSE[bh * Nq + i] = m_i + math.log(l_i) if seen else math.inf

    @cuda.jit
    def attn_bwd_delta(O,                         # (B, H, Nq, D) contiguous (the forward's)
                       dO, sdb, sdh, sdm, sdd,    # (B, H, Nq, D) view
                       DELTA,                     # (B*H, Nq)
                       H, Nq):
        i = cuda.blockIdx.x * BLOCK_M + cuda.threadIdx.x
        bh = cuda.blockIdx.y
        if i >= Nq:
            return  # no barrier in this kernel
        b = bh // H
        h = bh % H
        total = float32(0.0)
        for d in range(D):
            total = cuda.fma(O[(bh * Nq + i) * D + d], dO[b * sdb + h * sdh + i * sdm + d * sdd], total)
        DELTA[bh * Nq + i] = total

    @cuda.jit
    def attn_bwd_dkdv(Q, sqb, sqh, sqm, sqd,
                      K, skb, skh, skn, skd,
                      V, svb, svh, svn, svd,
                      dO, sdb, sdh, sdm, sdd,
                      LSE, DELTA,              # (B*H, Nq)
                      dK, dV,                  # (B, H_kv, Nk, D) contiguous
                      LENS,
                      H_kv, group, Nq, Nk, scale, causal, bottom_right):
        Qs = cuda.shared.array((BLOCK_M, D), float32)
        dOs = cuda.shared.array((BLOCK_M, D), float32)
        lse_s = cuda.shared.array(BLOCK_M, float32)
        delta_s = cuda.shared.array(BLOCK_M, float32)
        k = cuda.local.array(D, float32)
        v = cuda.local.array(D, float32)
        dk = cuda.local.array(D, float32)
        dv = cuda.local.array(D, float32)
        t = cuda.threadIdx.x
        start_n = cuda.blockIdx.x * BLOCK_N
        bhk = cuda.blockIdx.y      # batch x K/V head
        b = bhk // H_kv
        hk = bhk % H_kv
        end, shift = keys_of(LENS, b, Nq, Nk, bottom_right)
        j = start_n + t            # this thread's key row
        col_ok = j < Nk
        for d in range(D):
            k[d] = K[b * skb + hk * skh + j * skn + d * skd] if col_ok else 0.0
            v[d] = V[b * svb + hk * svh + j * svn + d * svd] if col_ok else 0.0
            dk[d] = 0.0
            dv[d] = 0.0
        # Causal: queries before start_n - shift never see these keys; start at their tile.
        first = start_n - shift if start_n - shift > 0 else 0  # the first query that sees a key here
        lo = (first // BLOCK_M) * BLOCK_M if causal else 0
        # Grouped-query attention: every query head of the group adds to this dk, dv, one
        # head after the other (no atomics).
        for g in range(group):
            h = hk * group + g
            bh = b * H_kv * group + h
            for start_m in range(lo, Nq, BLOCK_M):
                for e in range(t, Q_TILE, BLOCK_N):
                    r = e // D
                    d = e % D
                    i = start_m + r
                    Qs[r, d] = Q[b * sqb + h * sqh + i * sqm + d * sqd] if i < Nq else 0.0
                    dOs[r, d] = dO[b * sdb + h * sdh + i * sdm + d * sdd] if i < Nq else 0.0
                for r in range(t, BLOCK_M, BLOCK_N):
                    i = start_m + r
                    lse_s[r] = LSE[bh * Nq + i] if i < Nq else 0.0
                    delta_s[r] = DELTA[bh * Nq + i] if i < Nq else 0.0
                cuda.syncthreads()
                if col_ok and j < end:
                    for r in range(BLOCK_M):
                        i = start_m + r
                        if i < Nq and (not causal or j <= i + shift):
                            ### BEGIN SOLUTION
                            dot = float32(0.0)
                            for d in range(D):
                                dot = cuda.fma(Qs[r, d], k[d], dot)
                            p = math.exp(dot * scale - lse_s[r])  # P recomputed, never stored
                            dp = float32(0.0)
                            for d in range(D):
                                dv[d] = cuda.fma(p, dOs[r, d], dv[d])
                                dp = cuda.fma(dOs[r, d], v[d], dp)
                            ds = p * (dp - delta_s[r])
                            for d in range(D):
                                dk[d] = cuda.fma(ds, Qs[r, d], dk[d])
                            ### END SOLUTION
                cuda.syncthreads()
        if col_ok:
            for d in range(D):
                dK[(bhk * Nk + j) * D + d] = dk[d] * scale
                dV[(bhk * Nk + j) * D + d] = dv[d]

    @cuda.jit
    def attn_bwd_dq(Q, sqb, sqh, sqm, sqd,
                    K, skb, skh, skn, skd,
                    V, svb, svh, svn, svd,
                    dO, sdb, sdh, sdm, sdd,
                    LSE, DELTA,
                    dQ,                       # (B, H, Nq, D) contiguous
                    LENS,
                    H, group, Nq, Nk, scale, causal, bottom_right):
        Ks = cuda.shared.array((BLOCK_N, D), float32)
        Vs = cuda.shared.array((BLOCK_N, D), float32)
        q = cuda.local.array(D, float32)
        do = cuda.local.array(D, float32)
        dq = cuda.local.array(D, float32)
        t = cuda.threadIdx.x
        qb = cuda.gridDim.x - 1 - cuda.blockIdx.x if causal else cuda.blockIdx.x
        start_m = qb * BLOCK_M
        bh = cuda.blockIdx.y
        b = bh // H
        h = bh % H
        hk = h // group
        end, shift = keys_of(LENS, b, Nq, Nk, bottom_right)
        i = start_m + t
        row_ok = i < Nq
        for d in range(D):
            q[d] = Q[b * sqb + h * sqh + i * sqm + d * sqd] if row_ok else 0.0
            do[d] = dO[b * sdb + h * sdh + i * sdm + d * sdd] if row_ok else 0.0
            dq[d] = 0.0
        lse = LSE[bh * Nq + i] if row_ok else 0.0
        delta = DELTA[bh * Nq + i] if row_ok else 0.0
        hi = end  # causal: key tiles past the block's last query are never loaded
        if causal and start_m + BLOCK_M + shift < end:
            hi = start_m + BLOCK_M + shift if start_m + BLOCK_M + shift > 0 else 0
        for start_n in range(0, hi, BLOCK_N):
            for e in range(t, KV_TILE, BLOCK_M):
                j = e // D
                d = e % D
                n = start_n + j
                Ks[j, d] = K[b * skb + hk * skh + n * skn + d * skd] if n < end else 0.0
                Vs[j, d] = V[b * svb + hk * svh + n * svn + d * svd] if n < end else 0.0
            cuda.syncthreads()
            if row_ok:
                for j in range(BLOCK_N):
                    n = start_n + j
                    if n < end and (not causal or n <= i + shift):
                        ### BEGIN SOLUTION
                        dot = float32(0.0)
                        dp = float32(0.0)
                        for d in range(D):
                            dot = cuda.fma(q[d], Ks[j, d], dot)
                            dp = cuda.fma(do[d], Vs[j, d], dp)
                        p = math.exp(dot * scale - lse)
                        ds = p * (dp - delta)
                        for d in range(D):
                            dq[d] = cuda.fma(ds, Ks[j, d], dq[d])
                        ### END SOLUTION
            cuda.syncthreads()
        if row_ok:
            for d in range(D):
                dQ[(bh * Nq + i) * D + d] = dq[d] * scale

    return AttentionKernels(D, attn_fwd, attn_bwd_delta, attn_bwd_dkdv, attn_bwd_dq)


# =====================================================================================
# Launchers (no autograd): torch float32 tensors in and out
# =====================================================================================

def _lengths(kv_lens, device):
    """kv_lens as the kernels read it: an int32 device array, empty for "every key"."""
    t = torch.zeros(0, dtype=torch.int32) if kv_lens is None else kv_lens.to(torch.int32)
    flat = t.detach().contiguous().reshape(-1)
    return cuda.to_device(flat.cpu().numpy()) if SIMULATED else cuda.as_cuda_array(flat.to(device))


def attention_fwd(q, k, v, causal: bool, scale: float, bottom_right=False, kv_lens=None):
    """(o, lse): o (B, H, Nq, D) contiguous, lse (B*H, Nq) in natural-log units (+inf for a
    query that sees no key, whose o is 0)."""
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if q.numel() == 0 or Nk == 0:  # nothing to launch: no key means out 0, lse +inf
        return (torch.zeros((B, H, Nq, D), device=q.device),
                torch.full((B * H, Nq), math.inf, device=q.device))
    kern = attention_kernels(D)
    o = Output((B, H, Nq, D), q.device)
    lse = Output((B * H, Nq), q.device)
    launch(kern.fwd, (cdiv(Nq, BLOCK_M), B * H), BLOCK_M,
           operand(q), *q.stride(), operand(k), *k.stride(), operand(v), *v.stride(),
           o.array, lse.array, _lengths(kv_lens, q.device), H, H // Hkv, Nq, Nk, float(scale),
           bool(causal), bool(bottom_right))
    return o.finish(), lse.finish()


def attention_bwd(q, k, v, o, lse, do, causal: bool, scale: float, bottom_right=False,
                  kv_lens=None):
    """(dq, dk, dv), each contiguous, from the forward's o and lse and the upstream do."""
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    device = q.device
    if q.numel() == 0 or k.numel() == 0:  # no query or no key: zero gradients, no launch
        return (torch.zeros(q.shape, device=device), torch.zeros(k.shape, device=device),
                torch.zeros(v.shape, device=device))
    kern = attention_kernels(D)
    q_a, k_a, v_a, do_a = operand(q), operand(k), operand(v), operand(do)
    lse_a = operand(lse)
    lens = _lengths(kv_lens, device)
    delta = Output((B * H, Nq), device)
    launch(kern.bwd_delta, (cdiv(Nq, BLOCK_M), B * H), BLOCK_M,
           operand(o), do_a, *do.stride(), delta.array, H, Nq)
    delta_a = operand(delta.finish())
    dk, dv = Output((B, Hkv, Nk, D), device), Output((B, Hkv, Nk, D), device)
    # one block per key block of each (batch, K/V head): it loops over the group's query heads
    launch(kern.bwd_dkdv, (cdiv(Nk, BLOCK_N), B * Hkv), BLOCK_N,
           q_a, *q.stride(), k_a, *k.stride(), v_a, *v.stride(), do_a, *do.stride(),
           lse_a, delta_a, dk.array, dv.array, lens, Hkv, H // Hkv, Nq, Nk, float(scale),
           bool(causal), bool(bottom_right))
    dq = Output((B, H, Nq, D), device)
    launch(kern.bwd_dq, (cdiv(Nq, BLOCK_M), B * H), BLOCK_M,
           q_a, *q.stride(), k_a, *k.stride(), v_a, *v.stride(), do_a, *do.stride(),
           lse_a, delta_a, dq.array, lens, H, H // Hkv, Nq, Nk, float(scale), bool(causal),
           bool(bottom_right))
    return dq.finish(), dk.finish(), dv.finish()


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, bottom_right=False, kv_lens=None):
        o, lse = attention_fwd(q, k, v, causal, scale, bottom_right, kv_lens)
        ctx.save_for_backward(q, k, v, o, lse, kv_lens)
        ctx.causal, ctx.scale, ctx.bottom_right = causal, scale, bottom_right
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, kv_lens = ctx.saved_tensors
        dq, dk, dv = attention_bwd(q, k, v, o, lse, do, ctx.causal, ctx.scale, ctx.bottom_right,
                                   kv_lens)
        return dq, dk, dv, None, None, None, None


def attention(q, k, v, causal: bool, scale: float, bottom_right: bool = False, kv_lens=None):
    """softmax(q k^T * scale) v of float32 q (B, H, Nq, D) and k, v (B, H_kv, Nk, D)
    (validated by the caller: numba_kernels.level; scale already resolved). Differentiable.
    No copies: q, k, v and the upstream gradient go in with their strides."""
    return _FlashAttention.apply(q, k, v, causal, scale, bottom_right, kv_lens)
