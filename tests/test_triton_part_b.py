"""Level 4 (Triton), part B: flash attention and the LSTM, forward and backward.

On a machine without a GPU these run in Triton's CPU interpreter (slow: sizes stay tiny).
Each case is compared with the float64 reference of equivalence/cards at the fixed
tolerance of its dtype, gradients included, with uninitialized memory poisoned by NaN.
The @pytest.mark.gpu tests repeat the checks on CUDA at fp16/bf16/fp32 and larger sizes.
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

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _passes(component, args):
    """The harness's own check (equivalence.check.check_args) on these exact arguments:
    outputs and every gradient against the float64 reference, with poisoned allocations."""
    r = check_args(component, "triton", args)
    assert r.passed, r.summary()


def _attention_args(B, H, N, D, dtype, causal, seed=0, Nk=None):
    g = torch.Generator().manual_seed(seed)
    mk = lambda n: torch.randn((B, H, n, D), generator=g).to(dtype=dtype, device=DEVICE)  # noqa: E731
    return dict(q=mk(N), k=mk(N if Nk is None else Nk), v=mk(N if Nk is None else Nk),
                causal=causal, scale=None)


def _lstm_args(B, T, I, H, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return cards.get("lstm").module.make_args(dict(B=B, T=T, I=I, H=H), dtype, torch.device(DEVICE), g)


# ------------------------------------------------------------------- the harness, tiny --

@pytest.mark.parametrize("component", ["attention", "lstm"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_harness_tiny(component, dtype):
    results = check(component, "triton", dtype=dtype, device=DEVICE, size="tiny")
    assert results
    for r in results:
        assert r.status == "pass", f"{r.variant}: {r.status} {r.reason} {r.worst}"


# --------------------------------------------------------------- attention, CPU or GPU --

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


# ---------------------------------------------------------------------- LSTM, CPU or GPU --

def test_lstm_hidden_not_a_power_of_two():
    _passes("lstm", _lstm_args(2, 4, 5, 20, torch.float32, seed=11))


def test_lstm_strided_input():
    args = _lstm_args(3, 4, 8, 16, torch.float32, seed=5)
    args["x"] = args["x"].transpose(0, 1).contiguous().transpose(0, 1)  # batch stride 8, time stride 24
    _passes("lstm", args)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU tests cover both modes there")
def test_lstm_step_mode_with_several_column_programs(monkeypatch):
    # The interpreter normally runs one program owning every hidden unit; force the GPU's
    # fallback layout (one launch per step, hidden units split over programs, ragged edge).
    import triton_kernels.lstm as kernels
    monkeypatch.setattr(kernels, "_plan", lambda B, H, device: dict(
        BLOCK_B=16, BLOCK_H=16, BLOCK_K=16, mode="step", num_warps=4))
    _passes("lstm", _lstm_args(3, 4, 6, 20, torch.float32, seed=4))


def test_lstm_rejects_an_unknown_launch_mode(monkeypatch):
    # An unknown mode used to run the multi-program grid without its barrier.
    import triton_kernels.lstm as kernels
    monkeypatch.setattr(kernels, "_MODE", "persistant")
    with pytest.raises(ValueError, match="LSTM_TRITON_MODE must be one of auto, persistent, step"):
        L4.lstm(**_lstm_args(2, 3, 4, 16, torch.float32))


def test_attention_refuses_a_slice_beyond_32_bit_offsets():
    # 4 GiB of untouched virtual memory: nothing is computed, the launcher refuses first.
    storage = torch.empty(2 ** 31 + 64, dtype=torch.float16, device=DEVICE)
    q = storage.as_strided((1, 1, 2, 16), (0, 0, 2 ** 31, 1))
    with pytest.raises(ValueError, match=r"attention: argument 'q' spans .* < 2\*\*31"):
        L4.attention(q, q, q)
    del storage


# ------------------------------------------------------------------------------ GPU only --

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


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
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("B,T,I,H", [(8, 64, 256, 512), (5, 7, 33, 100), (64, 10, 512, 512)])
def test_lstm_gpu(dtype, B, T, I, H):
    _passes("lstm", _lstm_args(B, T, I, H, dtype, seed=B + T))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("mode", ["step", "persistent"])
def test_lstm_gpu_recurrence_modes(mode, monkeypatch):
    # Both launch strategies must compute the same function (auto picks one per shape).
    import triton_kernels.lstm as kernels
    monkeypatch.setattr(kernels, "_MODE", mode)
    assert kernels._plan(3, 48, torch.device("cuda"))["mode"] == mode
    _passes("lstm", _lstm_args(3, 9, 20, 48, torch.float32, seed=2))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dot", ["tf32x3", "ieee"])
def test_lstm_gpu_fp32_dot_modes(dot, monkeypatch):
    # fp32 recurrence dots: 3xTF32 (the default) and exact FMAs must both meet the fp32 bound.
    import triton_kernels.lstm as kernels
    monkeypatch.setattr(kernels, "FP32_DOT", dot)
    _passes("lstm", _lstm_args(8, 64, 256, 512, torch.float32, seed=9))
    monkeypatch.setattr(kernels, "FP32_DOT", "tf32")
    with pytest.raises(ValueError, match="LSTM_TRITON_FP32_DOT"):
        L4.lstm(**_lstm_args(2, 3, 4, 16, torch.float32))


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


@pytest.mark.gpu
@needs_gpu
def test_lstm_gpu_beyond_2_31_elements():
    # B * T * 4H = 2**31: the input projection's last batch rows sit past 32-bit offsets.
    B, T, I, H = 128, 1024, 16, 4096
    args = _lstm_args(B, T, I, H, torch.bfloat16, seed=3)
    with torch.no_grad():
        out, (h_t, c_t) = L4.lstm(**args)
        rows = slice(B - 2, B)
        ref = torch.nn.LSTM(I, H, batch_first=True).to("cuda", torch.float32)
        for name, t in (("weight_ih_l0", "w_ih"), ("weight_hh_l0", "w_hh"), ("bias_ih_l0", "b_ih"),
                        ("bias_hh_l0", "b_hh")):
            getattr(ref, name).copy_(args[t].float())
        expected, _ = ref(args["x"][rows].float(), (args["h0"][:, rows].float(),
                                                  args["c0"][:, rows].float()))
    assert compare("last rows", out[rows], expected.double(), tolerance(torch.bfloat16),
                   torch.bfloat16).ok


@pytest.mark.gpu
@needs_gpu
def test_lstm_gpu_barrier_gives_up_instead_of_hanging(monkeypatch):
    # More programs than can be resident at once: the persistent barrier would wait
    # forever. It must give up, return NaN (never a wrong number) and make check_barrier
    # say why; then the next calls work again.
    import triton_kernels.lstm as kernels
    monkeypatch.setattr(kernels, "_sm_count", lambda device: 10 ** 6)  # "everything fits"
    monkeypatch.setattr(kernels, "_MODE", "persistent")
    monkeypatch.setattr(kernels, "SPIN_LIMIT", 2 ** 14)
    args = _lstm_args(128, 3, 16, 8192, torch.bfloat16, seed=1)  # 4 x 512 programs
    with torch.no_grad():
        out, _ = L4.lstm(**args)
    with pytest.raises(RuntimeError, match="gave up waiting at its grid barrier"):
        kernels.check_barrier(wait=True)
    assert torch.isnan(out).any()
    monkeypatch.setattr(kernels, "_MODE", "step")
    _passes("lstm", _lstm_args(3, 5, 8, 48, torch.float32, seed=2))
