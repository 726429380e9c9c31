"""Level 5 (CUDA C++): the SwiGLU MLP on gemm.cu's ladder (cuda_kernels/swiglu_mlp.py).

CPU (CI): the version table and its environment variable; gemm.cu through nvcc alone: the
fused gate/up ("DUAL") kernels exist at every version, without spills or local memory, and
version 5's still issue wgmma. The C++ binding's contract and the C++ autograd
(swiglu_mlp_autograd.cpp) run on a CPU against torch twins in tests/test_cuda_autograd_cpu.py. Skipped with the reason where
nvcc is missing.

GPU (@pytest.mark.gpu): every version at fp32/fp16/bf16 through the harness (float64
reference, NaN-poisoned allocations, forward and every gradient) at the tiny preset, odd
sizes (K not a multiple of 8, hidden not a multiple of any tile), 3-D inputs, strided views
and weights in two different layouts; the two fused ops directly against float64; opcheck of
both and of the op a call is; torch.compile through the call, forward and backward.
"""

from __future__ import annotations

import pytest
import torch

import cuda_kernels.swiglu_mlp as K5
from equivalence import cards
from equivalence.check import check, check_args, compare
from equivalence.tolerances import tolerance
from tests.test_cuda_mlp import GEMM_CU, needs_nvcc

COMPONENT = "swiglu_mlp"
VERSIONS = sorted(K5.VERSIONS)
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


# ------------------------------------------------------------------------ CPU: Python --

def test_versions_are_the_gemm_ladder_and_the_variable_picks_one(monkeypatch):
    import cuda_kernels.mlp as mlp
    assert K5.VERSIONS == mlp.VERSIONS and K5.KERNEL_FILES == ("gemm.cu",)
    monkeypatch.setenv(K5.ENV_VERSION, "2")
    assert K5.ENV_VERSION == "LEVELS_CUDA_VERSION_SWIGLU_MLP" and K5.resolve_version() == 2
    assert K5.resolve_version(3) == 3
    monkeypatch.setenv(K5.ENV_VERSION, "9")
    with pytest.raises(ValueError, match=r"\$LEVELS_CUDA_VERSION_SWIGLU_MLP must be one of"):
        K5.resolve_version()


# ------------------------------------------------------------------------ CPU: nvcc ---

@needs_nvcc
def test_fused_kernels_exist_at_every_version_without_spills():
    from cuda_kernels import build
    report = build.ptxas_report(GEMM_CU, "90a")  # cached: test_cuda_mlp compiles the same file
    dual = [k for k in report if "true>" in k.get("kernel", "") or "Lb1E" in k["mangled"]]
    for version in VERSIONS:
        assert any(f"gemm_v{version}_kernel" in k["mangled"] for k in dual), version
    for k in dual:
        assert k["spill_stores"] == 0 and k["spill_loads"] == 0, k
        assert k.get("stack_bytes", 0) == 0, k


# ------------------------------------------------------------------------------ GPU ---

def _args(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return cards.get(COMPONENT).module.make_args(shape, dtype, torch.device("cuda"), g)


def _passes(args, version, monkeypatch):
    monkeypatch.setenv(K5.ENV_VERSION, str(version))
    r = check_args(COMPONENT, "cuda", args)
    assert r.passed, r.summary()


@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_harness_tiny(version, dtype, monkeypatch):
    monkeypatch.setenv(K5.ENV_VERSION, str(version))
    results = check(COMPONENT, "cuda", dtype=dtype, device="cuda", size="tiny")
    assert results and all(r.passed for r in results), "\n".join(r.summary() for r in results)


@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("shape", [
    dict(rows=(3,), K=17, hidden=45, N=5),            # nothing a multiple of anything
    dict(rows=(3, 11), K=24, hidden=72, N=20),        # 3-D input
    dict(rows=(1000,), K=768, hidden=2064, N=768),    # M, hidden no tile multiple
    dict(rows=(8,), K=1024, hidden=2752, N=1024),     # decode-like: M = 8
], ids=["3x17-45-5", "3d", "1000x768-2064", "decode"])
def test_harness_odd_sizes(version, dtype, shape, monkeypatch):
    _passes(_args(shape, dtype, seed=shape["K"]), version, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_harness_strided_and_mixed_layouts(version, dtype, monkeypatch):
    args = _args(dict(rows=(5, 7), K=40, hidden=56, N=24), dtype, seed=11)
    _passes(cards.get(COMPONENT).strided(args), version, monkeypatch)
    # w_gate as nn.Linear stores it, w_up transposed: one set of strides for both B operands
    # is what the kernels take, so the binding lays them out alike first
    mixed = dict(args, w_up=cards.as_view(args["w_up"], "transposed"))
    _passes(mixed, version, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_fused_ops_against_float64(version, dtype):
    g = torch.Generator().manual_seed(version)
    x = torch.randn(300, 72, generator=g).to("cuda", dtype)
    wg, wu = (torch.randn(200, 72, generator=g).mul(0.15).to("cuda", dtype) for _ in range(2))
    wd = torch.randn(40, 200, generator=g).mul(0.1).to("cuda", dtype)
    dy = torch.randn(300, 40, generator=g).to("cuda", dtype)
    bound = tolerance(dtype)
    act, gs, us = K5.gate_up(x, wg, wu, save=True, version=version)
    G, U = x.double() @ wg.double().t(), x.double() @ wu.double().t()
    for name, got, want in (("act", act, G * torch.sigmoid(G) * U), ("G", gs, G), ("U", us, U)):
        c = compare(name, got, want, bound, dtype)
        assert c.ok, c
    assert K5.gate_up(x, wg, wu, save=False, version=version)[1].numel() == 0
    dg, du = K5._ops().swiglu_mlp_grad(dy, wd, gs, us, version)
    Gs, Us = gs.double(), us.double()
    s, dA = torch.sigmoid(Gs), dy.double() @ wd.double()
    for name, got, want in (("dG", dg, dA * Us * s * (1 + Gs * (1 - s))), ("dU", du, dA * Gs * s)):
        c = compare(name, got, want, bound, dtype)
        assert c.ok, c


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() != (9, 0),
                    reason="version 6 needs an sm_90 GPU (wgmma, TMA)")
@pytest.mark.parametrize("layout", ["as allocated", "transposed view", "odd row stride"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=lambda d: str(d)[6:])
def test_grad_reads_w_down_in_any_layout(layout, dtype):
    """swiglu_mlp_grad at version 6 reads an nn.Linear W_down (hidden contiguous) as it lies
    (MN-major tiles, no copy: swiglu_mlp_binding.cpp); any other layout is copied to the
    K-major one first. Every layout gives dG and dU of the float64 math."""
    g = torch.Generator().manual_seed(11)
    M, N, hidden = 257, 136, 328
    if layout == "odd row stride":  # a slice of a wider weight: rows 329 elements apart
        wd = torch.randn(N, hidden + 1, generator=g).mul(0.1).to("cuda", dtype)[:, :hidden]
    elif layout == "transposed view":
        wd = torch.randn(hidden, N, generator=g).mul(0.1).to("cuda", dtype).t()
    else:
        wd = torch.randn(N, hidden, generator=g).mul(0.1).to("cuda", dtype)
    dy = torch.randn(M, N, generator=g).to("cuda", dtype)
    gs, us = (torch.randn(M, hidden, generator=g).to("cuda", dtype) for _ in range(2))
    # NaN in the blocks the allocator hands out next (dG and dU are this size): an element the
    # kernel does not write fails the check
    poison = [torch.full((M, hidden), float("nan"), device="cuda", dtype=dtype) for _ in range(2)]
    del poison
    dg, du = K5._ops().swiglu_mlp_grad(dy, wd, gs, us, 6)
    Gs, Us = gs.double(), us.double()
    s, dA = torch.sigmoid(Gs), dy.double() @ wd.double()
    for name, got, want in (("dG", dg, dA * Us * s * (1 + Gs * (1 - s))), ("dU", du, dA * Gs * s)):
        c = compare(name, got, want, tolerance(dtype), dtype)
        assert c.ok, c


@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
def test_opcheck_kernel_ops_and_the_call(version):
    ops = K5._ops()
    dt = torch.bfloat16 if version >= 4 else torch.float32
    x = torch.randn(33, 40, device="cuda", dtype=dt)
    wg, wu = torch.randn(24, 40, device="cuda", dtype=dt), torch.randn(24, 40, device="cuda", dtype=dt)
    wd = torch.randn(16, 24, device="cuda", dtype=dt)
    dy = torch.randn(33, 16, device="cuda", dtype=dt)
    _, g, u = ops.swiglu_mlp_gate_up(x, wg, wu, True, version)
    for op, args in ((ops.swiglu_mlp_gate_up, (x, wg, wu, True, version)),
                     (ops.swiglu_mlp_gate_up, (x, wg, wu, False, version)),
                     (ops.swiglu_mlp_gate_up, (x.t().contiguous().t(), wg, wu.t().contiguous().t(),
                                               True, version)),
                     (ops.swiglu_mlp_grad, (dy, wd, g, u, version))):
        torch.library.opcheck(op, args)
    # the op a call is (swiglu_mlp_autograd.cpp): its C++ autograd traced by AOT autograd
    leaves = [t.detach().clone().requires_grad_(True) for t in (x, wg, wu, wd)]
    torch.library.opcheck(ops.swiglu_mlp, (*leaves, version))


@pytest.mark.gpu
def test_compiled_module_calls_the_level_5_swiglu_mlp():
    import levels

    level = levels.get("cuda")
    args = _args(dict(rows=(64,), K=64, hidden=128, N=32), torch.bfloat16, seed=5)
    t = [args[n] for n in ("x", "w_gate", "w_up", "w_down")]
    fn = torch.compile(lambda *a: level.swiglu_mlp(*a), fullgraph=True)
    assert torch.equal(fn(*t), level.swiglu_mlp(*t))


@pytest.mark.gpu
@pytest.mark.parametrize("version", [3, 4, 6])
def test_inside_torch_compile_with_backward(version, monkeypatch):
    # fake kernel ops + the C++ autograd: Dynamo traces one graph, whose backward calls ours
    # (the accumulating dX GEMM included); x alone needs no gradient: only the weights' GEMMs
    monkeypatch.setenv(K5.ENV_VERSION, str(version))
    K5._ops()  # the library must be loaded before tracing (Dynamo cannot trace a build)
    args = _args(dict(rows=(2, 24), K=64, hidden=96, N=40), torch.bfloat16, seed=version)
    for x_grad in (True, False):
        t = [args[n].detach().clone().requires_grad_(n != "x" or x_grad)
             for n in ("x", "w_gate", "w_up", "w_down")]
        wanted = [a for a in t if a.requires_grad]

        def f(*a):
            return torch.relu(K5.swiglu_mlp(*a)) + 1

        torch._dynamo.reset()
        results = []
        for fn in (f, torch.compile(f, fullgraph=True)):
            out = fn(*t)
            results.append((out, *torch.autograd.grad(out.float().square().sum(), wanted)))
        for got, want in zip(results[1], results[0]):
            torch.testing.assert_close(got, want)
