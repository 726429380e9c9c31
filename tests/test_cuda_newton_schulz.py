"""Level 5 (CUDA): newton_schulz, versions 1-5 of cuda_kernels/newton_schulz.cu.

On a CPU: the level says why it cannot run (the harness's skip), the kernel op's contract
is held by its CPU twin in tests/test_cuda_autograd_cpu.py, and gemm.cu's symmetric launch
order (cuda_kernels/tile_order.h, compiled by g++) takes every tile once. On a GPU (marked `gpu`):
the harness at every dtype and layout, odd and model shapes wide and tall, every number of
steps, views read through their strides, and the symmetric kernel's output never leaving a
NaN where a mirror store should have written. Version 2 (Hopper wgmma through gemm.cu's
batched version-5 GEMM) is checked the same way at odd sizes (rows not a multiple of 8 or of
the 128-row tile, K tails), wide and tall, batched, steps 0/1/5, against the float64
reference with the card's bound, with the memory the result lands in filled with NaN first;
every version-2 test runs versions 3, 4 and 5 too (the same plan on gemm.cu's version-6 and
persistent version-7 GEMMs, and version 3 with X read as the MN-major operand of the update
instead of a kept X^T), which must also give version 2's bits.
"""

from __future__ import annotations

import pytest
import torch

import levels
from cuda_kernels import newton_schulz as K5
from equivalence import cards
from equivalence.check import check, check_args

COMPONENT = "newton_schulz"
COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def _passes(args):
    r = check_args(COMPONENT, "cuda", args)
    assert r.passed, r.summary()


_TILE_SHIM = r"""
#include "tile_order.h"
extern "C" void tiles(long long T, long long group, long long* out) {
  const long long n = T * (T + 1) / 2;
  for (long long p = 0; p < n; ++p) {
    int64_t i, j;
    if (group > 1) levels_tiles::banded_lower_tile(p, T, group, i, j);
    else levels_tiles::lower_tile(p, i, j);
    out[2 * p] = i;
    out[2 * p + 1] = j;
  }
}
extern "C" long long band(long long T, long long x_bytes, long long l2) {
  return levels_tiles::sym_band(T, x_bytes, l2);
}
"""


@pytest.fixture(scope="module")
def tile_order(host_library):
    """cuda_kernels/tile_order.h (gemm.cu's symmetric launch order), compiled by g++."""
    import ctypes
    lib = host_library(_TILE_SHIM, "tile-order")
    lib.band.restype = ctypes.c_longlong
    return lib


@pytest.mark.parametrize("T, group", [(1, 8), (8, 8), (9, 8), (32, 8), (63, 8), (13, 4), (40, 1)])
def test_symmetric_launch_order_takes_each_tile_once(tile_order, T, group):
    # Level 5's symmetric schedule, row by row (group 1) or in bands of `group` tile rows:
    # every tile on or below the diagonal once, in the order tile_order.h states (the same
    # order as Level 4's banded_lower_tile)
    import ctypes
    n = T * (T + 1) // 2
    out = (ctypes.c_longlong * (2 * n))()
    tile_order.tiles(T, group, out)
    got = [(out[2 * p], out[2 * p + 1]) for p in range(n)]
    from triton_kernels.newton_schulz import banded_order  # here: Triton's mode is conftest's
    assert got == banded_order(T, group)
    assert sorted(got) == [(i, j) for i in range(T) for j in range(i + 1)]


def test_symmetric_launch_bands_where_x_outgrows_l2(tile_order):
    l2 = 50 << 20  # an H100's
    assert tile_order.band(32, 4096 * 4096 * 2, l2) == 1      # 32 MB: row by row
    assert tile_order.band(32, 4096 * 11008 * 2, l2) == 8     # 86 MB: bands
    assert tile_order.band(8, 1024 * 65536 * 2, l2) == 1      # one band's worth of tile rows


def test_without_a_gpu_the_level_says_why():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    (r, *_) = check(COMPONENT, "cuda", layout="contiguous")
    assert r.status == "skip" and "GPU" in r.reason


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("size", ["tiny", "small"])
def test_gpu_harness(dtype, size):
    for r in check(COMPONENT, "cuda", dtype=dtype, device="cuda", size=size):
        assert r.status == "pass", f"{r.layout}: {r.status} {r.reason} {r.worst}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows, cols", [(1, 1), (1, 300), (300, 1), (33, 65), (768, 3072),
                                        (2304, 768), (4096, 4096)])
def test_gpu_shapes(dtype, rows, cols):
    g = torch.Generator().manual_seed(rows + cols)
    G = cards.randn((rows, cols), g, dtype, "cuda")
    _passes(dict(G=G, steps=5, coefficients=COEFFICIENTS, eps=1e-7))


@pytest.mark.gpu
@pytest.mark.parametrize("steps", [0, 1, 2, 3, 6])
def test_gpu_every_number_of_steps(steps):
    G = torch.randn(70, 130, device="cuda")
    _passes(dict(G=G, steps=steps, coefficients=COEFFICIENTS, eps=1e-7))


@pytest.mark.gpu
def test_gpu_views_are_read_where_they_lie():
    _passes(dict(G=torch.randn(90, 50, device="cuda").t(), steps=5, coefficients=COEFFICIENTS,
                 eps=1e-7))
    big = torch.full((100, 300), float("nan"), device="cuda")
    big[::2, 1::3] = torch.randn(50, 100, device="cuda")
    _passes(dict(G=big[::2, 1::3], steps=5, coefficients=COEFFICIENTS, eps=1e-7))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(2, 1, 300), (3, 33, 65), (5, 65, 33), (12, 2304, 768),
                                   (4, 4096, 4096)])
def test_gpu_batched_shapes(dtype, shape):
    # each matrix its own norm: the batch's matrices 1e-3 to 1e3 apart in size
    g = torch.Generator().manual_seed(sum(shape))
    G = cards.randn(shape, g, dtype, "cuda")
    G = G * torch.logspace(-3, 3, shape[0], device="cuda", dtype=dtype).view(-1, 1, 1)
    _passes(dict(G=G, steps=5, coefficients=COEFFICIENTS, eps=1e-7))


@pytest.mark.gpu
@pytest.mark.parametrize("steps", [0, 1, 3])
def test_gpu_batched_views_and_steps(steps):
    # a transposed batch, a broadcast one (batch stride 0), padded rows
    _passes(dict(G=torch.randn(3, 50, 90, device="cuda").mT, steps=steps,
                 coefficients=COEFFICIENTS, eps=1e-7))
    _passes(dict(G=torch.randn(1, 40, 70, device="cuda").expand(4, -1, -1), steps=steps,
                 coefficients=COEFFICIENTS, eps=1e-7))
    big = torch.full((3, 60, 100), float("nan"), device="cuda")
    big[:, :, 5:85] = torch.randn(3, 60, 80, device="cuda")
    _passes(dict(G=big[:, :, 5:85], steps=steps, coefficients=COEFFICIENTS, eps=1e-7))


@pytest.mark.gpu
def test_gpu_batch_edges():
    fn = levels.get("cuda").newton_schulz
    assert fn(torch.randn(0, 8, 16, device="cuda")).shape == (0, 8, 16)
    with pytest.raises(ValueError, match="newton_schulz: argument 'G' must be a batch of at most"):
        fn(torch.randn(1, 2, 3, device="cuda").expand(65536, -1, -1))


@pytest.mark.gpu
def test_gpu_batched_agrees_with_level_4_and_with_one_call_per_matrix():
    G = torch.randn(6, 512, 1536, device="cuda", dtype=torch.bfloat16)
    ours = levels.get("cuda").newton_schulz(G)
    l4 = levels.get("triton").newton_schulz(G).float()
    assert ((ours.float() - l4).norm() / l4.norm()) < 3e-2
    loop = torch.stack([levels.get("cuda").newton_schulz(g) for g in G])
    assert torch.equal(ours, loop)  # the same kernels, the same order of sums: the same bits


@pytest.mark.gpu
def test_gpu_agrees_with_level_4_in_bf16():
    G = torch.randn(512, 1536, device="cuda", dtype=torch.bfloat16)
    ours = levels.get("cuda").newton_schulz(G).float()
    l4 = levels.get("triton").newton_schulz(G).float()
    assert ((ours - l4).norm() / l4.norm()) < 3e-2


# ---- version 2 (sm_90 only) ----

def _hopper():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


hopper = pytest.mark.skipif(not _hopper(), reason="version 2 needs an sm_90 GPU (wgmma)")


@pytest.fixture(params=[2, 3, 4, 5], ids=["v2", "v3", "v4", "v5"])
def v2(request, monkeypatch):
    """Every Level 5 call in the test runs version 2, then version 3 (the same plan on gemm.cu's
    version-6 GEMM: TMA, warp specialization), then version 4 (on the persistent version-7
    GEMM: batches and products of many tiles per block), then version 5 (version 3 reading X
    as the update's MN-major operand, no X^T); the caching allocator's free blocks hold NaN,
    so the result (allocated by the op) starts as NaN wherever it lands in them."""
    monkeypatch.setenv(K5.ENV_VERSION, str(request.param))
    poison = torch.full((64 << 20,), float("nan"), device="cuda")  # 256 MB of NaN, then freed
    del poison


def test_version_5_is_the_default_on_hopper_only(monkeypatch):
    monkeypatch.delenv(K5.ENV_VERSION, raising=False)
    expected = 5 if _hopper() else 1
    assert K5.default_version() == K5.resolve_version() == expected
    assert K5.HOPPER_VERSION == 5 and K5.DEFAULT_VERSION == 1


@pytest.mark.gpu
@pytest.mark.skipif(_hopper() or not torch.cuda.is_available(), reason="needs a GPU other than sm_90")
@pytest.mark.parametrize("version", [2, 3, 4, 5])
def test_gpu_version_2_elsewhere_is_a_clear_error(version):
    with pytest.raises(RuntimeError, match="wgmma"):
        K5.newton_schulz(torch.randn(64, 64, device="cuda", dtype=torch.bfloat16), 5, 3.4445,
                         -4.7750, 2.0315, 1e-7, version=version)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("size", ["tiny", "small"])
def test_gpu_v2_harness(v2, dtype, size):
    for r in check(COMPONENT, "cuda", dtype=dtype, device="cuda", size=size):
        assert r.status == "pass", f"{r.layout}: {r.status} {r.reason} {r.worst}"


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(33, 70), (70, 33), (100, 1000), (1000, 100), (257, 513),
                                   (513, 257), (1, 300), (300, 1), (128, 128), (129, 200),
                                   (3, 33, 70), (2, 257, 513), (4, 1000, 100), (5, 129, 70)])
def test_gpu_v2_odd_shapes(v2, dtype, shape):
    g = torch.Generator().manual_seed(sum(shape))
    G = cards.randn(shape, g, dtype, "cuda")
    if len(shape) == 3:  # each matrix its own norm
        G = G * torch.logspace(-2, 2, shape[0], device="cuda", dtype=dtype).view(-1, 1, 1)
    _passes(dict(G=G, steps=5, coefficients=COEFFICIENTS, eps=1e-7))


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("steps", [0, 1, 2, 5])
def test_gpu_v2_steps_and_views(v2, dtype, steps):
    kw = dict(steps=steps, coefficients=COEFFICIENTS, eps=1e-7)
    _passes(dict(G=torch.randn(90, 50, device="cuda", dtype=dtype).t(), **kw))  # tall, transposed
    _passes(dict(G=torch.randn(50, 90, device="cuda", dtype=dtype).t(), **kw))
    big = torch.full((100, 300), float("nan"), device="cuda", dtype=dtype)
    big[::2, 1::3] = torch.randn(50, 100, device="cuda", dtype=dtype)
    _passes(dict(G=big[::2, 1::3], **kw))  # no stride of 1 anywhere
    _passes(dict(G=torch.randn(3, 50, 90, device="cuda", dtype=dtype).mT, **kw))
    _passes(dict(G=torch.randn(1, 40, 70, device="cuda", dtype=dtype).expand(4, -1, -1), **kw))


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(1024, 1024), (4, 768, 2304), (2304, 768)])
def test_gpu_v2_model_shapes(v2, dtype, shape):
    g = torch.Generator().manual_seed(sum(shape))
    _passes(dict(G=cards.randn(shape, g, dtype, "cuda"), steps=5, coefficients=COEFFICIENTS,
                 eps=1e-7))


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("version", [2, 3, 4, 5])
def test_gpu_v2_agrees_with_version_1_and_level_4_and_one_call_per_matrix(version):
    # 3 x 512 x 1536: batched and alone, the update runs 128x128 tiles (launch_hopper_batched
    # picks 128x256 only when they fill every SM), so each element sums in the same order
    G = torch.randn(3, 512, 1536, device="cuda", dtype=torch.bfloat16)
    v2 = K5.newton_schulz(G, 5, *COEFFICIENTS, 1e-7, version=version).float()
    v1 = K5.newton_schulz(G, 5, *COEFFICIENTS, 1e-7, version=1).float()
    l4 = levels.get("triton").newton_schulz(G).float()
    assert ((v2 - v1).norm() / v1.norm()) < 3e-2
    assert ((v2 - l4).norm() / l4.norm()) < 3e-2
    loop = torch.stack([K5.newton_schulz(g, 5, *COEFFICIENTS, 1e-7, version=version) for g in G])
    assert torch.equal(v2, loop.float())  # the same kernels per matrix: the same bits
    if version >= 3:  # the same MMAs in the same order as the version below's GEMM: the same bits
        # (version 5's update reads X MN-major where version 3 read X^T K-major: the same sums)
        below = 3 if version == 5 else version - 1
        assert torch.equal(v2, K5.newton_schulz(G, 5, *COEFFICIENTS, 1e-7, version=below).float())


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows, cols", [(1, 8), (130, 72), (300, 264), (1000, 512),
                                        (4096, 136)])  # 528 lower tiles: ~4 per persistent block
@pytest.mark.parametrize("version", [2, 3, 4, 5])
def test_gpu_v2_symmetric_product_alone(dtype, rows, cols, version):
    X = torch.randn(rows, cols, device="cuda", dtype=dtype)
    torch.full((64 << 20,), float("nan"), device="cuda")  # freed NaN blocks: A may land there
    A = K5.gram(X, version=version).double()
    ref = X.double() @ X.double().T
    assert torch.isfinite(A).all()
    assert ((A - ref).norm() / ref.norm()).item() < 1e-2  # one rounding of fp32 sums to the dtype
    tile = torch.arange(rows, device="cuda") // 128  # off the diagonal tiles: mirrored bit for bit
    off = tile[:, None] != tile[None, :]
    assert torch.equal(A[off], A.T[off])
    with pytest.raises(RuntimeError, match="cols % 8 == 0"):
        K5.gram(torch.randn(16, 12, device="cuda", dtype=dtype), version=version)
