"""Level 4 (Triton): rms_norm, forward and backward.

Without a GPU these run in Triton's CPU interpreter (sizes stay tiny). Every case goes
through the harness's own check (equivalence.check.check_args): outputs and both gradients
against the float64 reference at the dtype's fixed bound, with NaN-poisoned allocations and
the memory around strided views watched. @pytest.mark.gpu tests repeat this on CUDA at
fp16/bf16/fp32 with the model widths and odd sizes.
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

COMPONENT = "rms_norm"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _args(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return cards.get(COMPONENT).module.make_args(shape, dtype, torch.device(DEVICE), g)


def _passes(args, fn=None):
    r = check_args(COMPONENT, args, fn=fn) if fn else check_args(COMPONENT, "triton", args)
    assert r.passed, r.summary()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_harness_tiny(dtype):
    results = check(COMPONENT, "triton", dtype=dtype, device=DEVICE, size="tiny")
    assert len(results) == len(cards.get(COMPONENT).variants) * len(cards.LAYOUTS)
    for r in results:
        assert r.status == "pass", f"{r.variant} {r.layout}: {r.status} {r.reason} {r.worst}"


def test_float64_is_refused_by_name():
    args = _args(cards.get(COMPONENT).sizes["tiny"], torch.float64)
    with pytest.raises(TypeError, match=r"rms_norm: argument 'x'.*float64"):
        L4.rms_norm(**args)


@pytest.mark.parametrize("N", [1, 7, 300])
def test_odd_widths(N):
    _passes(_args(dict(rows=(3,), N=N), torch.float32, seed=N))


def test_rows_not_evenly_strided_and_a_transposed_view():
    # a (4, 5, 33) view whose leading dimensions do not flatten into one row stride: the
    # launcher copies it into rows (explicitly, in _rows), the kernels never see the gaps
    args = _args(dict(rows=(4, 5), N=33), torch.float32, seed=2)
    args["x"] = args["x"].transpose(0, 1).contiguous().transpose(0, 1)
    _passes(args)
    # the last dimension strided (x.t() of a (33, 6) buffer): a copy, never a stride-1 read
    args = _args(dict(rows=(6,), N=33), torch.float32, seed=3)
    args["x"] = args["x"].t().contiguous().t()
    assert args["x"].stride(-1) != 1
    _passes(args)


def test_no_statistics_are_written_without_a_backward():
    # under no_grad the forward launches with STATS=False and allocates y alone
    import triton_kernels.rms_norm as kernels
    args = _args(dict(rows=(5,), N=17), torch.float32)
    with torch.no_grad():
        y, _, stats = kernels._forward(args["x"], args["weight"], args["eps"], save=False)
    assert stats is y
    ref, = cards.get(COMPONENT).module.reference(args["x"].double(), args["weight"].double(),
                                                args["eps"])
    assert compare("out", y, ref, tolerance(torch.float32), torch.float32).ok


def test_rejects_rows_too_wide_for_registers():
    x = torch.randn(1, 65537, device=DEVICE)
    with pytest.raises(ValueError, match=r"rms_norm: argument 'x'.*65536.*65537"):
        L4.rms_norm(x, torch.ones(65537, device=DEVICE))


def _pinned(tiling=None, backward_tiling=None):
    """triton_kernels.rms_norm.rms_norm with its tiles pinned, as a function to check."""
    import triton_kernels.rms_norm as kernels

    def rms_norm(x, weight, eps=1e-6):
        return kernels.rms_norm(x, weight, eps, tiling=tiling, backward_tiling=backward_tiling)
    return rms_norm


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("tiling", [(2, 8, 4), (1, 4, 8)])
def test_backward_tilings(dtype, tiling):
    # rows not a multiple of BLOCK_M or of the programs: the last program's share is ragged,
    # and dweight adds up partial sums from every program
    rows, N = ((777,), 1000) if DEVICE == "cuda" else ((37,), 100)
    _passes(_args(dict(rows=rows, N=N), dtype, seed=tiling[0]), fn=_pinned(backward_tiling=tiling))


def test_second_stage_covers_the_sms():
    """The dweight partials are summed by sum_partials_kernel with enough programs to cover
    an H100's 132 SMs where the row allows (32 columns a program at the least), not 16 of
    256 columns at 4096 as before, and up to 8K partials a step; every tile is a power of two
    that the kernel's masks make safe for any N and P."""
    from triton_kernels.layer_norm import partials_tile_rule as tile
    assert tile(4096, 264, 1, 132) == (32, 256) and tile(4096, 264, 2, 132) == (32, 256)
    assert tile(16384, 264, 1, 132) == (64, 128) and tile(65536, 264, 2, 132) == (256, 32)
    assert tile(768, 264, 1, 132)[0] == 32 and tile(1, 3, 1, 132) == (1, 32)
    for N in (1, 33, 768, 1000, 4096, 5120, 65536):
        for P in (1, 2, 264, 1000):
            for halves in (1, 2):
                w, p = tile(N, P, halves, 132)
                assert w & (w - 1) == 0 and (w >= 32 or w >= N) and w <= 256
                assert p & (p - 1) == 0 and 32 <= p and w * p <= max(8192, 32 * w)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows,N", [((1000,), 1023), ((3, 77), 4096), ((2, 50), 3584), ((513,), 1),
                                    ((64,), 896), ((8,), 16384)])
def test_gpu(dtype, rows, N):
    _passes(_args(dict(rows=rows, N=N), dtype, seed=N))


@pytest.mark.gpu
@needs_gpu
def test_gpu_beyond_2_31_elements():
    # Row offsets past 2**31 elements: a 32-bit product would wrap and read row 0's memory.
    M, N = 2 ** 19 + 3, 4096
    x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    w = torch.rand(N, device="cuda", dtype=torch.bfloat16) + 0.5
    with torch.no_grad():
        y = L4.rms_norm(x, w)
    for rows in (slice(0, 2), slice(M - 3, M)):
        ref = cards.get(COMPONENT).module.reference(x[rows].double(), w.double())[0]
        assert compare("rows", y[rows], ref, tolerance(torch.bfloat16), torch.bfloat16).ok, rows
    del x, y
