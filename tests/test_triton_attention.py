"""Level 4 (Triton): flash attention, forward and backward.

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

COMPONENT = "attention"
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


def _attention_args(B, H, N, D, dtype, causal, seed=0, Nk=None):
    g = torch.Generator().manual_seed(seed)
    mk = lambda n: torch.randn((B, H, n, D), generator=g).to(dtype=dtype, device=DEVICE)  # noqa: E731
    return dict(q=mk(N), k=mk(N if Nk is None else Nk), v=mk(N if Nk is None else Nk),
                causal=causal, scale=None)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_block_shapes_as_arguments(causal):
    # The device script's sweep passes block shapes as the launcher's `config` and
    # `backward_config` arguments: forward and every gradient must hold at any of them
    # (16 x 16 blocks: causal's divisibility holds, N = 37 leaves ragged blocks).
    import triton_kernels.attention as kernels
    cfg = dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1)

    def attention(q, k, v, causal=False, scale=None):
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        return kernels.attention(q, k, v, causal, scale, config=cfg, backward_config=cfg)
    r = check_args(COMPONENT, _attention_args(1, 2, 37, 16, torch.float32, causal), fn=attention)
    assert r.passed, r.summary()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_harness_tiny(dtype):
    results = check(COMPONENT, "triton", dtype=dtype, device=DEVICE, size="tiny")
    assert results
    for r in results:
        assert r.status == "pass", f"{r.variant}: {r.status} {r.reason} {r.worst}"


@pytest.mark.parametrize("D", [16, 32, 64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_every_head_dim(D, causal):
    _passes("attention", _attention_args(1, 1, 37, D, torch.float32, causal, seed=D))


@pytest.mark.parametrize("causal", [False, True])
def test_attention_odd_length_several_blocks_bf16(causal):
    # 61 = several 16/32-row blocks plus a ragged edge in both the key and query loops.
    _passes("attention", _attention_args(1, 2, 61, 32, torch.bfloat16, causal, seed=7))


def test_attention_cross_lengths_and_strided_inputs():
    # Nq != Nk (non-causal) and q/k/v that are views with non-trivial strides.
    args = _attention_args(2, 3, 21, 16, torch.float32, False, seed=3, Nk=45)
    args["q"] = args["q"].transpose(1, 2).contiguous().transpose(1, 2)  # (B, H, N, D), H-stride 16
    _passes("attention", args)


def test_attention_rejects_unsupported_head_dim():
    q = torch.randn(1, 1, 8, 24, device=DEVICE)
    with pytest.raises(ValueError, match=r"'q'.*16, 32, 64, 128.*D=24"):
        L4.attention(q, q, q)


def test_attention_refuses_a_slice_beyond_32_bit_offsets():
    # 4 GiB of untouched virtual memory: nothing is computed, the launcher refuses first.
    storage = torch.empty(2 ** 31 + 64, dtype=torch.float16, device=DEVICE)
    q = storage.as_strided((1, 1, 2, 16), (0, 0, 2 ** 31, 1))
    with pytest.raises(ValueError, match=r"attention: argument 'q' spans .* < 2\*\*31"):
        L4.attention(q, q, q)
    del storage


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype,N,D", [
    (torch.float16, 129, 64), (torch.bfloat16, 1000, 128), (torch.bfloat16, 37, 16),
    (torch.float16, 257, 128), (torch.float32, 129, 32), (torch.float32, 200, 128),
])
def test_attention_gpu(dtype, N, D, causal):
    _passes("attention", _attention_args(2, 3, N, D, dtype, causal, seed=N + D))


@pytest.mark.gpu
@needs_gpu
def test_attention_gpu_beyond_2_31_elements():
    # Batch/head offsets past 2**31 elements are 64-bit: the last batch must be right.
    B, H, N, D = 1024, 16, 1024, 128
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    with torch.no_grad():
        o = L4.attention(q, k, v)
    last = slice(B - 1, B)
    ref = cards.get("attention").module.reference(q[last].double(), k[last].double(), v[last].double())[0]
    assert compare("last batch", o[last], ref, tolerance(torch.bfloat16), torch.bfloat16).ok
    del q, k, v, o
