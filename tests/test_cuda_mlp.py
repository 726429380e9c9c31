"""Level 5 (CUDA C++): the GEMM ladder of cuda_kernels/gemm.cu and the MLP built on it.

CPU (CI): the version table and its environment variable, the operand layouts version 4
needs (made on CPU tensors), and gemm.cu through nvcc alone: no register spills in the
tensor-core kernels, and the instructions each rung is about (mma.sync, ldmatrix, cp.async)
present in its PTX. Skipped with the reason where nvcc is missing.

GPU (@pytest.mark.gpu): every version at fp32/fp16/bf16 — the harness (float64 reference,
NaN-poisoned allocations, forward and every gradient) on the MLP at the tiny preset, odd
sizes (no multiple of any tile: M=3, K=17, N=5; M=1000, 768 -> 3072), 3-D inputs and
strided views; each GEMM epilogue directly against float64; column sums; fp32 output and
in-place accumulation; an operand over 2**31 elements (int64 offsets); opcheck on every op.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import cuda_kernels.mlp as K5
from equivalence import cards
from equivalence.tolerances import tolerance

VERSIONS = sorted(K5.VERSIONS)
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
GEMM_CU = Path(K5.__file__).with_name("gemm.cu")


# ------------------------------------------------------------------------ CPU: Python --

@pytest.mark.parametrize("make", [
    lambda: torch.randn(5, 17),                        # K % 8 != 0: padded rows
    lambda: torch.randn(24, 16).t(),                   # column-major
    lambda: torch.randn(10, 40)[:, 3:27],              # unaligned start
    lambda: torch.randn(40)[1:33].view(4, 8),          # contiguous but 4 bytes off
    lambda: torch.randn(3, 1, 16).expand(3, 2, 16)[:, 1],  # strided rows (32 apart): kept
], ids=["odd-K", "transposed", "slice", "offset", "row-stride"])
def test_k_major_makes_what_version_4_reads(make):
    t = make().to(torch.bfloat16)
    k = K5._k_major(t)
    assert K5.is_k_major(k) and torch.equal(k, t)
    if K5.is_k_major(t):
        assert k is t  # no copy when none is needed


def test_k_major_keeps_contiguous_weights_and_gradients():
    w = torch.randn(64, 32, dtype=torch.bfloat16)
    assert K5._k_major(w) is w  # nn.Linear's weight: already what version 4 reads
    x = torch.randn(6, 9, requires_grad=True)
    (K5._k_major(x) * 2).sum().backward()  # the copy is differentiable
    assert torch.equal(x.grad, torch.full_like(x, 2.0))


@pytest.mark.parametrize("tile,version,match", [
    (4, 4, r"argument 'tile' must be one of \[0, 1, 2, 3\]"),
    (True, 4, r"argument 'tile' must be one of"),
    (1, 3, r"pins version 4's tile shape; got tile=1 with version 3"),
])
def test_mlp_forward_refuses_a_tile_it_cannot_pin(tile, version, match):
    # Checked before anything is built or launched: a CPU says so too.
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match=match):
        K5.mlp_forward(x, torch.randn(16, 8), torch.randn(16), torch.randn(8, 16), torch.randn(8),
                       version=version, tile=tile)


# ------------------------------------------------------------------------ CPU: nvcc ---

def _nvcc_reason():
    from cuda_kernels import build
    return build.nvcc_available()


needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None and _nvcc_reason() is not None,
                                reason="nvcc not found (install the CUDA toolkit or set CUDA_HOME)")


@needs_nvcc
def test_tensor_core_kernels_do_not_spill():
    from cuda_kernels import build
    report = build.ptxas_report(GEMM_CU, "90a")
    names = [k.get("name", k["mangled"]) for k in report]
    assert any("gemm_v4_kernel" in n for n in names), names
    assert any("gemm_v5_kernel" in n for n in names), names
    assert any("gemm_v6_kernel" in n for n in names) and any("gemm_v6_batched_kernel" in n for n in names), names
    assert any("gemm_v7_kernel" in n for n in names) and any("gemm_v7_batched_kernel" in n for n in names), names
    assert sum("gemm_v8_kernel" in n for n in names) == 6, names  # 2 dtypes x (2 outputs + SwiGLU)
    for k in report:
        assert k["spill_stores"] == 0 and k["spill_loads"] == 0, k
        assert k.get("stack_bytes", 0) == 0, k  # an array indexed at run time would live in local memory
        if "gemm_v4_kernel" in k.get("name", k["mangled"]) or "gemm_v5_kernel" in k.get("name", k["mangled"]):
            assert k["registers"] <= 255, k
        if any(v in k.get("name", k["mangled"]) for v in ("gemm_v6", "gemm_v7", "gemm_v8")):
            # 384 threads, one block per SM: the register cap at entry that setmaxnreg needs
            # (65536 / 384 rounded down to 8); the consumers then grow to 232, the producer to 40
            assert k["registers"] <= 168, k
        if "gemm_v7" in k.get("name", k["mangled"]) or "gemm_v8" in k.get("name", k["mangled"]):
            # version 7's stage count (v7_stages, version 8's too) sets aside 1 KB for the static
            # barriers; more would push ring + slabs past 227 KB and the launch would fail on the GPU
            assert k["shared_bytes"] <= 1024, k


@needs_nvcc
def test_each_rung_uses_its_instructions():
    from cuda_kernels import build
    ptx = build.compile_ptx(GEMM_CU, "80")
    # version 4's three ideas; the epilogue's exact erf (no approximate intrinsics)
    for instruction in ("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
                        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
                        "ldmatrix.sync.aligned.m8n8.x4.shared.b16", "cp.async.cg.shared.global",
                        "cp.async.wait_group"):
        assert instruction in ptx, instruction
    # versions 5 and 6 are compiled for sm_90a only (their bodies are empty elsewhere)
    for hopper_only in ("wgmma", "cp.async.bulk.tensor", "mbarrier", "setmaxnreg"):
        assert hopper_only not in ptx, hopper_only


@needs_nvcc
def test_version_5_uses_wgmma_on_sm90a():
    """And version 6 its TMA, mbarriers and setmaxnreg (one compile for both: conftest's SLOW
    names this test)."""
    from cuda_kernels import build
    ptx = build.compile_ptx(GEMM_CU, "90a")
    for instruction in ("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16",
                        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16",
                        # version 6's 128x256 tiles: one m64n256k16 per k16 slice (WIDE_MMA)
                        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16",
                        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16",
                        "wgmma.fence.sync.aligned", "wgmma.commit_group.sync.aligned",
                        "wgmma.wait_group.sync.aligned", "fence.proxy.async.shared::cta"):
        assert instruction in ptx, instruction
    for instruction in ("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes",
                        "mbarrier.init.shared::cta.b64", "fence.mbarrier_init.release.cluster",
                        "mbarrier.arrive.expect_tx.shared::cta.b64", "mbarrier.arrive.shared::cta.b64",
                        "mbarrier.try_wait.parity.shared::cta.b64",
                        "setmaxnreg.dec.sync.aligned.u32 40", "setmaxnreg.inc.sync.aligned.u32 232",
                        "bar.sync 1, 256"):
        assert instruction in ptx, instruction
    # version 6's kernels (plain, SwiGLU, batched; each dtype and tile) are there
    v6_entries = re.findall(r"\.entry (\w*gemm_v6\w*)\(", ptx)
    assert len(v6_entries) >= 4, v6_entries
    # version 7's: plain (2 dtypes x 2 outputs x 2 tiles + SwiGLU 2 x 2) and batched (2 dtypes),
    # with the per-warpgroup named barrier of its epilogue (bar.sync <2 + warpgroup>, 128)
    v7_entries = re.findall(r"\.entry (\w*gemm_v7\w*)\(", ptx)
    assert len(v7_entries) == 14, v7_entries
    assert re.search(r"bar\.sync %r\d+, 128;", ptx)
    # version 8's: one tile shape (2 dtypes x 2 outputs + SwiGLU 2), each consumer issuing both
    # 64-row halves of its tile: two wgmma per k16 slice, i.e. 8 per k-tile in its main loop
    v8_entries = re.findall(r"\.entry (\w*gemm_v8\w*)\(", ptx)
    assert len(v8_entries) == 6, v8_entries

    def body(name):  # a kernel's PTX, to the next kernel or the end
        text = ptx[ptx.index(".entry " + name + "("):]
        return text[:text.find("// .globl", 1) % (len(text) + 1)]

    # the ring's barrier inits as version 7's at 128x128 (6 stages), and the math order's two
    v7_inits = {body(n).count("mbarrier.init.shared::cta.b64") for n in v7_entries if "Li128ELb0" in n}
    assert len(v7_inits) == 1, v7_inits
    (ring_inits,) = v7_inits
    for name in v8_entries:
        assert body(name).count("wgmma.mma_async") % 8 == 0 and "wgmma.mma_async" in body(name), name
        assert body(name).count("mbarrier.init.shared::cta.b64") == ring_inits + 2, name


# ------------------------------------------------------------------------------ GPU ---

def _rel(got, ref, scale=None):
    """||got - ref|| / ||ref||, or / ||scale|| where the result may cancel (see its callers)."""
    scale = ref if scale is None else scale
    return float((got.double() - ref).norm() / scale.norm().clamp_min(1e-300))


def _gelu64(h):
    return 0.5 * h * (1.0 + torch.erf(h / math.sqrt(2.0)))


def _gelu_grad64(h):
    return 0.5 * (1.0 + torch.erf(h / math.sqrt(2.0))) + h * torch.exp(-0.5 * h * h) / math.sqrt(2 * math.pi)


def _operands(M, K, N, dtype, layout, seed=0):
    """a (M, K), b (K, N) in one of the layouts callers pass: 'linear' (b = W^T, the
    nn.Linear weight as a view), 'row-major' b, or 'strided' (a transposed view, b a
    column slice of a wider matrix)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    a = torch.randn(M, K, generator=g).to("cuda", dtype)
    w = (torch.randn(N, K, generator=g) * K ** -0.5).to("cuda", dtype)
    if layout == "linear":
        return a, w.t()
    if layout == "row-major":
        return a, w.t().contiguous()
    wide = torch.zeros(K, N + 7, device="cuda", dtype=dtype)
    wide[:, 3:3 + N] = w.t()
    return a.t().contiguous().t(), wide[:, 3:3 + N]


SHAPES = [(3, 17, 5), (1000, 768, 3072), (130, 64, 257), (1, 8, 1)]


@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("layout", ["linear", "row-major", "strided"])
def test_gemm_epilogues_against_float64(version, dtype, shape, layout):
    M, K, N = shape
    a, b = _operands(M, K, N, dtype, layout, seed=M + K + N)
    bias = torch.randn(N, device="cuda").to(dtype)
    a64, b64, bias64 = a.double(), b.double(), bias.double()
    h64 = a64 @ b64 + bias64
    # Errors are measured against the size of what was summed, |a| |b| + |bias|, not of the
    # result: a sum that cancels to ~0 (likely with 1 x 8 x 1 and a fresh random bias) has a
    # tiny result but the same rounding as one that does not. The same bound per dtype.
    scale = a64.abs() @ b64.abs() + bias64.abs()
    bound = tolerance(dtype)

    plain = K5.gemm(a, b, bias, version=version)
    assert plain.shape == (M, N) and plain.dtype == dtype
    assert _rel(plain, h64, scale) <= bound

    act, pre = K5.gemm(a, b, bias, epilogue="gelu_save", version=version)
    pre64 = pre.double()
    assert _rel(pre, h64, scale) <= bound and _rel(act, _gelu64(pre64), pre64.abs()) <= bound
    assert _rel(K5.gemm(a, b, bias, epilogue="gelu", version=version), _gelu64(h64), scale) <= bound

    grad = K5.gemm(a, b, epilogue="gelu_grad", aux=pre, version=version)
    gelu_grad = _gelu_grad64(pre64)
    assert _rel(grad, (a64 @ b64) * gelu_grad, (a64.abs() @ b64.abs()) * gelu_grad.abs()) <= bound


@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_gemm_fp32_output_and_accumulate(version, dtype):
    a, b = _operands(67, 40, 33, dtype, "linear", seed=1)
    ref = a.double() @ b.double()
    out = K5.gemm(a, b, out_dtype=torch.float32, version=version)
    assert out.dtype == torch.float32 and _rel(out, ref) <= tolerance(dtype)
    # c += a @ b + bias, into a strided view of a bigger buffer; the rest untouched
    big = torch.randn(33, 80, device="cuda").to(dtype)
    before = big.clone()
    c = big.t()[5:72]  # (67, 33), strides (1, 80)
    bias = torch.randn(33, device="cuda").to(dtype)
    K5.gemm_accumulate(c, a, b, bias, version=version)
    assert _rel(c, before.t()[5:72].double() + ref + bias.double()) <= tolerance(dtype)
    untouched = torch.ones_like(big, dtype=torch.bool)
    untouched.t()[5:72] = False
    assert torch.equal(big[untouched], before[untouched])


# Version 6 (TMA + warp specialization) runs version 5's MMAs on the same shared-memory layout
# in the same order, with the same tile choice and epilogues: every output must carry version
# 5's bits. A tensor map whose box, swizzle or coordinates disagreed with the wgmma descriptor
# (or a stage read before its bytes landed) could not pass this at these sizes.
V6_SHAPES = [(1, 1, 1), (1, 7, 70), (7, 1, 8), (127, 129, 70), (129, 127, 1000), (1000, 1000, 70),
             (300, 2049, 264), (4096, 200, 2048)]  # (M, K, N); the last: 128x256 tiles (they fill the GPU)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("M,K,N", V6_SHAPES, ids=lambda v: str(v))
def test_version_6_gives_version_5_bits_and_the_float64_answer(dtype, M, K, N):
    _same_bits(5, 6, dtype, M, K, N)


# Version 7 (persistent) runs version 6's MMAs and epilogue code with the same tile choice and
# fp32 staging: version 6's bits. Its own risks are the tile walk and the ring across tiles:
# shapes with many tiles per block (4096 x 4096: 512 tiles of 128x256 on ~132 blocks; K tails
# that are not a multiple of the ring), and fewer tiles than SMs (a block each, or idle SMs).
V7_SHAPES = V6_SHAPES + [(4096, 328, 4096),   # 128x256 tiles, ~4 per block, KT = 6 (ring: 4)
                         (2048, 1000, 1536),  # 128x128 (96 big tiles < SMs): 192, 1-2 per block, KT = 16
                         (3000, 136, 2100),   # 128x256, M and N tails in the last tiles, KT = 3
                         (8192, 64, 4096)]    # 1024 tiles, one k-tile each: the ring wraps across tiles


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("M,K,N", V7_SHAPES, ids=lambda v: str(v))
def test_version_7_gives_version_6_bits_and_the_float64_answer(dtype, M, K, N):
    _same_bits(6, 7, dtype, M, K, N)


# Version 8 (ping-pong) computes each output element with the same m64n128k16 MMAs over the
# same k16 slices as version 6 (a 128x256 tile of version 6 is two n128 instructions per slice,
# version 8's 128x128 tile one per 64-row half), the same fp32 staging and epilogue code:
# version 6's bits, though its tiles are 128x128 where version 6 picks 128x256. Its own risks
# are the two consumers on one ring and the math order, so on 128x128 tiles (SMs: 132 on an
# H100 SXM): (4096, 328, 4096) 1024 tiles, ~8 per block, KT = 6 (the ring: 6);
# (4096, 200, 2048) 512 tiles, ~4 per block, KT = 4 (consumers' stages cross each round);
# (3000, 136, 2100) 408 tiles, 3 per block mostly (consumer 0 one more), M and N tails;
# (2048, 1000, 1536) 192 tiles: 1 or 2 per block, KT = 16; (8192, 64, 4096) KT = 1, 2048
# tiles; (300, 2049, 264) 9 tiles (consumer 1 idle everywhere), KT = 33 > the ring.
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("M,K,N", V7_SHAPES, ids=lambda v: str(v))
def test_version_8_gives_version_6_bits_and_the_float64_answer(dtype, M, K, N):
    _same_bits(6, 8, dtype, M, K, N)


def _same_bits(lo, hi, dtype, M, K, N):
    """Every epilogue (and the SwiGLU pair) of version `hi` equals version `lo`'s bit for bit,
    into memory that held NaN, and the product is within the dtype's bound of float64."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip(f"versions {lo} and {hi} need an sm_90 GPU")
    a, b = _operands(M, K, N, dtype, "linear", seed=M + K + N)
    bias = torch.randn(N, device="cuda").to(dtype)
    poison = torch.full((64 << 20,), float("nan"), device="cuda")  # freed NaN: outputs land there
    del poison
    calls = {
        "none": lambda v: K5.gemm(a, b, version=v),
        "bias+gelu": lambda v: K5.gemm(a, b, bias, epilogue="gelu", version=v),
        "gelu_save": lambda v: torch.cat(K5.gemm(a, b, bias, epilogue="gelu_save", version=v)),
        "gelu_grad": lambda v: K5.gemm(a, b, epilogue="gelu_grad", aux=a[:, :1].expand(M, N).contiguous(),
                                       version=v),
        "fp32 out": lambda v: K5.gemm(a, b, out_dtype=torch.float32, version=v),
        "accumulate": lambda v: K5.gemm_accumulate(torch.ones(M, N, device="cuda"), a, b, bias, version=v),
    }
    for name, call in calls.items():
        want, got = call(lo), call(hi)
        assert torch.isfinite(got).all(), name
        assert torch.equal(want, got), (name, float((want.double() - got.double()).abs().max()))
    ref = a.double() @ b.double()
    assert _rel(calls["none"](hi), ref, a.double().abs() @ b.double().abs()) <= tolerance(dtype)
    # the SwiGLU gate/up GEMM: [B | B2] halves loaded by two tensor maps
    from cuda_kernels import swiglu_mlp
    w_up = torch.randn(N, K, device="cuda").to(dtype) * K ** -0.5
    got = swiglu_mlp.gate_up(a, b.t(), w_up, save=True, version=hi)
    want = swiglu_mlp.gate_up(a, b.t(), w_up, save=True, version=lo)
    for g, w in zip(got, want):
        assert torch.isfinite(g).all() and torch.equal(g, w)
    assert _rel(got[1], ref, a.double().abs() @ b.double().abs()) <= tolerance(dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("shape", [(1, 1), (1000, 3), (4097, 77)], ids=str)
def test_column_sum(dtype, shape):
    x = torch.randn(shape[1], shape[0], device="cuda").to(dtype).t()  # strided
    ref = x.double().sum(0)
    got = K5.column_sum(x)
    assert got.dtype == dtype and _rel(got, ref) <= tolerance(dtype)
    assert K5.column_sum(x, out_dtype=torch.float32).dtype == torch.float32


@pytest.mark.gpu
def test_an_op_that_refuses_raises_cleanly():
    """A launcher's refusal (here: a version that does not exist, passed to the op
    directly, past the Python checks) becomes a RuntimeError naming op and version. In a
    subprocess: a crash while raising (seen once on the H100 build: TORCH_CHECK's
    ostream, see binding.cpp) must fail this test, not end the session."""
    code = (
        "import torch, cuda_kernels.mlp as K5\n"
        "a = torch.randn(16, 24, device='cuda', dtype=torch.bfloat16)\n"
        "w = torch.randn(8, 24, device='cuda', dtype=torch.bfloat16)\n"
        "try:\n"
        "    K5._ops().gemm_matmul(a, w.t(), None, False, False, 9)\n"
        "except RuntimeError as e:\n"
        "    print('RAISED', e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          cwd=str(Path(K5.__file__).resolve().parents[1]))
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    assert re.search(r"RAISED .*gemm_matmul \(version 9\).*does not exist", proc.stdout), proc.stdout + proc.stderr


@pytest.mark.gpu
@pytest.mark.parametrize("version", [3, 4, 5, 6, 7, 8])
def test_int64_offsets(version):
    """A over 2**31 elements: rows past the 32-bit range must be the right rows."""
    M, K, N = (2 ** 31) // 512 + 300, 512, 8
    try:
        a = torch.empty(M, K, device="cuda", dtype=torch.bfloat16)
    except torch.OutOfMemoryError:
        pytest.skip("needs 4.3 GB of free GPU memory")
    a.fill_(0.0)
    a[-300:].normal_()
    a[:300].normal_()
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    out = K5.gemm(a, b, version=version)
    for rows in (slice(0, 300), slice(M - 300, M)):
        assert _rel(out[rows], a[rows].double() @ b.double()) <= tolerance(torch.bfloat16)
    assert float(out[300:M - 300].abs().max()) == 0.0
    del a, out


# ---------------------------------------------------------------- the MLP, harness ---

def _mlp_args(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return cards.get("mlp").module.make_args(shape, dtype, torch.device("cuda"), g)


def _passes(args, version, monkeypatch):
    from equivalence.check import check_args
    monkeypatch.setenv(K5.ENV_VERSION, str(version))
    r = check_args("mlp", "cuda", args)
    assert r.passed, r.summary()


@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_harness_tiny(version, dtype, monkeypatch):
    from equivalence.check import check
    monkeypatch.setenv(K5.ENV_VERSION, str(version))
    for r in check("mlp", "cuda", dtype=dtype, device="cuda", size="tiny"):
        assert r.passed, r.summary()


@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("shape", [
    dict(rows=(3,), K=17, hidden=45, N=5),         # nothing a multiple of anything
    dict(rows=(3, 11), K=24, hidden=72, N=20),     # 3-D input
    dict(rows=(1000,), K=768, hidden=3072, N=768),  # GPT-2-like, M not a tile multiple
], ids=["3x17-45-5", "3d", "gpt2"])
def test_harness_odd_sizes(version, dtype, shape, monkeypatch):
    _passes(_mlp_args(shape, dtype, seed=shape["K"]), version, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_harness_strided_views(version, dtype, monkeypatch):
    """x a transposed view of a 3-D buffer, w1 column-major, w2 and the biases slices."""
    shape = dict(rows=(5, 7), K=40, hidden=56, N=24)
    args = _mlp_args(shape, dtype, seed=11)
    args["x"] = args["x"].transpose(0, 1).contiguous().transpose(0, 1)
    args["w1"] = args["w1"].t().contiguous().t()
    w2 = torch.zeros(shape["N"], shape["hidden"] + 3, device="cuda", dtype=args["w2"].dtype)
    w2[:, 1:1 + shape["hidden"]] = args["w2"]
    args["w2"] = w2[:, 1:1 + shape["hidden"]]
    b1 = torch.zeros(2 * shape["hidden"], device="cuda", dtype=args["b1"].dtype)
    b1[::2] = args["b1"]
    args["b1"] = b1[::2]
    _passes(args, version, monkeypatch)


# ------------------------------------------------------------------------- opcheck ----

@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
def test_opcheck_every_op(version):
    ops = K5._ops()
    dt = torch.bfloat16 if version in K5.TENSOR_CORE_VERSIONS else torch.float32
    a = torch.randn(33, 40, device="cuda", dtype=dt)
    w = torch.randn(24, 40, device="cuda", dtype=dt)
    bias = torch.randn(24, device="cuda", dtype=dt)
    pre = torch.randn(33, 24, device="cuda", dtype=dt)
    c = torch.randn(33, 24, device="cuda", dtype=dt)
    w2 = torch.randn(16, 24, device="cuda", dtype=dt)
    b2 = torch.randn(16, device="cuda", dtype=dt)
    cases = [
        (ops.gemm_matmul, (a, w.t(), bias, True, False, version)),
        (ops.gemm_matmul, (a, w.t(), None, False, True, version)),
        (ops.gemm_matmul_gelu_save, (a, w.t(), bias, version)),
        (ops.gemm_matmul_gelu_grad, (a, w.t(), pre, version)),
        (ops.gemm_matmul_accumulate, (c, a, w.t(), bias, version)),
        (ops.gemm_column_sum, (pre, False, version)),
    ]
    # Layouts version 4 cannot read directly (A column-major, B as a row-major (K, N)):
    # the op copies them itself (mlp_binding.cpp k_major), as torch.compile may pass them.
    a_cm, b_rm = a.t().contiguous().t(), w.t().contiguous()
    cases += [(ops.gemm_matmul, (a_cm, b_rm, bias, True, False, version)),
              (ops.gemm_matmul_gelu_grad, (a_cm, b_rm, pre, version))]
    leaves = [t.detach().clone().requires_grad_() for t in (a, w, bias, w2, b2)]
    cases.append((ops.mlp_fwd, (*leaves, version)))  # with its autograd registration
    for op, args in cases:
        torch.library.opcheck(op, args)


@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
def test_ops_take_any_operand_layout(version):
    """The same product from every layout of A and B: bitwise where the kernel reads the
    same values in the same order (version 4 copies to its layout first), and within the
    dtype's bound of the float64 product otherwise."""
    ops = K5._ops()
    dt = torch.bfloat16 if version in K5.TENSOR_CORE_VERSIONS else torch.float32
    a = torch.randn(37, 40, device="cuda", dtype=dt)
    w = torch.randn(24, 40, device="cuda", dtype=dt)
    want = (a.double() @ w.double().t())
    base = ops.gemm_matmul(a, w.t(), None, False, False, version)
    for a_l in (a, a.t().contiguous().t()):
        for b_l in (w.t(), w.t().contiguous()):
            got = ops.gemm_matmul(a_l, b_l, None, False, False, version)
            if version in K5.TENSOR_CORE_VERSIONS:
                assert torch.equal(got, base)
            err = float((got.double() - want).norm() / want.norm())
            assert err < (1e-2 if dt == torch.bfloat16 else 1e-5), (version, a_l.stride(), b_l.stride(), err)


def _kernels_launched(fn) -> list[str]:
    """The names of the GPU kernels (and copies) one call of fn() runs."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("shape", [(200, 72, 136), (1024, 768, 3072), (64, 8, 64), (136, 1000, 264)],
                         ids=lambda s: "x".join(map(str, s)))
def test_version_6_reads_transposed_operands_as_they_lie(dtype, shape):
    """Version 6 takes A stored (K, M) with M contiguous and B stored (K, N) with N contiguous
    as they lie (MN-major tiles, wgmma's imm-trans): one kernel, no copy, and the same bits
    as the K-major product (the same k16 slices, added in the same order), for the plain
    product and the bias + GELU epilogue, with M, N and K tails."""
    if not K5.versions.on_hopper():
        pytest.skip("version 6 runs on sm_90 only")
    M, K, N = shape
    ops = K5._ops()
    g = torch.Generator(device="cpu").manual_seed(M + K + N)
    a = torch.randn(M, K, generator=g).to("cuda", dtype)
    w = (torch.randn(N, K, generator=g) * K ** -0.5).to("cuda", dtype)
    bias = torch.randn(N, generator=g).to("cuda", dtype)
    a_mn, b_mn = a.t().contiguous().t(), w.t().contiguous()  # strides (1, M) and (N, 1)
    for gelu, b_ in ((False, None), (True, bias)):
        want = ops.gemm_matmul(a, w.t(), b_, gelu, False, 6)
        for a_l, b_l in ((a_mn, w.t()), (a, b_mn), (a_mn, b_mn)):
            got = ops.gemm_matmul(a_l, b_l, b_, gelu, False, 6)
            assert torch.equal(got, want), (shape, a_l.stride(), b_l.stride(), gelu)
    ref = a.double() @ w.double().t()
    got = ops.gemm_matmul(a_mn, b_mn, None, False, False, 6)
    assert float((got.double() - ref).norm() / ref.norm()) < tolerance(dtype)
    launched = _kernels_launched(lambda: ops.gemm_matmul(a_mn, b_mn, None, False, False, 6))
    assert len(launched) == 1 and "gemm_v6_kernel" in launched[0], launched


@pytest.mark.gpu
@pytest.mark.parametrize("tile", sorted(K5.V4_TILES))
def test_mlp_forward_with_each_v4_tile(tile):
    # The tiles `levels bench` sweeps (mlp_forward's `tile` argument) compute the forward
    # `mlp` computes: every tile reads the same values in the same order along K.
    args = _mlp_args(dict(rows=(300,), K=64, hidden=256, N=72), torch.bfloat16, seed=tile)
    t = [args[n] for n in ("x", "w1", "b1", "w2", "b2")]
    with torch.no_grad():
        want = K5.mlp(*t, version=4)
        got = K5.mlp_forward(*t, version=4, tile=tile)
    assert got.shape == want.shape
    err = float((got.double() - want.double()).norm() / want.double().norm())
    assert err < 1e-2, (tile, err)


@pytest.mark.gpu
def test_compiled_module_calls_the_level_5_mlp():
    import levels

    level = levels.get("cuda")
    args = _mlp_args(dict(rows=(64,), K=64, hidden=128, N=32), torch.bfloat16, seed=5)
    names = ("x", "w1", "b1", "w2", "b2")
    fn = torch.compile(lambda *t: level.mlp(*t), fullgraph=True)
    eager = level.mlp(*(args[n] for n in names))
    assert torch.equal(fn(*(args[n] for n in names)), eager)
