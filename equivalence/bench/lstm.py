"""LSTM speed goal: Level 4's persistent recurrence against nn.LSTM (cuDNN), same process.

Forward (inference, no_grad), fp32 and bf16:
  'bench'       B=8,  input 256, hidden 512, T=64   goal >= 1.0x nn.LSTM
  'bench-large' B=64, input 512, hidden 512, T=100  reported, no goal
FLOPs from equivalence/specs/lstm.py.

In fp32, cuDNN's RNN follows torch.backends.cudnn.allow_tf32 (True by default), so the
default nn.LSTM may run its GEMMs in TF32 while Level 4 computes exact fp32 dots. The goal
is against the default nn.LSTM, as stated; the same baseline with TF32 switched off (the
same arithmetic as exact fp32) is timed too and reported in `extra`. Level 4's fp32
recurrence runs its dots as 3xTF32 (triton_kernels/lstm.py FP32_DOT); the same kernel with
exact fp32 FMA dots ("ieee") is timed as well, a figure without a goal, to show what the
trick buys.
"""

from __future__ import annotations

import torch

from . import Figure
from .. import specs
from ..timing import time_first_call, time_fn

GOAL = 1.0
SIZES = ("bench", "bench-large")
DTYPES = (torch.float32, torch.bfloat16)


def unavailable_reason(device) -> str | None:
    if torch.device(device).type != "cuda":
        return "the LSTM goal compares against cuDNN's nn.LSTM: needs a GPU"
    import levels
    return levels.status("triton", device, "lstm")


def _cudnn_lstm(args):
    I, H = args["x"].shape[-1], args["w_hh"].shape[1]
    m = torch.nn.LSTM(I, H, batch_first=True).to(device=args["x"].device, dtype=args["x"].dtype)
    with torch.no_grad():
        for name in ("w_ih", "w_hh", "b_ih", "b_hh"):
            getattr(m, f"{name.replace('w_', 'weight_').replace('b_', 'bias_')}_l0").copy_(args[name])
    m.flatten_parameters()
    return lambda: m(args["x"], (args["h0"], args["c0"]))


def run(device) -> list[Figure]:
    import levels
    import triton_kernels.lstm as kernels

    device = torch.device(device)
    ours = levels.get("triton").lstm
    spec = specs.get("lstm")
    figures = []
    for size in SIZES:
        for dtype in DTYPES:
            args = spec.case(size, "default", dtype, device, seed=0).args
            shape = spec.sizes[size]
            flops = spec.flops(args)["fwd"]
            plan = kernels._plan(shape["B"], shape["H"], device)
            call = lambda: ours(**args)  # noqa: E731
            with torch.no_grad():
                first = time_first_call(call, device)
                t = time_fn(call, device)
                try:
                    base, why = time_fn(_cudnn_lstm(args), device), ""
                except RuntimeError as exc:
                    base, why = None, f"nn.LSTM unavailable at {dtype}: {exc}"
                exact = None
                if dtype == torch.float32 and base is not None:
                    allowed = torch.backends.cudnn.allow_tf32
                    torch.backends.cudnn.allow_tf32 = False
                    try:
                        exact = time_fn(_cudnn_lstm(args), device)
                    finally:
                        torch.backends.cudnn.allow_tf32 = allowed
                ieee = None
                if dtype == torch.float32:
                    saved, kernels.FP32_DOT = kernels.FP32_DOT, "ieee"
                    try:
                        time_first_call(call, device)
                        ieee = time_fn(call, device)
                    finally:
                        kernels.FP32_DOT = saved
            if ieee is not None:
                figures.append(Figure(
                    component="lstm", name=f"forward float32 {size} exact-fp32 dots",
                    level="triton", dtype="float32", shape=dict(shape), ms=ieee.median_ms,
                    spread_ms=(ieee.p20_ms, ieee.p80_ms), tflops=flops / ieee.median_ms / 1e9,
                    baseline="nn.LSTM (cuDNN)", baseline_ms=base.median_ms if base else None,
                    ratio=base.median_ms / ieee.median_ms if base else None,
                    notes='the same kernel with input_precision="ieee" (FMA on CUDA cores)',
                    extra={"us_per_step": 1e3 * ieee.median_ms / shape["T"]}))
            ratio = base.median_ms / t.median_ms if base else None
            goal = GOAL if size == "bench" else None
            figures.append(Figure(
                component="lstm", name=f"forward {str(dtype)[6:]} {size}", level="triton",
                dtype=str(dtype)[6:], shape=dict(shape), ms=t.median_ms,
                spread_ms=(t.p20_ms, t.p80_ms), tflops=flops / t.median_ms / 1e9,
                baseline="nn.LSTM (cuDNN)", baseline_ms=base.median_ms if base else None,
                ratio=ratio, goal=goal,
                met=(ratio >= goal) if (goal is not None and ratio is not None) else None,
                notes=(f"recurrence mode {plan['mode']}, BLOCK_B={plan['BLOCK_B']} "
                       f"BLOCK_H={plan['BLOCK_H']}, dots "
                       f"{kernels._precision(dtype) if dtype == torch.float32 else 'bf16'}"
                       f"; first call {first:.0f} ms. {why}").strip(),
                extra={"us_per_step": 1e3 * t.median_ms / shape["T"],
                       "baseline_us_per_step": 1e3 * base.median_ms / shape["T"] if base else None,
                       "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
                       "baseline_exact_fp32_ms": exact.median_ms if exact else None,
                       "ratio_vs_exact_fp32": exact.median_ms / t.median_ms if exact else None}))
    return figures
