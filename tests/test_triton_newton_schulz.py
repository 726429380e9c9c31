"""Level 4 (Triton): newton_schulz, the symmetric X X^T kernel and the fused update.

Without a GPU these run in Triton's CPU interpreter (sizes stay tiny). The whole-function
cases go through the harness's check (the float64 iteration at the card's bound, Muon's
singular-value band, NaN-poisoned allocations, the memory around strided views watched);
the symmetric kernel is checked on its own: every tile of the lower triangle launched once,
the upper triangle written by the mirror stores only. @pytest.mark.gpu tests repeat this on
CUDA at the model shapes.
"""

from __future__ import annotations

import pytest
import torch

# First: without a GPU this sets TRITON_INTERPRET=1 before anything imports triton.
import levels.triton as L4  # isort: skip
from equivalence import cards
from equivalence.check import check, check_args

pytest.importorskip("triton")
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from triton_kernels import newton_schulz as K  # noqa: E402

COMPONENT = "newton_schulz"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _args(rows, cols, dtype=torch.float32, seed=0, **extra):
    g = torch.Generator().manual_seed(seed)
    args = cards.get(COMPONENT).module.make_args(dict(rows=rows, cols=cols), dtype,
                                                 torch.device(DEVICE), g)
    return args | extra


def _passes(args):
    r = check_args(COMPONENT, "triton", args)
    assert r.passed, r.summary()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])  # float16: the GPU tests
def test_harness_tiny(dtype):
    # both variants (one matrix, a batch of cards' BATCH) in both layouts
    results = check(COMPONENT, "triton", dtype=dtype, device=DEVICE, size="tiny")
    assert len(results) == len(cards.LAYOUTS) * len(cards.get(COMPONENT).variants)
    assert {r.variant for r in results} == {"default", "batched"}
    for r in results:
        assert r.status == "pass", f"{r.layout}: {r.status} {r.reason} {r.worst}"
        assert any("singular values" in c.name for c in r.comparisons)  # the band was checked


@pytest.mark.parametrize("rows, cols", [(1, 1), (1, 37), (37, 1), (45, 50)])
def test_odd_shapes_wide_and_tall(rows, cols):
    _passes(_args(rows, cols, seed=rows * cols))


@pytest.mark.parametrize("steps", [0, 1, 2, 3])
def test_every_number_of_steps(steps):
    # 0: the normalization alone (the update kernel with K = 0); 1: G in, the result out;
    # 2 and 3: the iterates' ping-pong buffers
    _passes(_args(18, 30, steps=steps, seed=steps))


def test_other_coefficients():
    # the cubic Newton-Schulz iteration (1.5, -0.5, 0): b and c reach the kernels as given
    _passes(_args(12, 20, coefficients=(1.5, -0.5, 0.0), steps=3))


def test_views_are_read_where_they_lie():
    # a transposed gradient (column-major) and a slice with both strides > 1
    G = torch.randn(30, 20, device=DEVICE).t()
    _passes(dict(G=G, steps=5, coefficients=(3.4445, -4.7750, 2.0315), eps=1e-7))
    big = torch.full((50, 90), float("nan"), device=DEVICE)
    big[::2, 1::3] = torch.randn(25, 30, device=DEVICE)
    _passes(dict(G=big[::2, 1::3], steps=2, coefficients=(3.4445, -4.7750, 2.0315), eps=1e-7))


def _batch_args(G, steps=5):
    return dict(G=G, steps=steps, coefficients=(3.4445, -4.7750, 2.0315), eps=1e-7)


def test_batch_each_matrix_its_own_norm():
    # matrices 1e-3 to 1e3 in size: one norm for the whole batch would leave the small ones
    # far from orthogonal (the band check fails); tall ones, iterated on G.mT
    g = torch.Generator().manual_seed(5)
    G = torch.randn(3, 26, 17, generator=g) * torch.tensor([1e-3, 1.0, 1e3]).view(3, 1, 1)
    _passes(_batch_args(G.to(DEVICE)))


@pytest.mark.parametrize("steps", [0, 2])
def test_batch_views_and_steps(steps):
    # a transposed batch (each matrix column-major), a broadcast batch (batch stride 0: one
    # gradient three times, read-only), and the iterates' buffers at 0 and 2 steps
    base = torch.randn(2, 19, 11, device=DEVICE)
    _passes(_batch_args(base.mT, steps))
    _passes(_batch_args(torch.randn(1, 9, 14, device=DEVICE).expand(3, -1, -1), steps))


def test_empty_batch_launches_nothing(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a kernel was launched for an empty batch")

    monkeypatch.setattr(K, "inverse_norm", refuse)
    out = L4.newton_schulz(torch.randn(0, 5, 8, device=DEVICE))
    assert out.shape == (0, 5, 8)


def test_batch_beyond_the_grid_is_refused_by_name():
    G = torch.randn(1, 2, 3, device=DEVICE).expand(K.MAX_BATCH + 1, -1, -1)
    with pytest.raises(ValueError, match=r"newton_schulz: argument 'G' must hold at most 65535"):
        L4.newton_schulz(G)


def test_float64_is_refused_by_name():
    with pytest.raises(TypeError, match=r"newton_schulz: argument 'G'.*float64"):
        L4.newton_schulz(torch.randn(4, 6, dtype=torch.float64, device=DEVICE))


@pytest.mark.parametrize("M, K_", [(1, 5), (37, 21), (70, 40)])
def test_symmetric_product_writes_both_triangles(M, K_):
    # the output starts as NaN: an element neither a tile nor its mirror wrote stays NaN
    x = torch.randn(M, K_, device=DEVICE)
    out = torch.full((M, M), float("nan"), device=DEVICE)
    K.symmetric_product(x, out=out)
    ref = x.double() @ x.double().t()
    assert torch.isfinite(out).all()
    assert ((out.double() - ref).norm() / ref.norm()) < 1e-6
    assert torch.equal(out.tril(-1), out.t().tril(-1))  # the mirror is the same bits


def test_symmetric_product_epilogue():
    # B = b A + c A A, A symmetric: the (alpha, beta) epilogue reading A's tile
    x = torch.randn(21, 13, device=DEVICE)
    A = (x @ x.t()).contiguous()
    B = K.symmetric_product(A, A, alpha=2.0315, beta=-4.775)
    ref = -4.775 * A.double() + 2.0315 * A.double() @ A.double()
    assert ((B.double() - ref).norm() / ref.norm()) < 1e-6


@triton.jit
def _tile_of(out_ptr):
    pid = tl.program_id(0)
    i, j = K.lower_tile(pid)
    tl.store(out_ptr + 2 * pid, i)
    tl.store(out_ptr + 2 * pid + 1, j)


def test_lower_tile_launches_each_tile_of_the_triangle_once():
    # 40 tiles a side: 820 programs, half of the 1600 a GEMM launches
    tiles = 40
    programs = tiles * (tiles + 1) // 2
    out = torch.full((programs, 2), -1, dtype=torch.int32, device=DEVICE)
    _tile_of[(programs,)](out)
    got = [tuple(r) for r in out.tolist()]
    assert sorted(got) == [(i, j) for i in range(tiles) for j in range(i + 1)]
    assert got == sorted(got)  # row by row: the order the kernel documents


@triton.jit
def _banded_tile_of(out_ptr, T, GROUP: tl.constexpr):
    pid = tl.program_id(0)
    i, j = K.banded_lower_tile(pid, T, GROUP)
    tl.store(out_ptr + 2 * pid, i)
    tl.store(out_ptr + 2 * pid + 1, j)


@pytest.mark.parametrize("tiles, group", [(1, 8), (7, 8), (8, 8), (21, 8), (40, 8), (13, 4),
                                          (40, 1)])
def test_banded_lower_tile_launches_each_tile_once_band_by_band(tiles, group):
    # bands of `group` tile rows (the last one shorter when tiles is no multiple of it), each
    # its rectangle column by column, then its own triangle
    programs = tiles * (tiles + 1) // 2
    out = torch.full((programs, 2), -1, dtype=torch.int32, device=DEVICE)
    _banded_tile_of[(programs,)](out, tiles, GROUP=group)
    got = [tuple(r) for r in out.tolist()]
    assert sorted(got) == [(i, j) for i in range(tiles) for j in range(i + 1)]
    assert got == K.banded_order(tiles, group)


@pytest.mark.parametrize("M, K_, want", [(4096, 4096, 1), (4096, 11008, K.SYM_GROUP),
                                         (8192, 8192, K.SYM_GROUP), (1024, 65536, 1),
                                         (512, 1 << 20, 1)])
def test_bands_where_x_does_not_fit_in_l2(M, K_, want):
    # bf16 on an H100 (50 MB of L2): 32 MB row by row, 86 and 128 MB in bands; a matrix of 8
    # tile rows or fewer is one band already (1024 rows: 8 tiles of 128; 512 rows, any K)
    tiles = -(-M // 128)
    assert K._sym_group(tiles, M * K_ * 2, "cpu") == want


def test_symmetric_product_in_bands_is_the_same_bits():
    x = torch.randn(100, 24, device=DEVICE)
    plain = K.symmetric_product(x)
    banded = K.symmetric_product(x, group=2)
    assert torch.equal(plain, banded)


# ---- on a GPU -------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("rows, cols", [(768, 768), (2304, 768), (1000, 3000), (4096, 4096)])
def test_gpu_model_shapes(dtype, rows, cols):
    _passes(_args(rows, cols, dtype=dtype, seed=rows + cols))


@pytest.mark.gpu
def test_gpu_batch_far_apart_matrices_are_computed():
    # two small matrices 2**31 elements apart (8 GB of float32): the batch offset is 64-bit
    # in every kernel, so Level 4 computes where each matrix's own offsets fit 32 bits (the
    # contract checks one matrix, not the batch). GPU only: the interpreter copies the
    # whole storage to the host. Not through the harness: it watches the memory around a
    # strided view by copying all of it (64 GB here). The compact copy of the same batch is
    # what the harness checks elsewhere, and the kernels are deterministic, so the far-apart
    # batch must give the same bits (a 32-bit batch offset would read other memory).
    rows, cols, apart = 6, 10, 2 ** 31
    storage = torch.empty(apart + rows * cols, device="cuda")
    G = storage.as_strided((2, rows, cols), (apart, cols, 1))
    G.copy_(torch.randn(2, rows, cols, device="cuda"))
    far = L4.newton_schulz(G)
    assert torch.isfinite(far).all()
    assert torch.equal(far, L4.newton_schulz(G.contiguous()))


@pytest.mark.gpu
def test_gpu_batched_model_shapes():
    # GPT-2 small's c_attn of 12 blocks in bf16, a batch of Llama-sized squares
    for shape in [(12, 2304, 768), (3, 4096, 4096)]:
        g = torch.Generator().manual_seed(sum(shape))
        _passes(_batch_args(cards.randn(shape, g, torch.bfloat16, "cuda")))


@pytest.mark.gpu
@pytest.mark.parametrize("M", [4096, 8192])
def test_gpu_symmetric_product_bf16(M):
    x = torch.randn(M, 1024, device="cuda", dtype=torch.bfloat16)
    out = torch.full((M, M), float("nan"), device="cuda", dtype=torch.bfloat16)
    K.symmetric_product(x, out=out)
    ref = torch.matmul(x.float(), x.float().t())
    assert torch.isfinite(out).all()
    assert ((out.float() - ref).norm() / ref.norm()) < 1e-2
