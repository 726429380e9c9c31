"""Level 4 (Triton): the MLP and its GEMM (triton_kernels/gemm.py), forward and backward.

Without a GPU these run in Triton's CPU interpreter (slow: sizes stay tiny). Every case is
compared with the float64 reference of equivalence/cards at the fixed tolerance of its
dtype, with uninitialized memory poisoned by NaN. @pytest.mark.gpu tests repeat
this on CUDA at fp16/bf16/fp32 with odd sizes.
"""

from __future__ import annotations

import pytest
import torch

# First: without a GPU this sets TRITON_INTERPRET=1, which must happen before anything
# imports triton (triton.language's own @jit helpers, e.g. tl.max's combine function, are
# built at import time and only work in the interpreter if it is on by then).
import levels.triton as L4  # isort: skip
from equivalence import cards
from equivalence.check import check, check_args, compare
from equivalence.tolerances import tolerance

pytest.importorskip("triton")

COMPONENT = "mlp"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _args(component, shape, dtype, seed=0, **variant):
    g = torch.Generator().manual_seed(seed)
    args = cards.get(component).module.make_args(shape, dtype, torch.device(DEVICE), g)
    args.update(variant)
    return args


def _passes(component, args):
    """The harness's own check (equivalence.check.check_args) on these exact arguments:
    outputs, updated buffers and every gradient against the float64 reference, poisoned."""
    r = check_args(component, "triton", args)
    assert r.passed, r.summary()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_harness_tiny(dtype):
    results = check(COMPONENT, "triton", dtype=dtype, device=DEVICE, size="tiny")
    assert len(results) == len(cards.get(COMPONENT).variants) * len(cards.LAYOUTS)
    for r in results:
        assert r.status == "pass", f"{r.variant}: {r.status} {r.reason} {r.worst}"


def test_float64_is_refused_by_name():
    args = _args(COMPONENT, cards.get(COMPONENT).sizes["tiny"], torch.float64)
    with pytest.raises(TypeError, match=rf"{COMPONENT}: argument 'x'.*float64"):
        getattr(L4, COMPONENT)(**args)


def test_mlp_odd_sizes_3d_input():
    _passes("mlp", _args("mlp", dict(rows=(3, 11), K=17, hidden=45, N=9), torch.float32, seed=3))


def _pinned(config):
    """triton_kernels.mlp.mlp with every GEMM pinned to `config` (its `config` argument),
    as a function the harness checks like a level (check_args(..., fn=))."""
    from triton_kernels import mlp as kernels

    def mlp(x, w1, b1, w2, b2):
        return kernels.mlp(x, w1, b1, w2, b2, config=config)
    return mlp


def _passes_pinned(args, config):
    r = check_args(COMPONENT, args, fn=_pinned(config))
    assert r.passed, r.summary()


@pytest.mark.parametrize("split", [1, 2])
def test_mlp_with_subtiled_epilogue(split):
    # SPLIT_N=2 (the epilogue on two half tiles) is only ever picked by autotune on a GPU;
    # pinning it here puts its reshape/split path and every epilogue (GELU+save, GELU',
    # none) through the interpreter and the harness.
    cfg = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=2, SPLIT_N=split, num_warps=4,
               num_stages=1 if DEVICE == "cpu" else 3)
    _passes_pinned(_args("mlp", dict(rows=(37,), K=40, hidden=72, N=33), torch.float32, seed=split),
                   cfg)


@pytest.mark.parametrize("splits", [2, 3])
def test_mlp_with_split_k(splits):
    # Split-K is only picked by the size rule on a GPU (few output tiles, long K); pinned
    # here, the partial sums and the second kernel's epilogue (bias, GELU+save, GELU', none)
    # go through the interpreter and the whole harness, forward and backward. K = 200 and
    # hidden = 72: slices of 96 and 32 rows of K with a masked tail.
    cfg = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=1, SPLIT_K=splits, num_warps=4,
               num_stages=1 if DEVICE == "cpu" else 3)
    args = _args("mlp", dict(rows=(2, 5), K=200, hidden=72, N=33), torch.float32, seed=splits)
    _passes_pinned(args, cfg)
    _passes_pinned(cards.get("mlp").strided(args), cfg)  # every operand a view: strides, offsets


def test_a_pinned_tile_is_an_argument_not_a_setting():
    # Pinning one call's tile changes nothing for the next call without one: the size rule
    # serves it (there is no module setting left to forget to restore).
    from triton_kernels import gemm

    a = torch.randn(20, 40, device=DEVICE)
    b = torch.randn(40, 24, device=DEVICE)
    cfg = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=1, SPLIT_K=2, num_warps=4,
               num_stages=1 if DEVICE == "cpu" else 3)
    pinned = gemm.gemm(a, b, config=cfg)
    plain = gemm.gemm(a, b)
    want = a.double() @ b.double()
    for got in (pinned, plain):
        assert float((got.double() - want).norm() / want.norm()) < 1e-5
    assert not hasattr(gemm, "CONFIG_OVERRIDE")


def test_gemm_split_k_comes_from_the_problem_size():
    from triton_kernels.gemm import NARROW_TILE, MID_TILE, SMALL_M, _as_dict, small_m_tile, \
        split_k_for
    decode = small_m_tile(8, 4096)
    assert (decode["BLOCK_M"], decode["BLOCK_N"], decode["BLOCK_K"]) == (16, 64, 128)
    assert small_m_tile(40, 768)["BLOCK_M"] == 64 and small_m_tile(SMALL_M, 4096)["BLOCK_M"] == 64
    assert small_m_tile(8, 256)["BLOCK_K"] == 64  # K shorter than two long steps
    # Llama-2 7B decode, M = 8: W1's 172 tiles fill 132 SMs, no split
    assert split_k_for(8, 11008, 4096, decode, sms=132) == 1
    # ...W2's 64 tiles do not: 3 slices of K = 11008 (every SM gets a program)
    assert split_k_for(8, 4096, 11008, small_m_tile(8, 11008), sms=132) == 3
    # a short K is not cut below MIN_K_PER_SPLIT: GPT-2 decode's W1 (K = 768) stays whole
    assert split_k_for(8, 3072, 768, small_m_tile(8, 768), sms=132) == 1
    assert split_k_for(8, 768, 3072, small_m_tile(8, 3072), sms=132) == 3
    # full tiles never split (measured: the round trip costs more): GPT-2 prefill's W2
    assert split_k_for(1000, 768, 3072, _as_dict(NARROW_TILE), sms=132) == 1
    # enough tiles already: no split, whatever K is
    assert split_k_for(8192, 16384, 4096, _as_dict(MID_TILE), sms=132) == 1
    assert split_k_for(16, 132 * 64, 1 << 20, decode, sms=132) == 1
    assert split_k_for(0, 768, 4096, decode, sms=132) == 1  # an empty batch: no tiles at all


def test_gemm_rejects_mismatched_operands():
    from triton_kernels.gemm import gemm
    a = torch.randn(4, 5, device=DEVICE)
    with pytest.raises(ValueError, match=r"gemm: argument 'b' must be of shape \(5, 3\)"):
        gemm(a, torch.randn(6, 3, device=DEVICE)[:5].t().t()[:4])
    with pytest.raises(ValueError, match="activation"):
        gemm(a, torch.randn(5, 3, device=DEVICE), activation="relu")


def test_gemm_even_k_comes_from_each_config(monkeypatch):
    # EVEN_K drops the K mask from the main loop: it must follow the BLOCK_K of the config
    # launched, the autotuner's candidates included (it used to assume 64 for every config).
    from triton_kernels import gemm as G
    from triton_kernels import launch as L
    seen = []
    # every `kernel[grid](...)` of a @fast_launch kernel goes through launch.launch
    monkeypatch.setattr(L, "launch", lambda kernel, grid, *a, **kw: seen.append(kw["EVEN_K"]))
    a, b = torch.zeros(8, 96), torch.zeros(96, 16)
    c = torch.zeros(8, 16)
    for block_k in (32, 64):
        G._run((a, b, c, c, c), (False, G.EPI_NONE, False, "ieee"),
               dict(G._FIXED_INTERPRETED, BLOCK_K=block_k), 1)
    assert seen == [True, False]


def test_gemm_tile_comes_from_the_problem_size():
    # Rounds of programs (one per SM) weighed by tile size over tile rate: the big tile
    # where its tiles fill whole rounds or fit in one, a smaller one where the big tiles
    # would leave a last round mostly idle (the cases measured by scripts/sweep_gemm_tiles.py).
    from triton_kernels.gemm import BIG_TILE, MID_TILE, NARROW_TILE, tile_for
    assert tile_for(8192, 16384, sms=132) is BIG_TILE  # the MLP bench: 32 full rounds
    assert tile_for(8192, 3072, sms=132) is BIG_TILE  # GPT-2 small fc1: 768 tiles, 5.8 rounds
    assert tile_for(8192, 768, sms=132) is MID_TILE  # fc2: 192 big = 1.45 rounds, 384 = 2.9
    assert tile_for(768, 3072, sms=132) is BIG_TILE  # weight gradient: 72 big tiles, 1 round
    assert tile_for(128 * 12, 256 * 11, sms=132) is BIG_TILE  # exactly one round
    assert tile_for(128 * 12, 256 * 11 + 1, sms=132) is MID_TILE  # one tile into a 2nd round
    assert tile_for(1000, 768, sms=132) is NARROW_TILE  # 48 square tiles: a quarter of the GPU
    assert tile_for(1000, 3072, sms=132) is BIG_TILE  # 96 big tiles in one round


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows,K,hidden,N", [((1000,), 512, 1536, 257), ((7, 33), 100, 300, 65),
                                             ((2048,), 1024, 4096, 1024)])
def test_mlp_gpu(dtype, rows, K, hidden, N):
    _passes("mlp", _args("mlp", dict(rows=rows, K=K, hidden=hidden, N=N), dtype, seed=K))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gemm_gpu_transposed_views_and_accumulate(dtype):
    from triton_kernels.gemm import gemm
    a = torch.randn(1000, 320, device="cuda", dtype=dtype)
    w = torch.randn(200, 320, device="cuda", dtype=dtype) * 0.05
    ref = a.double() @ w.double().t()
    out = gemm(a, w.t())
    assert compare("gemm", out, ref, tolerance(dtype), dtype).ok
    c = torch.randn(1000, 200, device="cuda", dtype=dtype)
    ref2 = c.double() + ref
    gemm(a, w.t(), out=c, accumulate=True)
    assert compare("gemm accumulate", c, ref2, tolerance(dtype), dtype).ok
