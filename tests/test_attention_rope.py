"""attention(q, k, v, ..., rope=(cos, sin[, interleaved])): rotary embeddings fused into
attention, forward and backward, against the card's float64 reference (which turns q and k
as complex numbers, independently of every level).

On the CPU: Levels 1, 2 and 4 (Triton's interpreter) at tiny sizes, in both pair layouts
(the card's `rope` variant covers the half-split one at every level through the generic
tests), with grouped K/V heads, the bottom-right alignment (queries after a cache of keys),
head sizes padded to a power of two and tables of any strides (rows of a longer table,
every other column, transposed). Level 3 compiles one case (slow). On a GPU (`-m gpu`):
Levels 4 and 5 at real sizes in fp16, bf16 and fp32.
"""

from __future__ import annotations

import math

import pytest
import torch

import levels.triton  # noqa: F401  (first: the interpreter on before triton loads)
import levels
from equivalence.check import check_args
from levels import native

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CPU_LEVELS = ("native", "torchscript", "triton")


def _tables(P, D, dtype, device, layout, g):
    """cos and sin (P, D/2) of random angles, stored as `layout`: contiguous, rows of a wider
    buffer, every other column of one, or the transpose of a (D/2, P) buffer. The memory
    around a view holds NaN: a kernel reading between the elements computes NaN."""
    theta = torch.rand((P, D // 2), generator=g) * 2 * math.pi - math.pi
    out = []
    for t in (torch.cos(theta), torch.sin(theta)):
        t = t.to(dtype=dtype, device=device)
        nan = lambda *shape: torch.full(shape, math.nan, dtype=dtype, device=device)  # noqa: E731
        if layout == "row_padded":
            t = nan(P + 5, D // 2 + 3)[2:P + 2, 1:D // 2 + 1].copy_(t)
        elif layout == "every_other_column":
            t = nan(P, D)[:, ::2].copy_(t)
        elif layout == "transposed":
            t = nan(D // 2, P).t().copy_(t)
        out.append(t)
    return out


def _args(B=1, H=2, H_kv=None, Nq=13, Nk=None, D=16, dtype=torch.float32, interleaved=False,
          causal=True, alignment="top_left", tables="row_padded", seed=0, device=DEVICE):
    g = torch.Generator().manual_seed(seed)
    H_kv = H if H_kv is None else H_kv
    Nk = Nq if Nk is None else Nk
    mk = lambda h, n: torch.randn((B, h, n, D), generator=g).to(dtype=dtype, device=device)  # noqa: E731
    cos, sin = _tables(Nk + 3, D, dtype, device, tables, g)  # longer than needed, as a cache
    return dict(q=mk(H, Nq), k=mk(H_kv, Nk), v=mk(H_kv, Nk), causal=causal, scale=None,
                causal_alignment=alignment, rope=(cos, sin, interleaved))


def _passes(level, args, fn=None):
    r = check_args("attention", level, args) if fn is None else check_args("attention", args, fn=fn)
    assert r.passed, r.summary()
    return r


# ---------------------------------------------------------------------------------------
# Every CPU level, both layouts: forward, backward and the no-grad forward
# ---------------------------------------------------------------------------------------

CASES = {
    # Llama 3's shape in miniature: 4 query heads on 2 K/V heads, a chunk of 5 queries after
    # 19 keys (bottom-right: positions 14..18), tables read through a row stride
    "gqa-chunk": dict(H=4, H_kv=2, Nq=5, Nk=19, alignment="bottom_right"),
    # training (Nq = Nk, top-left), several key blocks and a ragged edge, transposed tables
    "training": dict(Nq=21, tables="transposed"),
    # no mask at all, cross lengths (queries at 0.., keys at 0..), every other table column
    "full-cross": dict(Nq=7, Nk=23, causal=False, tables="every_other_column"),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("level", CPU_LEVELS)
def test_rope_fused_against_the_float64_reference(level, interleaved, case):
    _passes(level, _args(interleaved=interleaved, seed=len(case), **CASES[case]))


@pytest.mark.parametrize("D,interleaved", [(8, True), (24, False), (24, True)],
                         ids=["8-interleaved", "24-half", "24-interleaved"])
def test_level4_head_sizes_padded_to_a_power_of_two(D, interleaved):
    # D = 8: half-rows of 4 in a 16-wide tile; D = 24: the second half starts at 12, not at
    # the tile's middle (16): the padded pairs are read as 0 and never written
    _passes("triton", _args(H=2, H_kv=1, Nq=9, Nk=21, D=D, interleaved=interleaved,
                            alignment="bottom_right", seed=D))


@pytest.mark.parametrize("dtype,interleaved", [(torch.bfloat16, False), (torch.bfloat16, True),
                                               (torch.float16, False)],
                         ids=["bf16-half", "bf16-interleaved", "fp16-half"])
def test_level4_16_bit(dtype, interleaved):
    # the turned tiles are rounded to the input's dtype before the dots, as rope rounds
    _passes("triton", _args(B=2, H=2, Nq=21, dtype=dtype, interleaved=interleaved, seed=5))


def test_level3_compiles_the_interleaved_layout():  # slow: tests/conftest.py's SLOW
    # the card's rope variant compiles the half-split one in the generic tests
    _passes("compile", _args(H=4, H_kv=2, Nq=5, Nk=19, interleaved=True, alignment="bottom_right"))


# ---------------------------------------------------------------------------------------
# The definition, and what a check of it catches
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("level", ["native", "triton"])
def test_fused_is_rope_on_q_and_k_then_attention(level):
    # the API's definition, level by level: queries at positions Nk - Nq.. when bottom-right
    L = levels.get(level)
    for interleaved in (False, True):
        a = _args(H=4, H_kv=2, Nq=6, Nk=17, interleaved=interleaved, alignment="bottom_right")
        cos, sin, _ = a["rope"]
        fused = L.attention(a["q"], a["k"], a["v"], True, causal_alignment="bottom_right",
                            rope=a["rope"])
        q = L.rope(a["q"], cos[11:17], sin[11:17], interleaved)
        k = L.rope(a["k"], cos[:17], sin[:17], interleaved)
        apart = L.attention(q, k, a["v"], True, causal_alignment="bottom_right")
        torch.testing.assert_close(fused, apart, rtol=1e-5, atol=1e-5)


def _attention_with(offset_of, interleaved_of):
    """Level 1's math with rope's offset or layout decided by the caller: a planted bug."""
    def attention(q, k, v, causal=False, scale=None, causal_alignment="top_left", kv_lens=None,
                  rope=None):
        cos, sin, interleaved = rope
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        bottom_right = causal and causal_alignment == "bottom_right"
        off = offset_of(q.shape[2], k.shape[2], causal_alignment)
        return native.attention_math(q, k, v, causal, scale, bottom_right, kv_lens, cos, sin,
                                     interleaved_of(interleaved), off)
    return attention


@pytest.mark.parametrize("bug", ["queries at 0", "layouts swapped"])
def test_the_check_catches_a_wrong_position_or_layout(bug):
    args = _args(H=2, Nq=5, Nk=19, alignment="bottom_right", seed=3)
    right = _attention_with(lambda nq, nk, a: nk - nq if a == "bottom_right" else 0, bool)
    _passes(None, args, fn=right)
    wrong = (_attention_with(lambda nq, nk, a: 0, bool) if bug == "queries at 0" else
             _attention_with(lambda nq, nk, a: nk - nq, lambda i: not i))
    r = check_args("attention", args, fn=wrong)
    assert r.status == "fail" and r.worst.rel_err > 0.05, r.summary()


def test_level4_reads_each_calls_tables():
    # the validation is kept per argument signature (levels.contract.Plans), never the
    # tensors: a second call with other tables of the same shape uses its own
    a = _args(H=2, Nq=9, seed=1)
    b = dict(a, rope=_args(H=2, Nq=9, seed=2)["rope"])
    for args in (a, b):
        with torch.no_grad():
            got = levels.get("triton").attention(**args)
            want = native.attention(**args)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_autocast_casts_the_tables_with_q_and_k():
    # float32 tables beside float32 q, k, v: under autocast all of them become bfloat16 (a
    # model builds its tables once, in its parameters' dtype)
    a = _args(H=2, Nq=9, device="cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = native.attention(**a)
    assert out.dtype == torch.bfloat16
    cast = {n: (tuple(t.bfloat16() if isinstance(t, torch.Tensor) else t for t in v)
                if n == "rope" else v.bfloat16() if isinstance(v, torch.Tensor) else v)
            for n, v in a.items()}
    torch.testing.assert_close(out, native.attention(**cast))


# ---------------------------------------------------------------------------------------
# On a GPU: Levels 4 and 5 at real sizes
# ---------------------------------------------------------------------------------------

GPU_LEVELS = ("triton", "cuda")
GPU_CASES = {
    "llama-train": dict(B=2, H=8, H_kv=2, Nq=1000, D=128, alignment="top_left"),
    "decode": dict(B=2, H=8, H_kv=1, Nq=1, Nk=777, D=128, alignment="bottom_right"),
    "prefill-chunk": dict(B=1, H=4, Nq=130, Nk=1000, D=64, alignment="bottom_right"),
    "head-80": dict(B=1, H=4, Nq=300, D=80, tables="transposed"),
    "full": dict(B=2, H=4, Nq=257, D=128, causal=False, tables="every_other_column"),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES)
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32],
                         ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("level", GPU_LEVELS)
def test_rope_fused_on_gpu(level, dtype, interleaved, case):
    reason = levels.status(level, "cuda", "attention")
    if reason:
        pytest.skip(reason)
    _passes(level, _args(dtype=dtype, interleaved=interleaved, device="cuda", seed=7,
                         **GPU_CASES[case]))


def test_level5_hands_each_call_its_own_tables(monkeypatch):
    # Level 5 keeps one plan per argument signature (levels.contract.Plans): two calls with
    # tables of the same shape share it, so the plan must not hold the first call's tables.
    # The op is faked (no GPU needed): it records what the level hands it.
    import levels.cuda as cuda_level

    seen = []

    class FakeOp:
        @staticmethod
        def attention(q, k, v, causal, scale, **kw):
            seen.append(kw)
            return q

    monkeypatch.setattr(cuda_level, "_ready", lambda *a: FakeOp)
    monkeypatch.setattr(cuda_level, "_ATTENTION", cuda_level.Plans(cuda_level._attention_plan))
    first = _args(H_kv=1, Nq=3, Nk=7, alignment="bottom_right", interleaved=True, seed=1)
    second = _args(H_kv=1, Nq=3, Nk=7, alignment="bottom_right", interleaved=True, seed=2)
    for args in (first, second):
        cuda_level.attention(**args)
    for args, kw in zip((first, second), seen):
        assert kw["rope_cos"] is args["rope"][0] and kw["rope_sin"] is args["rope"][1]
        assert (kw["rope_interleaved"], kw["rope_offset"]) == (True, 4)  # Nk - Nq


def test_rope_tiles_fit_shared_memory():
    # With rope, the tables' rows ride in the pipeline beside K and V: the forward at
    # fwd_d128's tiles asked 294,912 B on the H100, over its 227 KB, and the launch failed.
    # The estimate reproduces that figure, and every rope tile the launcher picks fits; the
    # tiles without rope are TUNED's, unchanged.
    import triton_kernels.attention as ta

    assert ta._shared_estimate(ta.TUNED["fwd_d128"], 128, 2, True, "BLOCK_N") == 294912
    for D in (8, 16, 24, 64, 80, 128, 192, 256):
        tile = ta.head_tile(D)
        for dtype in (torch.float16, torch.bfloat16, torch.float32):
            for table, streamed in ((ta._fwd_table, "BLOCK_N"), (ta._bwd_table, "BLOCK_M")):
                cfg = ta._fit_rope(table(tile, dtype), D, dtype, streamed)
                assert ta._shared_estimate(cfg, tile, dtype.itemsize, True, streamed) \
                    <= ta.SHARED_LIMIT, (table.__name__, D, dtype, cfg)
                assert cfg[streamed] >= 16 and cfg["num_stages"] >= 1
