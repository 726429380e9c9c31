"""Level 5 (CUDA C++) attention: every version of cuda_kernels/attention.cu, forward and
backward, through the harness (float64 reference, NaN-poisoned allocations, both layouts).

The kernels have paths chosen by size, causality and layout: tiles of 64 keys (forward; 32
at v5 with D = 128) and of 32 or 64 queries/keys (backward) with masked ragged edges, 4 or 8
warps by the grid's size (2 or 4 warps of 32 rows at v5), v4/v5's causal skipping and
unmasked interior tiles, the fp32 path of v3/v4 (v2 and the CUDA-core
backward), head dims 16-128. So the GPU tests take sequence lengths that are multiples of
nothing (1, 17, 100, 1023), Nq != Nk, every head dim, the packed qkv layout (read in place),
a transposed last dimension and an odd offset (copied), and B*H beyond 65535 blocks.

Grown: grouped-query heads, causal with Nq != Nk in both alignments, kv_lens and RoPE fused
(ROPE_API.md) at every version; head sizes 1-256 (the tiles of 8..256) at v1, v2 and the
CUDA-core backward (v3-v5 hand other sizes to v2 unless asked for by argument); empty inputs.

Version 7's backward adds dQ with atomics: its dq is checked against float64 like every
gradient, and for repeatability to its dtype's rounding only (`_agree`); dk and dv bit for bit.

On a CPU: the version plumbing, the head-dim refusal, the operand layouts (made on CPU
tensors), mirrors of the kernels' index math (tile skipping around a shifted diagonal, the
un-rotation of mma fragments, the grouped dK/dV steps, v7's transposed dS read, dQ jobs and a
float64 model of its whole fused backward), and (with nvcc) that no kernel spills on sm_90a."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import cuda_kernels.attention as K5
from equivalence import cards
from equivalence.check import check, check_args

ENV = K5.ENV_VERSION
CU = Path(K5.__file__).with_suffix(".cu")
VERSIONS = sorted(K5.VERSIONS)
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
ROPE_VERSIONS = [v for v in VERSIONS if v != K5.HOPPER_VERSION]  # v6 does not fuse RoPE


# ------------------------------------------------------------------------ CPU: Python --

def test_versions_and_default():
    assert VERSIONS == [1, 2, 3, 4, 5, 6, 7] and K5.DEFAULT_VERSION == 5
    assert K5.ATOMIC_DQ_VERSIONS == (7,) and 7 in K5.TENSOR_CORE_VERSIONS
    assert K5.uses_tf32(torch.device("cuda"), torch.float32) is False
    opening = CU.read_text().split("#include")[0]
    for v in VERSIONS:
        assert re.search(rf"^//\s+v{v}\s", opening, re.M), f"v{v} missing from the opening comment"


def test_default_is_version_6_on_hopper_for_16_bit_heads_of_128(monkeypatch):
    # The measured rule (cuda_kernels/attention.py default_version): version 6 where it was
    # faster on the H100 (D = 128), version 5 elsewhere; the environment still overrides it.
    from cuda_kernels import versions

    class Q:  # what default_version reads of q: a CUDA tensor's shape, dtype and device
        def __init__(self, D, dtype):
            self.shape, self.dtype, self.is_cuda = (2, 4, 300, D), dtype, True

    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(versions, "on_hopper", lambda: True)
    assert K5.default_version(Q(128, torch.bfloat16)) == K5.resolve_version(None, Q(128, torch.float16)) == 6
    assert K5.default_version(Q(64, torch.bfloat16)) == 5
    assert K5.default_version(Q(128, torch.float32)) == 5
    assert K5.default_version(Q(128, torch.bfloat16), rope=True) == 5
    monkeypatch.setenv(ENV, "4")
    assert K5.resolve_version(None, Q(128, torch.bfloat16)) == 4
    monkeypatch.setattr(versions, "on_hopper", lambda: False)
    assert K5.default_version(Q(128, torch.bfloat16)) == 5


def test_version_from_argument_then_environment(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert K5.resolve_version() == 5
    monkeypatch.setenv(ENV, "2")
    assert K5.resolve_version() == 2 and K5.resolve_version(3) == 3
    with pytest.raises(ValueError, match=r"attention: argument 'version' must be one of \[1, 2, 3, 4, 5, 6, 7\]"):
        K5.resolve_version(8)


@pytest.mark.parametrize("D", [8, 48, 96, 256])
def test_a_tensor_core_version_asked_for_refuses_other_head_dims_before_any_kernel(D):
    q = torch.zeros(1, 2, 5, D, dtype=torch.bfloat16)  # a CPU tensor: refused before any GPU work
    with pytest.raises(ValueError, match=rf"argument 'version': version 4 \(tensor cores\) cannot run "
                                         rf"head dimension D={D} \(they take D in 16, 32, 64, 128\)"):
        K5.attention(q, q, q, False, 0.5, version=4)


def test_a_head_dim_past_256_is_refused_at_every_version():
    q = torch.zeros(1, 2, 5, 264)
    with pytest.raises(ValueError, match=r"argument 'q' must have a head dimension D <= 256.*D=264"):
        K5.attention(q, q, q, False, 0.5)


@pytest.mark.parametrize("what,shapes,causal,lens", [
    ("head", ((1, 2, 5, 80), (1, 2, 5, 80)), False, None),
    ("head-grouped-lengths", ((2, 4, 5, 48), (2, 2, 5, 48)), True, [5, 3])])
def test_the_default_version_hands_grown_calls_to_version_2(what, shapes, causal, lens, monkeypatch):
    # version=None (and $LEVELS_CUDA_VERSION_ATTENTION, a default for the process) picks a
    # version that can; the common case keeps the tensor cores; fp32 is v2's anyway
    q, k = torch.zeros(shapes[0], dtype=torch.bfloat16), torch.zeros(shapes[1], dtype=torch.bfloat16)
    kv_lens = None if lens is None else torch.tensor(lens)
    monkeypatch.delenv(ENV, raising=False)
    assert K5.pick_version(None, q, k, causal, kv_lens) == 2
    monkeypatch.setenv(ENV, "4")
    assert K5.pick_version(None, q, k, causal, kv_lens) == 2
    assert K5.pick_version(1, q, k, causal, kv_lens) == 1
    with pytest.raises(ValueError, match=r"argument 'version': version 5 \(tensor cores\) cannot run"):
        K5.pick_version(5, q, k, causal, kv_lens)
    common = torch.zeros(1, 2, 5, 64, dtype=torch.bfloat16)
    assert K5.pick_version(None, common, common, True, None) == 4
    assert K5.pick_version(5, q.float(), k.float(), causal, kv_lens) == 5


@pytest.mark.parametrize("H,H_kv", [(4, 2), (12, 4), (6, 1)])
def test_grouped_query_heads_keep_the_tensor_core_default(H, H_kv, monkeypatch):
    # (and so do per-batch lengths and causal with Nq != Nk: the masks read both)
    # Llama's gpu preset (12 heads, 4 K/V heads, D = 64, causal): v3-v5 read K/V head
    # h // group in place, so version=None keeps the default and every version takes it
    q = torch.zeros(1, H, 5, 64, dtype=torch.bfloat16)
    k = torch.zeros(1, H_kv, 5, 64, dtype=torch.bfloat16)
    monkeypatch.delenv(ENV, raising=False)
    for causal in (False, True):
        assert K5.pick_version(None, q, k, causal, None) == K5.DEFAULT_VERSION == 5
        for v in VERSIONS:
            assert K5.pick_version(v, q, k, causal, None) == v
    monkeypatch.setenv(ENV, "3")
    assert K5.pick_version(None, q, k, True, None) == 3
    monkeypatch.delenv(ENV)
    decode = torch.zeros(2, H_kv, 300, 64, dtype=torch.bfloat16)
    lens = torch.tensor([300, 17])
    assert K5.pick_version(None, q[:, :, :1].expand(2, -1, -1, -1), decode, True, lens) == 5


def test_rope_keeps_the_default_where_the_tensor_cores_take_it(monkeypatch):
    # RoPE fused: v3-v5 instantiate it for D 64 and 128; other sizes run v2 by default and
    # are refused by name when a tensor-core version is asked for. Without rope nothing moves.
    monkeypatch.delenv(ENV, raising=False)
    for D in K5.ROPE_HEAD_DIMS:
        q = torch.zeros(1, 12, 5, D, dtype=torch.bfloat16)
        k = torch.zeros(1, 4, 5, D, dtype=torch.bfloat16)
        assert K5.pick_version(None, q, k, True, None, rope=True) == 5
        assert K5.pick_version(None, q, k, True, None) == 5
        assert all(K5.pick_version(v, q, k, True, None, rope=True) == v for v in ROPE_VERSIONS)
    q = torch.zeros(1, 2, 5, 32, dtype=torch.float16)
    assert K5.pick_version(None, q, q, True, None) == 5
    assert K5.pick_version(None, q, q, True, None, rope=True) == 2
    with pytest.raises(ValueError, match=r"version 3 \(tensor cores\) cannot run RoPE with head dimension "
                                         r"D=32 \(they take rope with D in 64, 128\)"):
        K5.pick_version(3, q, q, True, None, rope=True)
    assert K5.pick_version(3, q.float(), q.float(), True, None, rope=True) == 3  # fp32: v2's kernels


def test_version_6_refuses_by_name_and_the_default_hands_its_calls_on(monkeypatch):
    # Version 6 (wgmma) takes D 64 and 128 without RoPE. Asked for by argument it raises
    # naming what it cannot do; named by the environment (version=None) it hands the call to
    # version 5 where 5 can run it, else to version 2. fp32 is version 2's at 3-6 anyway.
    monkeypatch.delenv(ENV, raising=False)
    q64 = torch.zeros(1, 4, 5, 64, dtype=torch.bfloat16)
    k64 = torch.zeros(1, 2, 5, 64, dtype=torch.bfloat16)
    q32 = torch.zeros(1, 2, 5, 32, dtype=torch.float16)
    q48 = torch.zeros(1, 2, 5, 48, dtype=torch.float16)
    assert K5.pick_version(6, q64, k64, True, None) == 6
    with pytest.raises(ValueError, match=r"argument 'version': version 6 \(wgmma\) cannot run head dimension "
                                         r"D=32 \(it takes D in 64, 128\); versions 1-5 can"):
        K5.pick_version(6, q32, q32, False, None)
    with pytest.raises(ValueError, match=r"version 6 \(wgmma\) cannot run RoPE \(version 5 fuses it\)"):
        K5.pick_version(6, q64, k64, True, None, rope=True)
    with pytest.raises(ValueError, match=r"version 6 \(tensor cores\) cannot run head dimension D=48"):
        K5.pick_version(6, q48, q48, False, None)
    assert K5.pick_version(6, q32.float(), q32.float(), False, None) == 6  # fp32: v2's kernels
    monkeypatch.setenv(ENV, "6")
    assert K5.pick_version(None, q64, k64, True, None) == 6  # (a CPU tensor: no GPU to ask)
    assert K5.pick_version(None, q32, q32, True, None) == 5
    assert K5.pick_version(None, q64, k64, True, None, rope=True) == 5
    assert K5.pick_version(None, q32, q32, True, None, rope=True) == 2  # v5 has no rope at D 32
    assert K5.pick_version(None, q48, q48, True, None) == 2
    monkeypatch.setattr(K5, "_not_hopper", lambda q: True)  # a CUDA tensor on a GPU without wgmma
    assert K5.pick_version(None, q64, k64, True, None) == 5
    assert K5.pick_version(6, q64, k64, True, None) == 6  # asked for: the launcher refuses (BAD_ARCH)


# ------------------------------------------------- CPU: mirrors of the kernels' index math --
# What no CPU can run but can mirror: the C expressions, transcribed one for one.

def _visible(i, j, end, shift, causal):  # attention.cu's Keys::visible
    return j < end and not (causal and j > i + shift)


@pytest.mark.parametrize("Nq,Nk,lens,bottom_right", [(100, 100, None, False), (37, 300, 200, True),
                                                     (300, 70, None, True), (130, 90, 0, True),
                                                     (65, 130, 77, False)])
def test_mirror_tile_skipping_around_a_shifted_diagonal(Nq, Nk, lens, bottom_right):
    # v4-v6's forward and the dQ kernel skip a warp's key tile ("above") and run it without
    # the mask ("needs_mask" false); the dK/dV kernel starts at t_first and skips likewise.
    # Brute force: a skipped tile holds no visible (query, key) pair, an unmasked one only
    # visible pairs of real rows, and t_first loses no query that sees the keys.
    end = Nk if lens is None else max(0, min(lens, Nk))
    shift = end - Nq if bottom_right else 0
    causal = 1
    # v4, v5, v5 at D 128, dQ at D 128 (4 or 8 warps), and v6 (warpgroups of 64 rows, 1 or 2)
    for rows, bn, blocks in ((16, 64, (64, 128)), (32, 64, (64, 128)), (32, 32, (64, 128)), (16, 32, (64, 128)),
                             (64, 128, (64, 128))):
        for block_m in blocks:
            for m0 in range(0, Nq, block_m):
                kv_end = max(0, min(end, m0 + block_m + shift))
                for w in range(block_m // rows):
                    warp_row0 = m0 + w * rows
                    for n0 in range(0, -(-kv_end // bn) * bn, bn):
                        above = n0 > warp_row0 + rows - 1 + shift
                        needs_mask = n0 + bn > end or n0 + bn - 1 > warp_row0 + shift
                        pairs = [(i, j) for i in range(warp_row0, min(warp_row0 + rows, Nq))
                                 for j in range(n0, n0 + bn)]
                        if above:
                            assert not any(_visible(i, j, end, shift, causal) for i, j in pairs)
                        elif not needs_mask:
                            assert all(_visible(i, j, end, shift, causal) for i, j in pairs)
                # and no visible key lies past kv_end for the block's rows
                assert not any(_visible(i, j, end, shift, causal) for i in range(m0, min(m0 + block_m, Nq))
                               for j in range(kv_end, Nk))
    for QT in (64, 32):  # dK/dV: 16 keys a warp, query tiles of QT from t_first
        for n0 in range(0, Nk, 64):
            t_first = max(0, n0 - shift) // QT
            assert not any(_visible(i, j, end, shift, causal) for i in range(0, t_first * QT)
                           for j in range(n0, min(n0 + 64, Nk)))
            for warp_key0 in range(n0, n0 + 64, 16):
                for m0 in range(t_first * QT, Nq, QT):
                    above = warp_key0 >= end or m0 + QT - 1 + shift < warp_key0
                    needs_mask = m0 + QT > Nq or warp_key0 + 15 >= end or m0 + shift < warp_key0 + 15
                    pairs = [(i, j) for i in range(m0, m0 + QT) for j in range(warp_key0, warp_key0 + 16)]
                    if above:
                        assert not any(_visible(i, j, end, shift, causal) for i, j in pairs if i < Nq)
                    elif not needs_mask:
                        assert all(_visible(i, j, end, shift, causal) and i < Nq for i, j in pairs)


@pytest.mark.parametrize("D", K5.ROPE_HEAD_DIMS)
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
def test_mirror_rope_unrotate_acc_turns_the_fragment_back(D, interleaved):
    # rope_unrotate_acc: lane l of a warp holds acc[dt][e] = M[g + 8 (e >> 1), 8 dt + 2 t + (e & 1)]
    # (g = l / 4, t = l % 4: the mma C layout); turning those registers by minus the angle in
    # place must equal turning the 16 x D matrix M back (rope's backward) row by row.
    g = torch.Generator().manual_seed(D)
    M = torch.randn(16, D, generator=g, dtype=torch.float64)
    theta = torch.randn(16, D // 2, generator=g, dtype=torch.float64)
    c, s = theta.cos(), theta.sin()
    x1, x2 = (M[:, 0::2], M[:, 1::2]) if interleaved else M.split(D // 2, -1)
    y1, y2 = x1 * c + x2 * s, x2 * c - x1 * s
    want = torch.stack((y1, y2), -1).flatten(-2) if interleaved else torch.cat((y1, y2), -1)
    got = torch.full_like(M, float("nan"))
    for lane in range(32):
        gr, t = lane >> 2, lane & 3
        acc = [[M[gr + 8 * (e >> 1), 8 * dt + 2 * t + (e & 1)].item() for e in range(4)] for dt in range(D // 8)]
        for h in range(2):
            row = gr + 8 * h
            if interleaved:
                for dt in range(D // 8):
                    cs = (c[row, dt * 4 + t].item(), s[row, dt * 4 + t].item())
                    a, b = acc[dt][2 * h], acc[dt][2 * h + 1]
                    acc[dt][2 * h], acc[dt][2 * h + 1] = a * cs[0] + b * cs[1], b * cs[0] - a * cs[1]
            else:
                for dt in range(D // 16):
                    for e in range(2):
                        i = dt * 8 + 2 * t + e
                        cs = (c[row, i].item(), s[row, i].item())
                        a, b = acc[dt][2 * h + e], acc[dt + D // 16][2 * h + e]
                        acc[dt][2 * h + e], acc[dt + D // 16][2 * h + e] = a * cs[0] + b * cs[1], b * cs[0] - a * cs[1]
        for dt in range(D // 8):
            for e in range(4):
                got[gr + 8 * (e >> 1), 8 * dt + 2 * t + (e & 1)] = acc[dt][e]
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_mirror_grouped_dkdv_steps_visit_every_head_and_tile_once():
    # attn_bwd_dkdv_mma_kernel: step s is query head bh0 + s / per_head, tile t_first + s %
    # per_head; the prefetch for step s + 1 uses the same formulas (stage (s + 1) & 1).
    for group, t_first, t_end in ((1, 0, 5), (3, 2, 7), (4, 0, 1), (6, 3, 4)):
        per_head = max(0, t_end - t_first)
        steps = group * per_head
        seen = [(s // per_head, t_first + s % per_head) for s in range(steps)]
        assert sorted(seen) == [(h, t) for h in range(group) for t in range(t_first, t_end)]
        prefetched = [((s + 1) // per_head, t_first + (s + 1) % per_head) for s in range(steps - 1)]
        assert prefetched == seen[1:]



# v7's fused backward (attention.cu, "v7's backward"): the staggered query-tile order, dS read
# back transposed from its [keys][queries] tile, and the dQ jobs with their key bound.

def test_mirror_v7_staggered_steps_visit_every_head_and_tile_once():
    # attn_bwd_fused_kernel: step s is head bh0 + s / per_head, tile_of(s) = t_first +
    # (s % per_head + rot) % per_head with rot = nb % per_head; the prefetch uses tile_of(s + 1).
    for group, t_first, t_end in ((1, 0, 5), (3, 2, 7), (4, 0, 1), (6, 3, 4), (2, 0, 33)):
        per_head = max(0, t_end - t_first)
        for nb in range(40):
            rot = nb % per_head
            seen = [(s // per_head, t_first + (s % per_head + rot) % per_head) for s in range(group * per_head)]
            assert sorted(seen) == [(h, t) for h in range(group) for t in range(t_first, t_end)]
            assert seen[0][1] == t_first + rot  # neighbouring key blocks start at different tiles


def _ldmatrix_x4_trans(tile, addr_of):
    """PTX ldmatrix .x4 .trans: lanes 8i..8i+7 give the (row, col) starts of matrix i's 8 rows
    (8 elements each); lane l's register i receives (M_i[2 (l % 4)][l / 4], M_i[2 (l % 4) + 1][l / 4])."""
    starts = [addr_of(lane) for lane in range(32)]
    regs = []
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        regs.append([tuple(tile[starts[8 * i + r][0]][starts[8 * i + r][1] + g] for r in (2 * t, 2 * t + 1))
                     for i in range(4)])
    return regs


@pytest.mark.parametrize("QT", [32, 64])
def test_mirror_v7_ds_tile_read_transposed_is_the_a_fragment(QT):
    # fused_tile stores dSᵀ (rows: the block's keys, columns: the tile's queries); fused_dq
    # reads it with ldmatrix.trans at b_addr<QT>'s lane pattern (row kc 16 + (l & 7) + 8 (l >> 4),
    # column mt 16 + 8 ((l >> 3) & 1)): each lane must get the m16n8k16 A fragment of dS
    # (queries x keys): a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..).
    block_n = 128
    ds = [[(q, key) for key in range(block_n)] for q in range(QT)]  # dS[q][key], labelled
    sds = [[ds[q][key] for q in range(QT)] for key in range(block_n)]  # the stored transpose
    for kc in range(block_n // 16):
        for mt in range(QT // 16):
            regs = _ldmatrix_x4_trans(sds, lambda l: (kc * 16 + (l & 7) + ((l >> 4) << 3),
                                                      mt * 16 + ((l >> 3) & 1) * 8))
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                for i in range(4):
                    m, k = mt * 16 + g + 8 * (i & 1), kc * 16 + 2 * t + 8 * (i >> 1)
                    assert regs[lane][i] == (ds[m][k], ds[m][k + 1]), (kc, mt, lane, i)


@pytest.mark.parametrize("D", [16, 32, 64, 128])
@pytest.mark.parametrize("warps", [4, 8])
def test_mirror_v7_dq_jobs_cover_the_tile_once_and_skip_only_unseen_keys(D, warps):
    # fused_dq: QT = 32 at D 128, else 64; jobs of 16 queries x JW = min(D, 32) columns, warp w
    # takes jobs w, w + warps, ...; a job visits keys [n0, n0 + 16 ceil(kend / 16)) with
    # kend = min(block_n, end - n0, causal: q0 + 15 + shift - n0 + 1). Every (query, column)
    # of the tile once; every key a job leaves out is unseen by all 16 of its queries.
    QT, JW = (32 if D == 128 else 64), min(D, 32)
    CJ, block_n = D // JW, 16 * warps
    jobs = [(job // CJ, (job % CJ) * JW) for w in range(warps) for job in range(w, (QT // 16) * CJ, warps)]
    cells = sorted((16 * mt + r, c0 + c) for mt, c0 in jobs for r in range(16) for c in range(JW))
    assert cells == [(q, d) for q in range(QT) for d in range(D)]
    for Nq, Nk, end, shift in ((300, 300, 300, 0), (130, 300, 171, 41), (257, 129, 0, -257), (77, 500, 500, 0)):
        for causal in (0, 1):
            for n0 in range(0, Nk, block_n):
                if n0 >= end:
                    continue  # no step: the block's keys are past the length
                for m0 in range(0, Nq, QT):
                    for mt, _ in jobs:
                        q0 = m0 + 16 * mt
                        kend = min(block_n, end - n0)
                        if causal:
                            kend = min(kend, q0 + 15 + shift - n0 + 1)
                        visited = set(range(n0, n0 + 16 * -(-kend // 16))) if q0 < Nq and kend > 0 else set()
                        for j in set(range(n0, n0 + block_n)) - visited:
                            assert not any(_visible(i, j, end, shift, causal) for i in range(q0, min(q0 + 16, Nq)))


def _rows(t, n):
    """Rows [0, n) of a 2-D slice, zeros past its end (the kernels' zero-filled tile rows)."""
    return torch.cat([t, t.new_zeros(max(0, n - t.shape[0]), t.shape[1])])[:n]


def _fused_backward_model(q, k, v, dout, scale, causal, ends, shifts, warps, QT):
    """attn_bwd_fused_kernel's loops in float64 (torch, CPU), transcribed: key blocks of 16
    warps keys, the staggered (head, query tile) steps from t_first, each warp's "above" /
    "needs_mask" choice (unmasked tiles run without the mask, as in the kernel), the dS tile,
    the dQ jobs with their key bound and the row guard. Returns dq, dk, dv."""
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    group, block_n = H // Hkv, 16 * warps
    JW = min(D, 32)
    CJ = D // JW
    sl = scale * math.log2(math.e)
    dq_acc, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    s_all = q @ k.repeat_interleave(group, 1).transpose(-1, -2) * sl
    for b in range(B):
        end, shift = ends[b], shifts[b]
        j = torch.arange(Nk)
        seen = (j[None, :] < end) & (~(j[None, :] > torch.arange(Nq)[:, None] + shift) if causal else True)
        s = s_all[b].masked_fill(~seen, float("-inf"))
        lse = torch.logsumexp(s * math.log(2), -1) / math.log(2)  # base 2, as the forward's
        lse = torch.where(seen.any(-1), lse, torch.full_like(lse, float("inf")))  # no key: +inf
        o = torch.nan_to_num(torch.softmax(s * math.log(2), -1)) @ v[b].repeat_interleave(group, 0)
        delta = (dout[b] * o).sum(-1)
        for hk in range(Hkv):
            for nb in range(-(-Nk // block_n)):
                n0 = nb * block_n
                t_first = max(0, n0 - shift) // QT if causal else 0
                t_end = -(-Nq // QT)
                per_head = max(0, t_end - t_first) if n0 < end else 0
                rot = nb % per_head if per_head else 0
                kb, vb = _rows(k[b, hk, n0:], block_n), _rows(v[b, hk, n0:], block_n)
                for step in range(group * per_head):
                    h = hk * group + step // per_head
                    m0 = (t_first + (step % per_head + rot) % per_head) * QT
                    qt, dot = _rows(q[b, h, m0:], QT), _rows(dout[b, h, m0:], QT)
                    lt = _rows(lse[h, m0:, None], QT)[:, 0]  # rows past Nq: 0, as cp.async's zero fill
                    dt = _rows(delta[h, m0:, None], QT)[:, 0]
                    ds = torch.zeros(block_n, QT, dtype=q.dtype)
                    for w in range(warps):
                        key0 = n0 + 16 * w
                        above = key0 >= end or (causal and m0 + QT - 1 + shift < key0)
                        needs_mask = m0 + QT > Nq or key0 + 15 >= end or (causal and m0 + shift < key0 + 15)
                        if above:
                            continue
                        rows = slice(16 * w, 16 * w + 16)
                        pt = torch.exp2(kb[rows] @ qt.T * sl - lt[None, :])
                        if needs_mask:
                            qi, key = torch.arange(m0, m0 + QT)[None, :], torch.arange(key0, key0 + 16)[:, None]
                            hidden = (qi >= Nq) | (key >= end) | ((qi + shift < key) if causal else False)
                            pt = pt.masked_fill(hidden, 0)
                        dst = pt * (vb[rows] @ dot.T - dt[None, :])  # dSᵀ
                        n = max(0, min(16, Nk - key0))
                        dv[b, hk, key0:key0 + n] += (pt @ dot)[:n]
                        dk[b, hk, key0:key0 + n] += (dst @ qt)[:n]
                        ds[rows] = dst
                    for job in range((QT // 16) * CJ):
                        mt, c0 = job // CJ, (job % CJ) * JW
                        q0 = m0 + 16 * mt
                        kend = min(block_n, end - n0)
                        if causal:
                            kend = min(kend, q0 + 15 + shift - n0 + 1)
                        if q0 >= Nq or kend <= 0:
                            continue
                        kk = 16 * -(-kend // 16)
                        part = ds[:kk, 16 * mt:16 * mt + 16].T @ kb[:kk, c0:c0 + JW]
                        n = min(16, Nq - q0)
                        dq_acc[b, h, q0:q0 + n, c0:c0 + JW] += part[:n]
    return dq_acc * scale, dk * scale, dv


@pytest.mark.parametrize("Nq,Nk,lens,causal,bottom_right,H,Hkv,warps,QT", [
    (70, 70, None, False, False, 2, 2, 4, 64),
    (70, 150, [150, 77], True, True, 4, 2, 4, 32),
    (150, 70, None, True, False, 2, 1, 8, 32),
    (100, 130, [0, 130], True, True, 2, 2, 4, 64),   # a length 0: no key block has a step
    (33, 200, [120, 200], False, False, 3, 1, 8, 64)])
def test_mirror_v7_fused_backward_tiles_give_the_gradients(Nq, Nk, lens, causal, bottom_right, H, Hkv, warps, QT):
    # The fused kernel's tiling, skipping, masking, staggered steps and dQ jobs, run as float64
    # matrix products: the gradients must be attention's (autograd of the float64 math).
    g = torch.Generator().manual_seed(Nq + Nk)
    B, D, scale = 2, 16, 0.3
    q = torch.randn(B, H, Nq, D, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, Hkv, Nk, D, generator=g, dtype=torch.float64) for _ in range(2))
    dout = torch.randn(B, H, Nq, D, generator=g, dtype=torch.float64)
    ends = [Nk if lens is None else lens[b] for b in range(B)]
    shifts = [ends[b] - Nq if bottom_right else 0 for b in range(B)]
    dq, dk, dv = _fused_backward_model(q, k, v, dout, scale, causal, ends, shifts, warps, QT)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    s = leaves[0] @ leaves[1].repeat_interleave(H // Hkv, 1).transpose(-1, -2) * scale
    i, j = torch.arange(Nq)[:, None], torch.arange(Nk)[None, :]
    mask = torch.stack([(j >= ends[b]) | ((j > i + shifts[b]) if causal else torch.zeros_like(j, dtype=torch.bool))
                        for b in range(B)])[:, None]
    out = torch.nan_to_num(torch.softmax(s.masked_fill(mask, float("-inf")), -1)) @ leaves[2].repeat_interleave(
        H // Hkv, 1)
    out.backward(dout)
    for name, got, want in zip(("dq", "dk", "dv"), (dq, dk, dv), (x.grad for x in leaves)):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9, msg=name)

# v6 (wgmma): the shared-memory layout its loader writes, read back the way the PTX ISA's
# canonical 128-byte-swizzle layouts say the tensor cores read a descriptor, and the
# accumulator -> A-fragment re-pack of P. Byte addresses are modelled; 2-byte elements.

def _swizzle128(addr):  # the hardware's 128-byte swizzle: bits 4-6 ^= bits 7-9
    return addr ^ (((addr >> 7) & 7) << 4)


def _v6_store(rows, D, base=0):
    """v6_load's destination of (row r, column d): {byte address: (r, d)} for a [D/64][rows][64] tile."""
    where = {}
    for r in range(rows):
        for ch in range(D // 8):
            dst = (ch >> 3) * rows * 64 + r * 64 + (((ch & 7) ^ (r & 7)) << 3)  # elements, as the C
            for e in range(8):
                where[base + 2 * (dst + e)] = (r, ch * 8 + e)
    return where


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("rows", [64, 128])
def test_mirror_v6_k_major_descriptors_read_q_and_k_slices(D, rows):
    # K-major, 128-byte swizzle (PTX ISA canonical layout): element (row m, k) of the 64 x 16
    # (A) or N x 16 (B) slice at desc start A sits at swizzle(A + (m // 8) SBO + (m % 8) 128 + 2k),
    # SBO = 1024. v6's k-step kk starts at atom kk // 4 (rows x 128 bytes on) + 32 (kk % 4),
    # a warpgroup's Q rows at 64 x 128 bytes on: each read must give (row, 16 kk + k).
    where = _v6_store(rows, D)
    for wg in range(rows // 64):
        for kk in range(D // 16):
            start = (kk >> 2) * rows * 128 + wg * 64 * 128 + (kk & 3) * 32
            for m in range(64):
                for k in range(16):
                    addr = _swizzle128(start + (m // 8) * 1024 + (m % 8) * 128 + 2 * k)
                    assert where[addr] == (wg * 64 + m, 16 * kk + k), (wg, kk, m, k)


@pytest.mark.parametrize("D", [64, 128])
def test_mirror_v6_mn_major_descriptor_reads_v_transposed(D):
    # MN-major (imm-trans-b = 1), 128-byte swizzle: element (k, n) of the 16 x N slice at desc
    # start A sits at swizzle(A + (n // 64) LBO + (k // 8) SBO + (k % 8) 128 + 2 (n % 64)):
    # LBO = the next 64 columns (an atom: 128 keys x 128 bytes), SBO = the next 8 keys (1024).
    # V's tile is written by the same loader as K's; k-slice c starts 16 keys (2048 bytes) in.
    BN = 128
    where = _v6_store(BN, D)
    for c in range(BN // 16):
        start = c * 16 * 128
        for k in range(16):
            for n in range(D):
                addr = _swizzle128(start + (n // 64) * (BN * 128) + (k // 8) * 1024 + (k % 8) * 128 + 2 * (n % 64))
                assert where[addr] == (16 * c + k, n), (c, k, n)


def test_mirror_v6_p_from_the_s_accumulators_is_the_a_fragment():
    # m64nN fp32 accumulator: warp w, lane (g, t) holds d[i] = S[16w + g + 8 ((i >> 1) & 1),
    # 8 (i >> 2) + 2t + (i & 1)]. Register-A fragment of m64nNk16 (16-bit): a[j] packs
    # (A[16w + g + 8 (j & 1), 2t + 8 (j >> 1)], the same column + 1). fwd_tile_v6 packs
    # a[c][j] = (d[8c + 2j], d[8c + 2j + 1]): that must be P[:, 16c:16c + 16] in the A layout.
    S = torch.arange(64 * 128, dtype=torch.float64).view(64, 128)
    for w in range(4):
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            d = [S[16 * w + g + 8 * ((i >> 1) & 1), 8 * (i >> 2) + 2 * t + (i & 1)].item() for i in range(64)]
            for c in range(8):
                for j in range(4):
                    lo, hi = d[8 * c + 2 * j], d[8 * c + 2 * j + 1]
                    row, col = 16 * w + g + 8 * (j & 1), 16 * c + 2 * t + 8 * (j >> 1)
                    assert (lo, hi) == (S[row, col].item(), S[row, col + 1].item()), (w, lane, c, j)


# ------------------------------------------------------------------------ CPU: nvcc ---

def _nvcc_reason():
    from cuda_kernels import build
    return build.nvcc_available()


needs_nvcc = pytest.mark.skipif(_nvcc_reason() is not None, reason=f"needs nvcc: {_nvcc_reason()}")


@pytest.fixture(scope="module")
def ptxas():
    """One nvcc call a unit for the whole module (build.ptxas_report caches it on disk as
    well): attention.cu compiles the forward's kernels, attention_backward.cu the backward's."""
    from cuda_kernels import build
    return [k for name in K5.KERNEL_FILES for k in build.ptxas_report(CU.with_name(name), "90a")]


@needs_nvcc
def test_no_kernel_spills_on_sm90a(ptxas):
    # The tensor-core kernels hold O (or dK and dV, or dQ), Q fragments and a tile of scores
    # in registers: a spill would turn them into local-memory traffic in the inner loop.
    names = [k.get("kernel", k["mangled"]) for k in ptxas]
    for kernel in ("attn_fwd_mma_kernel", "attn_bwd_dkdv_mma_kernel", "attn_bwd_dq_mma_kernel"):
        found = [n for n in names if kernel in n]
        # fp16/bf16 x v3/v4 x (D 16..128, and D 64, 128 with RoPE)
        assert len(found) == 2 * 2 * (4 + 2), (kernel, found)
    # v5's forward (v5 runs v4's backward kernels: no instantiation of its own)
    assert sum("attn_fwd_v5_kernel" in n for n in names) == 2 * (4 + 2), names
    assert sum("attn_fwd_v6_kernel" in n for n in names) == 2 * 2, names  # fp16/bf16 x D 64, 128
    # v7's fused backward (D 16..128, and 64, 128 with RoPE) and its dq conversion (x RoPE)
    assert sum("attn_bwd_fused_kernel" in n for n in names) == 2 * (4 + 2), names
    assert sum("attn_bwd_dq_convert_kernel" in n for n in names) == 2 * 2, names
    for kernel in ("attn_fwd_v2_kernel", "attn_bwd_dkdv_cc_kernel", "attn_bwd_dq_cc_kernel"):
        assert sum(kernel in n for n in names) == 3 * 6 * 2, kernel  # 3 dtypes x tiles 8..256 x rope
    for k in ptxas:
        assert k["spill_stores"] == 0 and k["spill_loads"] == 0, k
        assert k["stack_bytes"] == 0, k  # a register array indexed at run time lives in local memory


# ------------------------------------------------------------------------------ GPU ---

def _agree(runs, version):
    """Two runs' (dq, dk, dv[, out]) agree bit for bit; at a version that adds dq with atomics
    (K5.ATOMIC_DQ_VERSIONS: the order of fp32 adds varies) dq agrees to its dtype's rounding
    (a lost or doubled add would be a whole term off), everything else bit for bit."""
    first, second = runs
    for i, (x, y) in enumerate(zip(first, second)):
        if i == 0 and version in K5.ATOMIC_DQ_VERSIONS:
            torch.testing.assert_close(x, y, rtol=2 ** -7, atol=1e-3 * float(x.abs().max()))
        else:
            assert torch.equal(x, y), (version, i)


def _args(B, H, Nq, Nk, D, dtype, causal=False, scale=None, seed=0, H_kv=None, alignment=None,
          kv_lens=None):
    g = torch.Generator(device="cpu").manual_seed(seed)
    dev = torch.device("cuda")
    H_kv = H if H_kv is None else H_kv
    args = dict(q=cards.randn((B, H, Nq, D), g, dtype, dev), k=cards.randn((B, H_kv, Nk, D), g, dtype, dev),
                v=cards.randn((B, H_kv, Nk, D), g, dtype, dev), causal=causal, scale=scale)
    if alignment is not None:
        args["causal_alignment"] = alignment
    if kv_lens is not None:
        args["kv_lens"] = torch.tensor(kv_lens, device=dev)
    return args


def _passes(args, version, monkeypatch):
    monkeypatch.setenv(ENV, str(version))
    r = check_args("attention", "cuda", args)
    assert r.passed, f"v{version}: {r.summary()}"


@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_harness_tiny_both_layouts_and_variants(version, dtype, monkeypatch):
    monkeypatch.setenv(ENV, str(version))
    results = check("attention", "cuda", dtype=dtype, device="cuda", size="tiny")
    variants = cards.get("attention").variants  # gqa (odd head sizes: v2 there), decode (v3-v5 too)
    assert {r.layout for r in results} == set(cards.LAYOUTS) and len(results) == 2 * len(variants)
    for r in results:
        assert r.passed, f"v{version}: {r.summary()}"


# (B, H, Nq, Nk, D): lengths that are multiples of no tile, every head dim, Nq != Nk
SHAPES = [(1, 2, 1, 1, 16), (2, 3, 17, 17, 32), (1, 2, 100, 100, 64), (1, 1, 1023, 1023, 128),
          (2, 2, 37, 70, 64), (1, 2, 130, 33, 128), (3, 1, 64, 200, 16), (1, 3, 257, 257, 32)]


@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_odd_lengths_head_dims_and_unequal_lengths(version, dtype, shape, causal, monkeypatch):
    B, H, Nq, Nk, D = shape
    _passes(_args(B, H, Nq, Nk, D, dtype, causal, seed=Nq + 7 * Nk + D), version, monkeypatch)


# The grown cases at every version (a head size v3-v5 have no kernel for runs v2 there,
# $LEVELS_CUDA_VERSION_ATTENTION being a default; and the default):
# (B, H, H_kv, Nq, Nk, D, causal, alignment, kv_lens)
GROWN = [(2, 4, 1, 33, 33, 64, True, None, None),            # multi-query
         (2, 6, 2, 100, 100, 128, False, None, None),        # grouped, 3 heads a group
         (1, 2, 2, 40, 40, 8, True, None, None),             # the smallest tile
         (2, 2, 1, 70, 70, 80, True, None, None),            # padded to 128
         (1, 2, 1, 50, 50, 96, False, None, None),
         (2, 2, 2, 37, 37, 200, True, None, None),           # the 256 tile, 8 threads a row
         (1, 4, 4, 33, 33, 256, False, None, None),
         (2, 4, 2, 1, 300, 64, True, "bottom_right", [300, 17]),    # decoding one token
         (2, 4, 4, 130, 90, 64, True, "bottom_right", None),        # queries with no key
         (2, 2, 2, 90, 130, 32, True, "top_left", None),
         (3, 4, 1, 20, 77, 128, False, None, [0, 77, 40]),          # a length of 0
         # the tensor cores' tiles, skipping and 128-row blocks around a shifted diagonal
         (2, 8, 2, 300, 700, 64, True, "bottom_right", [700, 450]),
         (1, 4, 4, 257, 129, 128, True, "bottom_right", [129]),     # 128 queries see no key
         (2, 2, 2, 200, 77, 16, True, "top_left", [77, 5])]


@pytest.mark.gpu
@pytest.mark.parametrize("version", [*VERSIONS, None])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("case", GROWN, ids=lambda c: "-".join(map(str, c[:7])) + f"-{c[7]}-{c[8]}")
def test_grown_cases(version, dtype, case, monkeypatch):
    B, H, H_kv, Nq, Nk, D, causal, alignment, lens = case
    args = _args(B, H, Nq, Nk, D, dtype, causal, seed=Nq + D, H_kv=H_kv, alignment=alignment,
                 kv_lens=lens)
    if version is None:
        monkeypatch.delenv(ENV, raising=False)
        r = check_args("attention", "cuda", args)
        assert r.passed, r.summary()
    else:
        _passes(args, version, monkeypatch)


# Grouped-query and multi-query heads at every version, the tensor cores' included (Llama's
# gpu preset: 12 heads, 4 K/V heads, D 64, causal): (B, H, H_kv, Nq, Nk, D, causal)
GQA = [(2, 12, 4, 100, 100, 64, True),    # Llama's preset, ragged length
       (1, 4, 1, 77, 77, 128, True),      # multi-query, D 128 (v5's 32-key tiles)
       (2, 6, 2, 33, 90, 32, False),      # Nq != Nk (not causal)
       (1, 8, 2, 200, 200, 16, False)]


@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("case", GQA, ids=lambda c: "x".join(map(str, c[:6])) + ("-causal" if c[6] else ""))
def test_grouped_query_heads_at_every_version(version, dtype, case, monkeypatch):
    B, H, H_kv, Nq, Nk, D, causal = case
    _passes(_args(B, H, Nq, Nk, D, dtype, causal, seed=H + Nq, H_kv=H_kv), version, monkeypatch)


# RoPE fused (ROPE_API.md) at every version: q and k rotated as the kernels read them, dq
# and dk turned back before the store. (B, H, H_kv, Nq, Nk, D, causal, alignment)
ROPE = [(2, 12, 4, 100, 100, 64, True, "top_left"),     # Llama's preset, ragged length
        (1, 2, 2, 33, 33, 128, True, "top_left"),
        (2, 4, 2, 20, 57, 32, False, "bottom_right"),   # queries at table rows 37..56
        (2, 4, 2, 40, 150, 64, True, "bottom_right"),   # rows 110..149, shifted diagonal
        (1, 2, 1, 70, 70, 16, False, "top_left")]


def _rope_tables(P, D, dtype, seed):
    """cos, sin (P, D/2) of Llama's angles (position x 10000^(-2i/D)), as row slices of a
    wider table (row stride D, starting at row 3): the layout a precomputed table gives."""
    pos = torch.arange(P + 3, dtype=torch.float64)[:, None]
    theta = pos * 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    theta = theta + torch.rand(theta.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    wide = torch.cat((theta.cos(), theta.sin()), -1).to(device="cuda", dtype=dtype)  # (P + 3, D)
    return wide[3:, :D // 2], wide[3:, D // 2:]


def _rope_reference(q, k, v, cos, sin, interleaved, causal, off):
    """float64: attention(rope(q), rope(k), v) with the queries at table rows off.., and its
    gradients with respect to q, k, v (levels.native's math)."""
    from levels import native

    leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    c, s = cos.double(), sin.double()
    Nq, Nk = q.shape[2], k.shape[2]
    rq = native.rope_math(leaves[0], c[off:off + Nq], s[off:off + Nq], interleaved)
    rk = native.rope_math(leaves[1], c[:Nk], s[:Nk], interleaved)
    return leaves, native.attention_math(rq, rk, leaves[2], causal, q.shape[-1] ** -0.5, off > 0 and causal)


@pytest.mark.gpu
@pytest.mark.parametrize("version", ROPE_VERSIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("case", ROPE, ids=lambda c: "x".join(map(str, c[:6])) + f"-{c[6]}-{c[7]}")
def test_rope_fused_at_every_version(version, dtype, interleaved, case, monkeypatch):
    import levels
    from equivalence.check import compare, poisoned_allocations
    from equivalence.tolerances import tolerance

    B, H, H_kv, Nq, Nk, D, causal, alignment = case
    a = _args(B, H, Nq, Nk, D, dtype, causal, seed=Nq + D + interleaved, H_kv=H_kv)
    off = Nk - Nq if alignment == "bottom_right" else 0
    cos, sin = _rope_tables(max(Nk, Nq + off) + 4, D, dtype, seed=D)
    leaves = [a[n].detach().clone().requires_grad_(True) for n in "qkv"]
    dout = torch.randn(B, H, Nq, D, device="cuda", dtype=dtype)
    monkeypatch.setenv(ENV, str(version))
    with poisoned_allocations():
        out = levels.get("cuda").attention(*leaves, causal, None, alignment, None, rope=(cos, sin, interleaved))
        out.backward(dout)
    ref_leaves, want = _rope_reference(*leaves, cos, sin, interleaved, causal, off)
    want.backward(dout.double())
    for name, got, exp in [("out", out, want)] + [
            (f"grad_{n}", x.grad, y.grad) for n, x, y in zip("qkv", leaves, ref_leaves)]:
        c = compare(name, got, exp.detach(), tolerance(dtype), dtype)
        assert c.ok, f"v{version}: {c}"


@pytest.mark.gpu
@pytest.mark.parametrize("version", ROPE_VERSIONS)
def test_rope_backward_is_deterministic_and_tables_get_no_gradient(version):
    a = _args(2, 8, 150, 150, 64, torch.bfloat16, True, seed=6, H_kv=2)
    cos, sin = _rope_tables(160, 64, torch.bfloat16, seed=1)
    runs = []
    for _ in range(2):
        q, k, v = (a[n].detach().clone().requires_grad_(True) for n in "qkv")
        K5.attention(q, k, v, True, None, version=version, rope_cos=cos, rope_sin=sin).float().sum().backward()
        runs.append((q.grad, k.grad, v.grad))
    _agree(runs, version)
    assert cos.grad is None and sin.grad is None


@pytest.mark.gpu
def test_rope_changes_the_result():
    # the tables reach the kernels (an identity rotation would pass the tests above only if
    # the reference ignored them too): cos 1, sin 0 is no rope; real angles are not
    a = _args(1, 2, 40, 40, 64, torch.bfloat16, True, seed=8)
    cos, sin = _rope_tables(40, 64, torch.bfloat16, seed=2)
    plain = K5.attention(a["q"], a["k"], a["v"], True)
    same = K5.attention(a["q"], a["k"], a["v"], True, rope_cos=torch.ones_like(cos), rope_sin=torch.zeros_like(sin))
    turned = K5.attention(a["q"], a["k"], a["v"], True, rope_cos=cos, rope_sin=sin)
    assert torch.allclose(plain, same, rtol=1e-2, atol=1e-2)
    assert not torch.allclose(plain, turned, rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("shape_q,shape_k", [((0, 2, 5, 64), (0, 1, 7, 64)), ((2, 2, 0, 64), (2, 2, 7, 64)),
                                             ((2, 2, 5, 64), (2, 2, 0, 64))])
def test_empty_inputs_as_pytorch(shape_q, shape_k):
    q = torch.randn(shape_q, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(shape_k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(shape_k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = K5.attention(q, k, v, False, None)
    assert out.shape == q.shape and not out.any()
    out.float().sum().backward()
    for t in (q, k, v):
        assert t.grad.shape == t.shape and not t.grad.any()


@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
def test_grouped_backward_is_deterministic(version):
    _hopper_or_skip(version)
    # dK/dV of a K/V head sum its group's query heads in a loop inside one block: no atomics
    a = _args(2, 8, 200, 200, 64, torch.bfloat16, True, seed=4, H_kv=2)
    runs = []
    for _ in range(2):
        q, k, v = (a[n].detach().clone().requires_grad_(True) for n in "qkv")
        K5.attention(q, k, v, True, None, version=version).float().sum().backward()
        runs.append((q.grad, k.grad, v.grad))
    _agree(runs, version)


@pytest.mark.gpu
@pytest.mark.parametrize("version", K5.TENSOR_CORE_VERSIONS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("shape", [(4, 8, 600, 64), (2, 16, 577, 128)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_eight_warp_blocks(version, dtype, shape, causal, monkeypatch):
    # The tensor-core kernels take 128-row blocks (8 warps at v3/v4, 4 warps of 32 rows at
    # v5) once B*H*ceil(N/128) blocks fill every SM (132 on an H100), 64-row blocks below
    # that (every other test's shapes): the shapes here are the former.
    B, H, N, D = shape
    assert B * H * -(-N // 128) >= torch.cuda.get_device_properties(0).multi_processor_count
    _passes(_args(B, H, N, N, D, dtype, causal, seed=N + D), version, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("layout", ["packed", "transposed", "offset", "sliced"])
def test_layouts(version, dtype, layout, monkeypatch):
    B, H, N, D = 2, 3, 77, 64
    args = _args(B, H, N, N, D, dtype, causal=True, scale=0.3, seed=11)
    if layout == "packed":  # the fused-qkv layout of the spec's `strided`: read in place
        args = cards.get("attention").module.strided(args)
    elif layout == "transposed":  # D strided: copied (autograd.cpp's attention_operand)
        for n in "qkv":
            args[n] = args[n].transpose(-1, -2).contiguous().transpose(-1, -2)
    elif layout == "offset":  # one element off 16 bytes: copied at v3/v4, read as is below
        for n in "qkv":
            buf = torch.full((args[n].numel() + 8,), float("nan"), device="cuda", dtype=dtype)
            view = buf[1:1 + args[n].numel()].view(args[n].shape)
            view.copy_(args[n])
            args[n] = view
    else:  # a head slice of a wider tensor, aligned rows: read in place
        for n in "qkv":
            buf = torch.full((B, H + 2, N, D + 8), float("nan"), device="cuda", dtype=dtype)
            buf[:, 1:H + 1, :, 8:] = args[n]
            args[n] = buf[:, 1:H + 1, :, 8:]
    _passes(args, version, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
def test_more_heads_than_a_grid_dimension_holds(version, monkeypatch):
    # B*H = 70000 > 65535: the (batch, head) index lives in gridDim.x with the blocks
    _passes(_args(2, 35000, 3, 3, 16, torch.bfloat16, causal=True, seed=5), version, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
def test_lse_is_the_base_2_log_sum_exp(version):
    a = _args(2, 3, 70, 70, 64, torch.float32, causal=True, seed=3)
    q, k, v = a["q"], a["k"], a["v"]
    out, lse = K5._ops().attention_fwd(q, k, v, True, 0.125, version)
    s = (q.double() @ k.double().transpose(-1, -2)) * 0.125
    s = s.masked_fill(torch.ones(70, 70, device="cuda", dtype=torch.bool).triu(1), float("-inf"))
    want = torch.logsumexp(s, -1) / torch.log(torch.tensor(2.0, dtype=torch.float64))
    assert out.shape == q.shape and out.is_contiguous() and lse.shape == (2, 3, 70)
    torch.testing.assert_close(lse.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
def test_expanded_upstream_gradient_and_determinism(version):
    _hopper_or_skip(version)
    # `.sum().backward()` hands the backward a stride-0 gradient (copied by _operand); no
    # atomics anywhere but in v7's dq, so two runs agree bit for bit (_agree).
    a = _args(2, 4, 300, 300, 64, torch.bfloat16, causal=True, seed=9)
    runs = []
    for _ in range(2):
        q, k, v = (a[n].detach().clone().requires_grad_(True) for n in "qkv")
        out = K5.attention(q, k, v, True, None, version=version)
        out.float().sum().backward()
        runs.append((q.grad, k.grad, v.grad, out.detach()))
    _agree(runs, version)


@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=lambda d: str(d)[6:])
def test_opcheck(version, dtype):
    _hopper_or_skip(version if dtype != torch.float32 else 0)
    ops = K5._ops()
    D = 64 if version == K5.HOPPER_VERSION and dtype != torch.float32 else 32  # v6: D 64 or 128
    a = _args(2, 2, 40, 40, D, dtype, seed=version)
    q, k, v = a["q"], a["k"], a["v"]
    torch.library.opcheck(ops.attention_fwd, (q, k, v, False, 0.2, version))
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    # the op a call is (autograd.cpp), with its C++ autograd traced by AOT autograd
    torch.library.opcheck(ops.attention, (*leaves, True, 0.2, version))
    out, lse = ops.attention_fwd(q, k, v, True, 0.2, version)
    dout = torch.randn_like(out)
    torch.library.opcheck(ops.attention_bwd, (dout, q, k, v, out, lse, True, 0.2, version))


@pytest.mark.gpu
@pytest.mark.parametrize("version", ROPE_VERSIONS)
def test_opcheck_with_grouped_heads_and_rope(version):
    ops = K5._ops()
    a = _args(2, 4, 40, 40, 64, torch.bfloat16, seed=version, H_kv=2)
    q, k, v = a["q"], a["k"], a["v"]
    cos, sin = _rope_tables(48, 64, torch.bfloat16, seed=3)
    rope = (cos, sin, True, 0)
    torch.library.opcheck(ops.attention_fwd, (q, k, v, True, 0.2, version, False, None, *rope))
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    torch.library.opcheck(ops.attention, (*leaves, True, 0.2, version, False, None, *rope))
    out, lse = ops.attention_fwd(q, k, v, True, 0.2, version, False, None, *rope)
    torch.library.opcheck(ops.attention_bwd, (torch.randn_like(out), q, k, v, out, lse, True, 0.2, version,
                                              False, None, *rope))


@pytest.mark.gpu
def test_compiled_graph_calls_the_level_5_kernels():
    import levels

    level = levels.get("cuda")
    a = _args(2, 4, 96, 96, 64, torch.bfloat16, seed=2)
    fn = torch.compile(lambda q, k, v: level.attention(q, k, v, True), fullgraph=True)
    assert torch.equal(fn(a["q"], a["k"], a["v"]), level.attention(a["q"], a["k"], a["v"], True))


BAD_VERSION = """
import torch
import cuda_kernels.attention as K5
q = torch.randn(1, 2, 8, 16, device="cuda", dtype=torch.bfloat16)
try:
    K5._ops().attention_fwd(q, q, q, False, 0.25, 9)
except RuntimeError as exc:
    print("RAISED", exc)
"""


@pytest.mark.gpu
def test_a_bad_version_raises_cleanly():
    """Past the Python checks (the op called directly), the launcher's refusal becomes a
    RuntimeError naming op and version. In a subprocess: a crash while raising must fail
    this test, not end the session."""
    proc = subprocess.run([sys.executable, "-c", BAD_VERSION], capture_output=True, text=True, timeout=900,
                          cwd=str(Path(K5.__file__).resolve().parents[1]))
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    assert re.search(r"RAISED .*attention_fwd \(version 9\).*does not exist", proc.stdout), proc.stdout + proc.stderr
    with pytest.raises(ValueError, match="argument 'version' must be one of"):
        K5.attention(torch.zeros(1, 1, 4, 16, device="cuda"), torch.zeros(1, 1, 4, 16, device="cuda"),
                     torch.zeros(1, 1, 4, 16, device="cuda"), version=0)


# ------------------------------------------------------------------- GPU: version 6 ---
# wgmma: runs on sm_90 only (elsewhere its tests skip, but for the refusal's). The harness
# (check_args) compares out and the gradients of q, k, v (the backward runs v4's kernels on
# v6's out and lse) with float64, every allocation NaN-poisoned, so an unwritten row fails.

def _hopper_or_skip(version=6):
    from cuda_kernels import versions
    if version == K5.HOPPER_VERSION and not versions.on_hopper():
        pytest.skip("version 6 (wgmma) needs an sm_90 GPU (H100, H200)")


# (B, H, H_kv, Nq, Nk, causal, alignment, kv_lens): lengths that are multiples of no tile,
# both diagonals, per-batch lengths, grouped heads, and the 2-warpgroup blocks (B*H*ceil(N/128)
# >= the SMs) beside the 1-warpgroup ones
V6_CASES = [(2, 3, 3, 77, 77, False, None, None),
            (1, 2, 2, 1000, 1000, True, None, None),
            (1, 2, 1, 1025, 1025, False, None, None),                  # multi-query, 8 tiles + 1 key
            (2, 4, 2, 1025, 1025, True, None, None),
            (2, 4, 2, 130, 300, True, "bottom_right", [300, 171]),
            (2, 2, 2, 300, 130, True, "top_left", None),
            (2, 4, 4, 257, 129, True, "bottom_right", [129, 0]),      # rows with no key, a length 0
            (3, 6, 2, 200, 333, False, None, [333, 1, 250]),
            (1, 4, 4, 1, 700, True, "bottom_right", None),            # decoding one token
            (2, 16, 4, 600, 600, True, None, None),                   # 2 warpgroups a block
            (2, 16, 16, 577, 577, False, None, None)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("D", K5.HOPPER_HEAD_DIMS)
@pytest.mark.parametrize("case", V6_CASES, ids=lambda c: "x".join(map(str, c[:5])) + f"-{c[5]}-{c[6]}-{c[7]}")
def test_version_6_forward_and_backward(dtype, D, case, monkeypatch):
    _hopper_or_skip()
    B, H, H_kv, Nq, Nk, causal, alignment, lens = case
    args = _args(B, H, Nq, Nk, D, dtype, causal, seed=Nq + Nk + D, H_kv=H_kv, alignment=alignment, kv_lens=lens)
    monkeypatch.setenv(ENV, "6")
    assert K5.pick_version(None, args["q"], args["k"], causal, args.get("kv_lens")) == 6  # v6, no fallback
    _passes(args, 6, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("D", K5.HOPPER_HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_version_6_lse_and_out_against_float64(D, causal):
    # What the backward takes from the forward: lse in base 2, and out; a row past Nk's
    # diagonal sees no key (bottom-right, Nq > Nk): out 0 and lse +inf, as v4/v5.
    _hopper_or_skip()
    a = _args(2, 3, 200, 150, D, torch.bfloat16, seed=D + causal)
    q, k, v = a["q"], a["k"], a["v"]
    out, lse = K5._ops().attention_fwd(q, k, v, causal, 0.1, 6, True)
    s = (q.double() @ k.double().transpose(-1, -2)) * 0.1
    if causal:  # bottom-right: query i sees keys j <= i + 150 - 200
        s = s.masked_fill(torch.ones(200, 150, device="cuda", dtype=torch.bool).triu(150 - 200 + 1), float("-inf"))
    want_lse = torch.logsumexp(s, -1) / torch.log(torch.tensor(2.0, dtype=torch.float64))
    want_out = torch.nan_to_num(torch.softmax(s, -1)) @ v.double()
    seen = torch.isfinite(want_lse)
    assert torch.equal(torch.isinf(lse), ~seen) and (lse[~seen] > 0).all()
    torch.testing.assert_close(lse.double()[seen], want_lse[seen], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out.double(), want_out, rtol=2e-2, atol=2e-2)
    assert not out[~seen].any()


@pytest.mark.gpu
def test_version_6_asked_for_off_hopper_raises():
    from cuda_kernels import versions
    if versions.on_hopper():
        pytest.skip("an sm_90 GPU runs version 6 (the tests above)")
    q = torch.randn(1, 2, 40, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match=r"version 6.*wgmma: sm_90"):
        K5.attention(q, q, q, True, None, version=6)


# ------------------------------------------------------------------- GPU: version 7 ---
# The fused backward (one kernel per key block, dQ added into fp32 with atomics, then
# converted) at every head size it takes, on v6's cases: lengths of no tile's multiple, both
# diagonals, kv_lens (a length 0, rows that see no key), grouped and multi-query heads,
# decoding, and the 8-warp blocks. The harness checks out, dq, dk and dv against float64 with
# NaN-poisoned allocations (an unwritten row of dq or a missed atomic fails). Strided layouts,
# odd N, RoPE, fp32 (the CUDA-core backward) and determinism of dk/dv run with every version
# above (VERSIONS, ROPE_VERSIONS, TENSOR_CORE_VERSIONS include 7).

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("D", K5.HEAD_DIMS)
@pytest.mark.parametrize("case", V6_CASES, ids=lambda c: "x".join(map(str, c[:5])) + f"-{c[5]}-{c[6]}-{c[7]}")
def test_version_7_forward_and_backward(dtype, D, case, monkeypatch):
    B, H, H_kv, Nq, Nk, causal, alignment, lens = case
    args = _args(B, H, Nq, Nk, D, dtype, causal, seed=Nq + Nk + D + 1, H_kv=H_kv, alignment=alignment,
                 kv_lens=lens)
    monkeypatch.setenv(ENV, "7")
    assert K5.pick_version(None, args["q"], args["k"], causal, args.get("kv_lens")) == 7  # no fallback
    _passes(args, 7, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("D", K5.HEAD_DIMS)
def test_version_7_forward_is_version_6_at_128_on_hopper_else_version_5(D):
    # attention.cu's forward_with: v7 runs v6's forward on sm_90 at D = 128 without RoPE and
    # v5's otherwise: the same kernel, so the same bits.
    from cuda_kernels import versions
    a = _args(2, 4, 300, 300, D, torch.bfloat16, seed=D)
    ops = K5._ops()
    want = 6 if D == 128 and versions.on_hopper() else 5
    got = ops.attention_fwd(a["q"], a["k"], a["v"], True, 0.1, 7)
    same = ops.attention_fwd(a["q"], a["k"], a["v"], True, 0.1, want)
    assert torch.equal(got[0], same[0]) and torch.equal(got[1], same[1])


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_version_7_gradients_match_the_deterministic_backward(causal):
    # The same lse and out through v7's fused backward and v4's two kernels: dk and dv are the
    # same sums in another order of query tiles (the staggered start), dq the same terms added
    # by atomics; both within a few 16-bit roundings of each other at a shape with many key
    # blocks adding into each dQ row (Nk / 128 = 9 atomic adds each, 8-warp blocks).
    a = _args(2, 16, 1100, 1100, 128, torch.bfloat16, causal, seed=29)
    ops = K5._ops()
    q, k, v = a["q"], a["k"], a["v"]
    out, lse = ops.attention_fwd(q, k, v, causal, 0.09, 4)
    dout = torch.randn_like(out)
    new = ops.attention_bwd(dout, q, k, v, out, lse, causal, 0.09, 7)
    old = ops.attention_bwd(dout, q, k, v, out, lse, causal, 0.09, 4)
    for name, x, y in zip(("dq", "dk", "dv"), new, old):
        assert torch.isfinite(x).all(), name
        err = float((x.double() - y.double()).norm() / y.double().norm())
        assert err < 1e-2, (name, err)
