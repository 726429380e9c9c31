"""Level 4 (Triton): the SwiGLU MLP (triton_kernels/swiglu_mlp.py), forward and backward.

Without a GPU these run in Triton's CPU interpreter (sizes stay tiny). Every case goes
through the harness (float64 reference, NaN-poisoned memory, every gradient) or is compared
with float64 directly; each fused launcher (gate/up with its SiLU-mul epilogue, the
derivative epilogue, the sum of two products) is also checked alone. @pytest.mark.gpu tests
repeat it on CUDA at fp16/bf16/fp32 with odd sizes.
"""

from __future__ import annotations

import pytest
import torch

import levels.triton as L4  # isort: skip  (first: switches the interpreter on without a GPU)
from equivalence import cards
from equivalence.check import check, check_args, compare
from equivalence.tolerances import tolerance

pytest.importorskip("triton")

COMPONENT = "swiglu_mlp"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _args(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return cards.get(COMPONENT).module.make_args(shape, dtype, torch.device(DEVICE), g)


def _pinned(config):
    from triton_kernels import swiglu_mlp as kernels

    def swiglu_mlp(x, w_gate, w_up, w_down):
        return kernels.swiglu_mlp(x, w_gate, w_up, w_down, config=config)
    return swiglu_mlp


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_harness_tiny(dtype):
    results = check(COMPONENT, "triton", dtype=dtype, device=DEVICE, size="tiny")
    assert len(results) == len(cards.LAYOUTS)
    for r in results:
        assert r.status == "pass", f"{r.layout}: {r.status} {r.reason} {r.worst}"


def test_float64_is_refused_by_name():
    args = _args(cards.get(COMPONENT).sizes["tiny"], torch.float64)
    with pytest.raises(TypeError, match=r"swiglu_mlp: argument 'x'.*float64"):
        L4.swiglu_mlp(**args)


def test_odd_sizes_3d_input():
    r = check_args(COMPONENT, "triton", _args(dict(rows=(3, 11), K=17, hidden=45, N=9),
                                              torch.float32, seed=3))
    assert r.passed, r.summary()


def test_weights_in_different_layouts():
    # w_gate as nn.Linear stores it, w_up transposed, w_down a slice of a wider buffer: the
    # two B operands of the fused GEMM carry strides of their own
    args = _args(dict(rows=(2, 7), K=24, hidden=40, N=12), torch.float32, seed=5)
    args["w_up"] = cards.as_view(args["w_up"], "transposed")
    args["w_down"] = cards.as_view(args["w_down"], "row_padded")
    r = check_args(COMPONENT, "triton", args)
    assert r.passed, r.summary()


@pytest.mark.parametrize("split", [1, 2])
def test_subtiled_epilogue(split):
    # SPLIT_N=2 (the SiLU-mul epilogue on half tiles of both accumulators) is what the size
    # rule picks for big problems on a GPU; pinned here it runs through the interpreter, in
    # every mode (gate/up with G and U saved, the derivative, the sum), in both layouts.
    cfg = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=2, SPLIT_N=split, num_warps=4,
               num_stages=1 if DEVICE == "cpu" else 3)
    args = _args(dict(rows=(37,), K=40, hidden=72, N=33), torch.float32, seed=split)
    for case in (args, cards.get(COMPONENT).strided(args)):
        r = check_args(COMPONENT, case, fn=_pinned(cfg))
        assert r.passed, r.summary()


def test_each_fused_launcher_against_float64():
    from triton_kernels import swiglu_mlp as K
    g = torch.Generator().manual_seed(7)
    x = torch.randn(19, 24, generator=g).to(DEVICE)
    wg, wu = (torch.randn(36, 24, generator=g).to(DEVICE) * 0.3 for _ in range(2))
    wd = torch.randn(10, 36, generator=g).to(DEVICE) * 0.2
    dy = torch.randn(19, 10, generator=g).to(DEVICE)
    bound = tolerance(torch.float32)
    G, U = x.double() @ wg.double().t(), x.double() @ wu.double().t()
    act, gs, us = K.gate_up(x, wg, wu, save=True)
    for name, got, want in (("act", act, G * torch.sigmoid(G) * U), ("G", gs, G), ("U", us, U)):
        assert compare(name, got, want, bound, torch.float32).ok, name
    assert K.gate_up(x, wg, wu)[1] is None  # nothing saved without a backward
    dA = dy.double() @ wd.double()
    s = torch.sigmoid(G)
    dg, du = K.swiglu_backward(dy, wd, gs, us)
    assert compare("dG", dg, dA * U * s * (1 + G * (1 - s)), bound, torch.float32).ok
    assert compare("dU", du, dA * G * s, bound, torch.float32).ok
    dx = K.sum_of_products(dg, wg, du, wu.t().contiguous().t())  # w_up as a transposed view
    want = dg.double() @ wg.double() + du.double() @ wu.double()
    assert compare("dX", dx, want, bound, torch.float32).ok


def test_tile_comes_from_the_problem_size():
    # gate/up has two accumulators: gemm.py's tile for the (M, 2 * hidden) product, halved
    from triton_kernels import swiglu_mlp as K
    big = K.size_rule(4096, 11008, 4096, K.GATE_UP, sms=132)  # Llama 2 7B, 4096 tokens
    assert (big["BLOCK_M"], big["BLOCK_N"], big["SPLIT_N"], big["num_stages"]) == (128, 128, 2, 4)
    grad = K.size_rule(4096, 11008, 4096, K.SWIGLU_GRAD, sms=132)  # one accumulator
    assert (grad["BLOCK_M"], grad["BLOCK_N"]) == (128, 256)
    # M = 1000, 2 x 1536 wide: 96 big tiles, one round on 132 SMs: gemm.py's 128 x 256, halved
    assert K.size_rule(1000, 1536, 768, K.GATE_UP, sms=132)["BLOCK_N"] == 128
    # 2 x 768 wide: 48 big tiles leave most SMs idle, 96 of 128 x 128 one round: halved
    assert K.size_rule(1000, 768, 768, K.GATE_UP, sms=132)["BLOCK_N"] == 64
    decode = K.size_rule(8, 11008, 4096, K.GATE_UP, sms=132)  # weights-bound: the light tile
    assert (decode["BLOCK_M"], decode["BLOCK_N"]) == (16, 64)


def test_two_operand_pairs_hold_no_more_shared_memory_than_gemms_tile():
    """dX = dG W_gate + dU W_up sums two products. Found on the H100: when one K loop loaded
    both operand pairs a step, gemm.py's 128x256x64 tile with 4 stages asked for 384 KB of
    shared memory at Llama 2 7B's backward (227 KB there; Triton's interpreter never checks),
    and the launch failed; halving the stages to fit made it the slowest launch of the
    backward. The kernel now runs the two products as two K loops, one pair a step: gemm.py's
    own tile, stages and all, which fits."""
    from triton_kernels import swiglu_mlp as K

    def smem(cfg):  # bytes of the operand pipeline (one pair a stage), 16-bit operands
        return 2 * cfg["num_stages"] * cfg["BLOCK_K"] * (cfg["BLOCK_M"] + cfg["BLOCK_N"])
    for M, N, Kdim in [(4096, 4096, 11008), (4096, 4096, 14336), (1000, 768, 3072), (8, 4096, 11008)]:
        one = K.size_rule(M, N, Kdim, K.SWIGLU_GRAD, sms=132)  # one pair: gemm.py's own tile
        two = K.size_rule(M, N, Kdim, K.SUM_OF_TWO, sms=132)
        assert two == one, (M, N, Kdim, two, one)
        assert smem(two) <= 232448, (M, N, Kdim, two)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows,K,hidden,N", [((1000,), 512, 1376, 257), ((7, 33), 100, 300, 65),
                                             ((2048,), 1024, 2752, 1024), ((8,), 512, 1376, 512)])
def test_swiglu_mlp_gpu(dtype, rows, K, hidden, N):
    r = check_args(COMPONENT, "triton", _args(dict(rows=rows, K=K, hidden=hidden, N=N), dtype, seed=K))
    assert r.passed, r.summary()


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_swiglu_mlp_gpu_strided(dtype):
    args = _args(dict(rows=(3, 333), K=768, hidden=2048, N=768), dtype, seed=11)
    r = check_args(COMPONENT, "triton", cards.get(COMPONENT).strided(args))
    assert r.passed, r.summary()


def test_nn_layer_from_torch_linears_at_level_4():
    # levels.nn.SwiGLUMLP from three bias-free nn.Linear (LlamaMLP's), same weights, Level 4
    from torch import nn
    from levels.nn import SwiGLUMLP

    torch.manual_seed(0)
    gate, up = nn.Linear(24, 40, bias=False), nn.Linear(24, 40, bias=False)
    down = nn.Linear(40, 12, bias=False)
    layer = SwiGLUMLP.from_torch(gate, up, down, level="triton").to(DEVICE)
    assert set(layer.state_dict()) == {"gate_proj.weight", "up_proj.weight", "down_proj.weight"}
    x = torch.randn(3, 5, 24, device=DEVICE)
    w = [m.weight.detach().to(DEVICE, torch.float64) for m in (gate, up, down)]
    want, = cards.get(COMPONENT).reference(dict(x=x.double(), w_gate=w[0], w_up=w[1], w_down=w[2]))
    assert compare("layer", layer(x), want, tolerance(torch.float32), torch.float32).ok
    with pytest.raises(ValueError, match="without biases"):
        SwiGLUMLP.from_torch(nn.Linear(4, 8), up, down)
