"""Level 4 (Triton): rope, forward and backward.

Without a GPU these run in Triton's CPU interpreter (sizes stay tiny). Every case goes
through the harness (float64 reference, NaN-poisoned allocations, the memory around views
checked); the layouts are the ones a model hands over: q sliced out of a fused qkv buffer,
tables sliced out of a longer cache, a stride-0 gradient. @pytest.mark.gpu repeats them on
CUDA in fp16/bf16/fp32 at odd and model sizes.
"""

from __future__ import annotations

import pytest
import torch

import levels.triton as L4  # isort: skip  (first: the interpreter must be on before triton loads)
from equivalence import cards
from equivalence.check import check, check_args

pytest.importorskip("triton")

COMPONENT = "rope"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _args(shape, dtype, interleaved=False, seed=0, device=DEVICE):
    g = torch.Generator().manual_seed(seed)
    args = cards.get(COMPONENT).module.make_args(shape, dtype, torch.device(device), g)
    return args | {"interleaved": interleaved}


def _passes(args, level="triton"):
    r = check_args(COMPONENT, level, args)
    assert r.passed, r.summary()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_harness_tiny(dtype):
    results = check(COMPONENT, "triton", dtype=dtype, device=DEVICE, size="tiny")
    assert len(results) == len(cards.get(COMPONENT).variants) * len(cards.LAYOUTS)
    for r in results:
        assert r.status == "pass", f"{r.variant} {r.layout}: {r.status} {r.reason} {r.worst}"


def test_float64_is_refused_by_name():
    args = _args(dict(B=1, H=1, N=3, D=4), torch.float64)
    with pytest.raises(TypeError, match=r"rope: argument 'x'.*float64"):
        L4.rope(**args)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("N,D", [(1, 2), (5, 6), (33, 34)])
def test_odd_sizes(N, D, interleaved):
    # one pair; three pairs (no power of two: masked lanes); a row block and one more row
    _passes(_args(dict(B=1, H=2, N=N, D=D), torch.float32, interleaved, seed=N))


@pytest.mark.parametrize("interleaved", [False, True])
def test_k_sliced_from_fused_qkv_and_tables_with_a_column_stride(interleaved):
    # k as the second third of a (B, N, 3 * H * D) projection, heads transposed out of it
    # (every stride differs from the contiguous one); cos and sin columns of an (N, D) cache
    # taken every other element
    B, H, N, D = 2, 3, 9, 8
    args = _args(dict(B=B, H=H, N=N, D=D), torch.float32, interleaved, seed=3)
    qkv = torch.full((B, N, 3 * H * D), float("nan"), device=DEVICE)
    k = qkv[..., H * D:2 * H * D].view(B, N, H, D).transpose(1, 2)
    k.copy_(args["x"])
    tables = {}
    for name in ("cos", "sin"):
        wide = torch.full((N, D), float("nan"), device=DEVICE)
        tables[name] = wide[:, ::2]
        tables[name].copy_(args[name])
    _passes(args | {"x": k} | tables)


def test_backward_takes_an_expanded_gradient():
    # .sum().backward() hands the backward a stride-0 dy: read through its strides
    args = _args(dict(B=1, H=2, N=7, D=6), torch.float32, seed=5)
    x = args["x"].clone().requires_grad_(True)
    L4.rope(x, args["cos"], args["sin"]).sum().backward()
    x64 = args["x"].double().requires_grad_(True)
    ref = cards.get(COMPONENT).reference(
        {"x": x64, "cos": args["cos"].double(), "sin": args["sin"].double(), "interleaved": False})
    ref[0].sum().backward()
    torch.testing.assert_close(x.grad, x64.grad.float(), rtol=1e-5, atol=1e-6)


def test_backward_is_the_rotation_by_minus_theta():
    # y = R(theta) x, so R(-theta) y = x: the backward's kernel undoes the forward's
    from triton_kernels import rope as tr

    args = _args(dict(B=2, H=1, N=6, D=10), torch.float32, True, seed=7)
    y = tr.rotate(args["x"], args["cos"], args["sin"], True, 1.0)
    back = tr.rotate(y, args["cos"], args["sin"], True, -1.0)
    torch.testing.assert_close(back, args["x"], rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------ GPU --

@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("B,H,N,D", [(1, 1, 1, 2), (2, 3, 1000, 96), (1, 32, 4096, 128),
                                     (3, 8, 777, 80), (2, 4, 129, 256)])
def test_gpu_sizes(B, H, N, D, interleaved, dtype):
    _passes(_args(dict(B=B, H=H, N=N, D=D), dtype, interleaved, seed=N, device="cuda"))
