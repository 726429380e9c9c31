"""Level 4 (Triton), part A: layer_norm, mlp and conv_bn, forward and backward.

Without a GPU these run in Triton's CPU interpreter (slow: sizes stay tiny). Every case is
compared with the float64 reference of equivalence/cards at the fixed tolerance of its
dtype — outputs, every gradient and the running statistics conv_bn updates — with
uninitialized memory poisoned by NaN. @pytest.mark.gpu tests repeat this on CUDA at
fp16/bf16/fp32 with odd sizes (widths 1023/4097, row counts that are no multiple of a tile).
"""

from __future__ import annotations

import pytest
import torch

# First: without a GPU this sets TRITON_INTERPRET=1 before anything imports triton.
import levels.triton as L4  # isort: skip
from equivalence import cards
from equivalence.check import check, check_args, compare
from equivalence.tolerances import tolerance

pytest.importorskip("triton")

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


# ------------------------------------------------------------------- the harness, tiny --

@pytest.mark.parametrize("component", ["layer_norm", "mlp", "conv_bn"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_harness_tiny(component, dtype):
    results = check(component, "triton", dtype=dtype, device=DEVICE, size="tiny")
    assert len(results) == len(cards.get(component).variants) * len(cards.LAYOUTS)
    for r in results:
        assert r.status == "pass", f"{r.variant}: {r.status} {r.reason} {r.worst}"


# ------------------------------------------------------------- odd shapes, CPU or GPU --

@pytest.mark.parametrize("N", [1, 7, 300])
def test_layer_norm_odd_widths(N):
    _passes("layer_norm", _args("layer_norm", dict(rows=(3,), N=N), torch.float32, seed=N))


def test_layer_norm_strided_rows():
    args = _args("layer_norm", dict(rows=(4, 5), N=33), torch.float32, seed=2)
    args["x"] = args["x"].transpose(0, 1).contiguous().transpose(0, 1)  # rows not evenly strided
    _passes("layer_norm", args)


def test_mlp_odd_sizes_3d_input():
    _passes("mlp", _args("mlp", dict(rows=(3, 11), K=17, hidden=45, N=9), torch.float32, seed=3))


@pytest.mark.parametrize("training", [False, True])
def test_conv_bn_channels_last_rect_kernel_no_bias(training):
    shape = dict(N=2, C_in=5, H=7, W=6, C_out=6, k=3, stride=(1, 2), padding=(0, 1),
                 channels_last=True)
    args = _args("conv_bn", shape, torch.float32, seed=4, training=training)
    w = args["conv_weight"][:, :, :2, :]  # a 2x3 kernel, as a strided view
    args["conv_weight"] = w
    args["conv_bias"] = None
    _passes("conv_bn", args)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("weight_layout", ["1x1", "channels_last 3x3", "strided 1x1"])
def test_conv_bn_eval_inference_applies_batchnorm_in_the_epilogue(bias, weight_layout):
    # Eval under no_grad with a weight whose channels are contiguous takes the fused path
    # (BatchNorm in the conv's epilogue, no fold kernel); the harness checks that forward
    # again with gradients off. A 1x1 strided view (channels 2 apart) takes the fold.
    k = 3 if "3x3" in weight_layout else 1
    shape = dict(N=2, C_in=6, H=5, W=7, C_out=10, k=k, stride=(2, 1), padding=(k // 2, 0),
                 channels_last=True)
    args = _args("conv_bn", shape, torch.float32, seed=5, training=False)
    if weight_layout == "channels_last 3x3":
        args["conv_weight"] = args["conv_weight"].contiguous(memory_format=torch.channels_last)
        assert args["conv_weight"].stride(1) == 1
    if weight_layout == "strided 1x1":
        w = args["conv_weight"]
        args["conv_weight"] = torch.cat([w, w], 1)[:, ::2]
        assert args["conv_weight"].stride(1) == 2
    if not bias:
        args["conv_bias"] = None
    _passes("conv_bn", args)


def test_conv_bn_train_updates_running_stats_once():
    # The running statistics move in forward only (not again in backward), like BatchNorm2d.
    args = _args("conv_bn", cards.get("conv_bn").sizes["tiny"], torch.float32, training=True)
    rm, rv = args["running_mean"].clone(), args["running_var"].clone()
    x = args["x"].clone().requires_grad_(True)
    out = L4.conv_bn(x, args["conv_weight"], args["conv_bias"], args["bn_weight"], args["bn_bias"],
                     rm, rv, args["stride"], args["padding"], training=True)
    after_fwd = rm.clone(), rv.clone()
    out.sum().backward()
    assert not torch.equal(after_fwd[0], args["running_mean"])
    assert torch.equal(after_fwd[0], rm) and torch.equal(after_fwd[1], rv)


# --------------------------------------------------------------- errors of this level --

def test_layer_norm_rejects_rows_too_wide_for_registers():
    x = torch.randn(1, 65537, device=DEVICE)
    w = torch.ones(65537, device=DEVICE)
    with pytest.raises(ValueError, match=r"layer_norm: argument 'x'.*65536.*65537"):
        L4.layer_norm(x, w, w)


@pytest.mark.parametrize("component", ["layer_norm", "mlp", "conv_bn"])
def test_float64_is_refused_by_name(component):
    args = _args(component, cards.get(component).sizes["tiny"], torch.float64)
    with pytest.raises(TypeError, match=rf"{component}: argument 'x'.*float64"):
        getattr(L4, component)(**args)


@pytest.mark.parametrize("split", [1, 2])
def test_mlp_with_subtiled_epilogue(split, monkeypatch):
    # SPLIT_N=2 (the epilogue on two half tiles) is only ever picked by autotune on a GPU;
    # pinning it here puts its reshape/split path and every epilogue (GELU+save, GELU',
    # none) through the interpreter and the harness.
    from triton_kernels import gemm
    cfg = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=2, SPLIT_N=split, num_warps=4,
               num_stages=1 if DEVICE == "cpu" else 3)
    monkeypatch.setattr(gemm, "CONFIG_OVERRIDE", cfg)
    _passes("mlp", _args("mlp", dict(rows=(37,), K=40, hidden=72, N=33), torch.float32, seed=split))


@pytest.mark.parametrize("splits", [2, 3])
def test_mlp_with_split_k(splits, monkeypatch):
    # Split-K is only picked by the size rule on a GPU (few output tiles, long K); pinned
    # here, the partial sums and the second kernel's epilogue (bias, GELU+save, GELU', none)
    # go through the interpreter and the whole harness, forward and backward. K = 200 and
    # hidden = 72: slices of 96 and 32 rows of K with a masked tail.
    from triton_kernels import gemm
    cfg = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=1, SPLIT_K=splits, num_warps=4,
               num_stages=1 if DEVICE == "cpu" else 3)
    monkeypatch.setattr(gemm, "CONFIG_OVERRIDE", cfg)
    args = _args("mlp", dict(rows=(2, 5), K=200, hidden=72, N=33), torch.float32, seed=splits)
    _passes("mlp", args)
    _passes("mlp", cards.get("mlp").strided(args))  # every operand a view: strides, offsets


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
    seen = []
    monkeypatch.setattr(G, "launch", lambda kernel, grid, *a, **kw: seen.append(kw["EVEN_K"]))
    a, b = torch.zeros(8, 96), torch.zeros(96, 16)
    c = torch.zeros(8, 16)
    for block_k in (32, 64):
        G._run((a, b, c, c, c), (False, G.EPI_NONE, False, "ieee"),
               dict(G._FIXED_INTERPRETED, BLOCK_K=block_k), 1)
    assert seen == [True, False]


def test_gemm_tile_comes_from_the_problem_size():
    # The wide tile only when its tiles alone fill the GPU; the MLP bench shape gets the
    # tile the autotuner picked there, a 1000-row GEMM the tile with twice the programs.
    from triton_kernels.gemm import BIG_TILE, MID_TILE, tile_for
    assert tile_for(8192, 16384, sms=132) is BIG_TILE
    assert tile_for(1000, 3072, sms=132) is MID_TILE  # 8 x 12 = 96 wide tiles < 132 SMs
    assert tile_for(128 * 12, 256 * 11, sms=132) is BIG_TILE  # exactly 132
    assert tile_for(128 * 12, 256 * 11 - 1, sms=132) is BIG_TILE  # still 11 columns
    assert tile_for(128 * 11, 256 * 12, sms=133) is MID_TILE
    from triton_kernels.gemm import NARROW_TILE
    assert tile_for(1000, 768, sms=132) is NARROW_TILE  # 8 x 6 = 48 square tiles < 132 SMs


# ------------------------------------------------------------------------------ GPU only --

@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows,N", [((1000,), 1023), ((3, 77), 4097), ((513,), 1), ((64,), 16384)])
def test_layer_norm_gpu(dtype, rows, N):
    _passes("layer_norm", _args("layer_norm", dict(rows=rows, N=N), dtype, seed=N))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("tiling", [(2, 8, 4), (4, 16, 2), (1, 4, 8)])
def test_layer_norm_gpu_backward_tilings(dtype, tiling, monkeypatch):
    # The tilings the benchmark sweeps must compute the same gradients (rows not a multiple
    # of BLOCK_M or of the programs: the last program's share is ragged).
    import triton_kernels.layer_norm as kernels
    key = (1000, torch.empty((), dtype=dtype).element_size())
    monkeypatch.setattr(kernels, "BACKWARD_TILING", {key: tiling})
    _passes("layer_norm", _args("layer_norm", dict(rows=(777,), N=1000), dtype, seed=tiling[0]))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows,K,hidden,N", [((1000,), 512, 1536, 257), ((7, 33), 100, 300, 65),
                                             ((2048,), 1024, 4096, 1024)])
def test_mlp_gpu(dtype, rows, K, hidden, N):
    _passes("mlp", _args("mlp", dict(rows=rows, K=K, hidden=hidden, N=N), dtype, seed=K))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("shape", [
    dict(N=4, C_in=64, H=30, W=31, C_out=96, k=3, stride=1, padding=1, channels_last=True),
    dict(N=3, C_in=19, H=17, W=20, C_out=33, k=3, stride=2, padding=1),
])
def test_conv_bn_gpu(dtype, training, shape):
    _passes("conv_bn", _args("conv_bn", shape, dtype, seed=shape["C_in"], training=training))


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


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_norm_gpu_widest_row(dtype):
    # MAX_WIDTH: one 65536-wide row per program, in registers (spills are measured by
    # scripts/device_layouts.py and recorded in reports/h100-layouts.json).
    _passes("layer_norm", _args("layer_norm", dict(rows=(67,), N=65536), dtype, seed=1))


@pytest.mark.gpu
@needs_gpu
def test_layer_norm_gpu_beyond_2_31_elements():
    # Row offsets past 2**31 elements: a 32-bit product would wrap and read row 0's memory.
    M, N = 2 ** 19 + 3, 4096
    x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    w = torch.rand(N, device="cuda", dtype=torch.bfloat16) + 0.5
    b = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        y = L4.layer_norm(x, w, b)
    for rows in (slice(0, 2), slice(M - 3, M)):
        ref = cards.get("layer_norm").module.reference(x[rows].double(), w.double(), b.double())[0]
        assert compare("rows", y[rows], ref, tolerance(torch.bfloat16), torch.bfloat16).ok, rows
    del x, y
