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


def _attention_args(B, H, N, D, dtype, causal, seed=0, Nk=None, H_kv=None, alignment="top_left",
                    kv_lens=None):
    g = torch.Generator().manual_seed(seed)
    mk = lambda h, n: torch.randn((B, h, n, D), generator=g).to(dtype=dtype, device=DEVICE)  # noqa: E731
    Nk = N if Nk is None else Nk
    H_kv = H if H_kv is None else H_kv
    lens = None if kv_lens is None else torch.tensor(kv_lens, device=DEVICE)
    args = dict(q=mk(H, N), k=mk(H_kv, Nk), v=mk(H_kv, Nk), causal=causal, scale=None)
    if alignment != "top_left" or lens is not None:  # only where used: the card's convention
        args.update(causal_alignment=alignment, kv_lens=lens)
    return args


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


@pytest.mark.parametrize("D", [8, 24, 80])
def test_attention_head_sizes_padded_to_a_power_of_two(D):
    # the tile spans the next power of two; the padded columns are never read nor written
    # (the harness's strided layout puts NaN around the views, and checks the gaps)
    args = _attention_args(1, 2, 19, D, torch.float32, True, seed=D)
    _passes("attention", args)
    for name in ("q", "k", "v"):  # a row-padded view: D real columns of a wider buffer
        wide = torch.full((*args[name].shape[:-1], D + 8), float("nan"), device=DEVICE)
        args[name] = wide[..., :D].copy_(args[name])
    _passes("attention", args)


@pytest.mark.parametrize("H,H_kv", [(4, 2), (3, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_grouped_query_heads(H, H_kv, causal):
    # dK/dV sum the gradients of every query head of a group (a loop inside the program)
    _passes("attention", _attention_args(2, H, 21, 16, torch.float32, causal, seed=H, H_kv=H_kv))


@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
@pytest.mark.parametrize("Nq,Nk", [(5, 40), (40, 9)])
def test_attention_causal_with_other_lengths(alignment, Nq, Nk):
    # bottom-right with more queries than keys leaves the first queries with no key: 0 out,
    # 0 gradients (as SDPA)
    _passes("attention", _attention_args(2, 2, Nq, 16, torch.float32, True, seed=Nq, Nk=Nk,
                                         alignment=alignment))


@pytest.mark.parametrize("causal,alignment", [(False, "top_left"), (True, "bottom_right")])
def test_attention_key_lengths_per_batch_element(causal, alignment):
    # a length of 0 (no key at all), a length inside a block, one past Nk (clipped to Nk)
    _passes("attention", _attention_args(3, 2, 9, 16, torch.float32, causal, seed=5, Nk=37,
                                         H_kv=1, alignment=alignment, kv_lens=[0, 20, 50]))


@pytest.mark.parametrize("shape_q,shape_k", [((0, 2, 5, 16), (0, 1, 7, 16)),
                                             ((2, 2, 0, 16), (2, 2, 7, 16)),
                                             ((2, 2, 5, 16), (2, 2, 0, 16))])
def test_attention_empty_tensors_as_pytorch(shape_q, shape_k, monkeypatch):
    # the result and the gradients of SDPA (zeros where no key is seen), and no launch
    import triton_kernels.attention as kernels
    launched = []
    for name in ("_attn_fwd", "_attn_bwd_preprocess", "_attn_bwd_dkdv", "_attn_bwd_dq"):
        monkeypatch.setattr(kernels, name, _Refuse(name, launched))
    q = torch.randn(shape_q, device=DEVICE, requires_grad=True)
    k = torch.randn(shape_k, device=DEVICE, requires_grad=True)
    v = torch.randn(shape_k, device=DEVICE, requires_grad=True)
    out = L4.attention(q, k, v, False)
    group = shape_q[1] // shape_k[1]
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1))
    assert out.shape == ref.shape and torch.equal(out, ref)
    out.sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
    assert not q.grad.any() and not k.grad.any() and not v.grad.any()
    assert launched == []


class _Refuse:
    def __init__(self, name, launched):
        self.name, self.launched = name, launched

    def __getitem__(self, grid):
        self.launched.append((self.name, grid))
        raise AssertionError(f"{self.name} launched with grid {grid} on an empty problem")


def test_attention_rejects_a_head_size_past_256():
    q = torch.randn(1, 1, 8, 264, device=DEVICE)
    with pytest.raises(ValueError, match=r"'q'.*D <= 256.*D=264"):
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
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("D", [8, 80, 96, 192, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_gpu_head_sizes(dtype, D, causal):
    # the D = 256 tiles (TUNED's d256 entries) must compile and fit on the GPU
    _passes("attention", _attention_args(2, 4, 300, D, dtype, causal, seed=D, H_kv=2))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("alignment,Nq,Nk,kv_lens", [
    ("bottom_right", 1, 1000, [1000, 517]), ("bottom_right", 130, 1000, [0, 999]),
    ("top_left", 1000, 333, None), ("bottom_right", 1000, 333, [333, 100])])
def test_attention_gpu_decode_and_prefill(alignment, Nq, Nk, kv_lens):
    _passes("attention", _attention_args(2, 8, Nq, 128, torch.bfloat16, True, seed=Nq, Nk=Nk,
                                         H_kv=1, alignment=alignment, kv_lens=kv_lens))


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
