"""Level 4 (Triton): the LSTM, forward and backward.

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

COMPONENT = "lstm"
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


def _lstm_args(B, T, I, H, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return cards.get("lstm").module.make_args(dict(B=B, T=T, I=I, H=H), dtype, torch.device(DEVICE), g)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_harness_tiny(dtype):
    results = check(COMPONENT, "triton", dtype=dtype, device=DEVICE, size="tiny")
    assert results
    for r in results:
        assert r.status == "pass", f"{r.variant}: {r.status} {r.reason} {r.worst}"


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
    monkeypatch.setattr(kernels, "_plan", lambda B, H, device, mode=None, num_warps=None, *_: dict(
        BLOCK_B=16, BLOCK_H=16, BLOCK_K=16, mode="step", num_warps=4, num_stages=1,
        fused_gates=True))
    _passes("lstm", _lstm_args(3, 4, 6, 20, torch.float32, seed=4))


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("mode", ["step", "single"])
def test_lstm_forward_with_the_gates_as_one_dot_or_four(monkeypatch, mode, fused):
    # The plan's forward runs the four gates' columns side by side in one dot, taken apart
    # again in registers (a wrong reshape or split would swap gates, i for g or f for o,
    # which the harness sees at once); the sweep still times the four dots it replaced.
    # Several column programs of 8 units and a ragged edge (H=20) in step mode. On a GPU
    # the step launches run for real; the interpreter runs the same code.
    import triton_kernels.lstm as kernels
    plan = kernels._plan

    def pinned(B, H, device, mode_=None, num_warps=None, kernel="fwd", itemsize=2):
        if kernel == "bwd":
            return plan(B, H, device, None, num_warps, kernel, itemsize)
        return dict(BLOCK_B=16, BLOCK_H=8 if mode == "step" else 32, BLOCK_K=16, mode=mode,
                    num_warps=4, num_stages=1, fused_gates=fused)
    monkeypatch.setattr(kernels, "_plan", pinned)
    _passes("lstm", _lstm_args(3, 4, 6, 20, torch.float32, seed=8))


def test_lstm_reports_a_barrier_that_gave_up_through_its_sticky_word():
    # A kernel that gives up at its barrier sets the device's sticky word (an input of every
    # call, so that the C++ replay replays the LSTM too); the host reads a copy of it in the
    # next calls' prologue (the next call on a CPU, the one after on a GPU, whose copy is
    # queued behind the work) and in check_barrier, says why, clears it, and the calls after
    # work again.
    import triton_kernels.lstm as kernels
    args = _lstm_args(2, 3, 4, 16, torch.float32, seed=3)
    device = args["x"].device
    kernels.lstm(**args)
    word, _ = kernels._STICKY[device]
    word.fill_(1)  # what _grid_barrier does when a program gives up
    with pytest.raises(RuntimeError, match="gave up waiting at its grid barrier"):
        for _ in range(2):
            kernels.lstm(**args)
    assert word.item() == 0
    kernels.lstm(**args)  # cleared: calls work again
    word.fill_(1)
    with pytest.raises(RuntimeError, match="LSTM_TRITON_MODE=step"):
        kernels.check_barrier(wait=True)
    kernels.check_barrier(wait=True)


def _pinned(**knobs):
    """triton_kernels.lstm.lstm with this call's mode / fp32_dot / num_warps (its
    arguments), as a function the harness checks (check_args(fn=))."""
    import triton_kernels.lstm as kernels

    def lstm(x, h0, c0, w_ih, w_hh, b_ih, b_hh):
        return kernels.lstm(x, h0, c0, w_ih, w_hh, b_ih, b_hh, **knobs)
    return lstm


def _passes_pinned(args, **knobs):
    r = check_args("lstm", args, fn=_pinned(**knobs))
    assert r.passed, r.summary()


def test_lstm_rejects_an_unknown_launch_mode():
    # An unknown mode used to run the multi-program grid without its barrier.
    import triton_kernels.lstm as kernels
    args = _lstm_args(2, 3, 4, 16, torch.float32)
    with pytest.raises(ValueError, match="argument 'mode' must be one of auto, persistent, step"):
        kernels.lstm(**args, mode="persistant")
    with pytest.raises(ValueError, match="argument 'fp32_dot' must be 'tf32x3' or 'ieee'"):
        kernels.lstm(**args, fp32_dot="tf32")


def test_lstm_settings_from_the_environment_are_checked_too():
    # LSTM_TRITON_MODE is read once, at import: a process of its own, started with it in
    # its environment, is how a user (or a script) sets it.
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = ("import levels.triton, torch, triton_kernels.lstm as k\n"
            "try:\n    k._plan(2, 16, torch.device('cpu'))\n"
            "except ValueError as exc:\n    print(exc)")
    env = dict(os.environ, LSTM_TRITON_MODE="persistant")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parent.parent, check=True).stdout
    assert "LSTM_TRITON_MODE must be one of auto, persistent, step; got 'persistant'" in out


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("B,T,I,H", [(8, 64, 256, 512), (5, 7, 33, 100), (64, 10, 512, 512)])
def test_lstm_gpu(dtype, B, T, I, H):
    _passes("lstm", _lstm_args(B, T, I, H, dtype, seed=B + T))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("mode", ["step", "persistent"])
@pytest.mark.parametrize("warps", [4, 8])
def test_lstm_gpu_recurrence_modes(mode, warps):
    # Both launch strategies must compute the same function (auto picks one per shape),
    # at the warps the device script sweeps.
    import triton_kernels.lstm as kernels
    assert kernels._plan(3, 48, torch.device("cuda"), mode)["mode"] == mode
    _passes_pinned(_lstm_args(3, 9, 20, 48, torch.float32, seed=2), mode=mode, num_warps=warps)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dot", ["tf32x3", "ieee"])
def test_lstm_gpu_fp32_dot_modes(dot):
    # fp32 recurrence dots: 3xTF32 (the default) and exact FMAs must both meet the fp32 bound.
    _passes_pinned(_lstm_args(8, 64, 256, 512, torch.float32, seed=9), fp32_dot=dot)


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
    monkeypatch.setattr(kernels, "SPIN_LIMIT", 2 ** 14)
    args = _lstm_args(128, 3, 16, 8192, torch.bfloat16, seed=1)  # 4 x 512 programs
    with torch.no_grad():
        out, _ = kernels.lstm(**args, mode="persistent")
    with pytest.raises(RuntimeError, match="gave up waiting at its grid barrier"):
        kernels.check_barrier(wait=True)
    assert torch.isnan(out).any()
    _passes_pinned(_lstm_args(3, 5, 8, 48, torch.float32, seed=2), mode="step")
