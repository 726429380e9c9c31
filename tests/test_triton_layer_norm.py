"""Level 4 (Triton): layer_norm, forward and backward.

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

COMPONENT = "layer_norm"
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


@pytest.mark.parametrize("N", [1, 7, 300])
def test_layer_norm_odd_widths(N):
    _passes("layer_norm", _args("layer_norm", dict(rows=(3,), N=N), torch.float32, seed=N))


def test_layer_norm_strided_rows():
    args = _args("layer_norm", dict(rows=(4, 5), N=33), torch.float32, seed=2)
    args["x"] = args["x"].transpose(0, 1).contiguous().transpose(0, 1)  # rows not evenly strided
    _passes("layer_norm", args)


def test_layer_norm_rejects_rows_too_wide_for_registers():
    x = torch.randn(1, 65537, device=DEVICE)
    w = torch.ones(65537, device=DEVICE)
    with pytest.raises(ValueError, match=r"layer_norm: argument 'x'.*65536.*65537"):
        L4.layer_norm(x, w, w)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows,N", [((1000,), 1023), ((3, 77), 4097), ((513,), 1), ((64,), 16384)])
def test_layer_norm_gpu(dtype, rows, N):
    _passes("layer_norm", _args("layer_norm", dict(rows=rows, N=N), dtype, seed=N))


def _pinned(tiling=None, backward_tiling=None):
    """triton_kernels.layer_norm.layer_norm with its tiles pinned (its `tiling` and
    `backward_tiling` arguments), as a function the harness checks (check_args(fn=))."""
    import triton_kernels.layer_norm as kernels

    def layer_norm(x, weight, bias, eps=1e-5):
        return kernels.layer_norm(x, weight, bias, eps, tiling=tiling,
                                  backward_tiling=backward_tiling)
    return layer_norm


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("tiling", [(2, 8, 4), (4, 16, 2), (1, 4, 8)])
def test_layer_norm_backward_tilings(dtype, tiling):
    # The tilings the benchmark sweeps (passed as arguments) must compute the same
    # gradients (rows not a multiple of BLOCK_M or of the programs: the last program's
    # share is ragged). The interpreter honours a pinned tiling too, at a CPU-sized shape.
    rows, N = ((777,), 1000) if DEVICE == "cuda" else ((37,), 100)
    args = _args("layer_norm", dict(rows=rows, N=N), dtype, seed=tiling[0])
    r = check_args("layer_norm", args, fn=_pinned(backward_tiling=tiling))
    assert r.passed, r.summary()


@pytest.mark.parametrize("tiling", [(1, 4), (4, 8)])
def test_layer_norm_forward_tilings(tiling):
    # The forward sweep's tilings, as arguments; the next call without one is the rule's.
    import triton_kernels.layer_norm as kernels
    rows, N = ((777,), 1000) if DEVICE == "cuda" else ((37,), 100)
    args = _args("layer_norm", dict(rows=rows, N=N), torch.float32, seed=tiling[0])
    r = check_args("layer_norm", args, fn=_pinned(tiling=tiling))
    assert r.passed, r.summary()
    assert not hasattr(kernels, "FORWARD_TILING") and not hasattr(kernels, "BACKWARD_TILING")


def _spy_on(monkeypatch, kernels, names):
    """The launches of `names` (kernels of triton_kernels.layer_norm), in order."""
    launched = []
    for name in names:
        class Spy:
            def __getitem__(self, grid, real=getattr(kernels, name), name=name):
                launched.append(name)
                return real[grid]
        monkeypatch.setattr(kernels, name, Spy())
    return launched


WIDE_KERNELS = ("layer_norm_fwd_wide_kernel", "layer_norm_row_dots_kernel",
                "layer_norm_bwd_wide_kernel")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,strided", [((3,), False), ((2, 3), False), ((5,), True)])
def test_layer_norm_wide_rows_walk_in_chunks(monkeypatch, dtype, rows, strided):
    # Rows wider than FWD_WIDE and WIDE (32768 and 16384 on a GPU, 256 in the interpreter)
    # go in pieces: the statistics merged chunk by chunk, the backward's row dots in a kernel
    # of their own. A ragged last chunk, several row programs, and (strided) rows that start
    # one element into a wider buffer, so no row is 16-byte aligned.
    import triton_kernels.layer_norm as kernels
    N = kernels.FWD_WIDE + kernels.FWD_CHUNK + 3
    launched = _spy_on(monkeypatch, kernels, WIDE_KERNELS + ("layer_norm_fwd_kernel",))
    args = _args("layer_norm", dict(rows=rows, N=N), dtype, seed=len(rows))
    if strided:
        wider = torch.randn(*rows, N + 5, device=DEVICE, dtype=dtype)
        args["x"] = wider[..., 1:N + 1]
    _passes("layer_norm", args)
    assert set(launched) == set(WIDE_KERNELS), launched  # the whole-row kernel never ran


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_norm_gpu_widest_row(dtype):
    # MAX_WIDTH: a 65536-wide row walked in CHUNK-column pieces (the wide path).
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


def test_layer_norm_of_no_rows_is_torchs_and_launches_nothing(monkeypatch):
    # a batch of 0: an empty y, an empty dx and zero weight and bias gradients (F.layer_norm's)
    import triton_kernels.layer_norm as kernels

    def refuse(name):
        class Refuse:
            def __getitem__(self, grid):
                raise AssertionError(f"{name} launched with grid {grid} on no rows")
        return Refuse()
    for name in ("layer_norm_fwd_kernel", "layer_norm_bwd_kernel", "sum_partials_kernel"):
        monkeypatch.setattr(kernels, name, refuse(name))
    x = torch.randn(0, 3, 40, device=DEVICE, requires_grad=True)
    w = torch.randn(40, device=DEVICE, requires_grad=True)
    b = torch.randn(40, device=DEVICE, requires_grad=True)
    y = L4.layer_norm(x, w, b)
    assert y.shape == x.shape
    y.sum().backward()
    assert x.grad.shape == x.shape
    assert torch.equal(w.grad, torch.zeros(40, device=DEVICE))
    assert torch.equal(b.grad, torch.zeros(40, device=DEVICE))
