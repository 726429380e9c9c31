"""LSTM speed goal: Level 4's persistent recurrence against nn.LSTM (cuDNN), same process.

Forward (inference, no_grad), fp32 and bf16:
  'bench'       B=8,  input 256, hidden 512, T=64   goal >= 1.0x nn.LSTM
  'bench-large' B=64, input 512, hidden 512, T=100  reported, no goal
FLOPs from equivalence/cards/lstm.py.

In fp32, cuDNN's RNN follows torch.backends.cudnn.allow_tf32 (True by default), so the
default nn.LSTM may run its GEMMs in TF32 while Level 4 computes exact fp32 dots. The goal
is against the default nn.LSTM, as stated; the same baseline with TF32 switched off (the
same arithmetic as exact fp32) is timed too and reported in `extra`. Level 4's fp32
recurrence runs its dots as 3xTF32 (triton_kernels/lstm.py FP32_DOT); the same kernel with
exact fp32 FMA dots (the launcher's argument fp32_dot="ieee") is timed as well, a figure
without a goal, to show what the trick buys.

Level 5 (CUDA C++): every version of cuda_kernels/lstm.cu (v1 a step kernel per
time step, v2 one persistent cooperative launch) at fp32 and bf16, both sizes, forward; and
forward+backward at 'bench' (against nn.LSTM's forward+backward, same run). Goals at 'bench',
forward, for the default version (v2): bf16 >= 5x nn.LSTM, fp32 >= 1.0x. The Level 4 figures
are skipped (with the reason) where Level 4 cannot run, and the Level 5 ones likewise.
"""

from __future__ import annotations

import sys

import torch

from .goals import Figure
from ... import cards
from ...timing import time_first_call, time_fn

GOAL = 1.0
SIZES = ("bench", "bench-large")
DTYPES = (torch.float32, torch.bfloat16)


def unavailable_reason(device) -> str | None:
    if torch.device(device).type != "cuda":
        return "the LSTM goal compares against cuDNN's nn.LSTM: needs a GPU"
    import levels
    triton, cuda = levels.status("triton", device, "lstm"), levels.status("cuda", device, "lstm")
    if triton and cuda:
        return f"Level 4: {triton}; Level 5: {cuda}"
    return None


def _cudnn_module(args):
    """nn.LSTM (cuDNN on a GPU) holding the same weights as `args`, in its flat layout."""
    I, H = args["x"].shape[-1], args["w_hh"].shape[1]
    m = torch.nn.LSTM(I, H, batch_first=True).to(device=args["x"].device, dtype=args["x"].dtype)
    with torch.no_grad():
        for name in ("w_ih", "w_hh", "b_ih", "b_hh"):
            getattr(m, f"{name.replace('w_', 'weight_').replace('b_', 'bias_')}_l0").copy_(args[name])
    m.flatten_parameters()
    return m


def _cudnn_lstm(args):
    m = _cudnn_module(args)
    return lambda: m(args["x"], (args["h0"], args["c0"]))


def run(device) -> list[Figure]:
    import levels

    device = torch.device(device)
    figures = []
    reason = levels.status("triton", device, "lstm")
    if reason:
        print(f"lstm bench: Level 4 skipped: {reason}", file=sys.stderr)
    else:
        figures += _level4(device)
    return figures + _level5(device)


def _level4(device) -> list[Figure]:
    import levels
    import triton_kernels.lstm as kernels

    ours = levels.get("triton").lstm
    card = cards.get("lstm")
    figures = []
    for size in SIZES:
        for dtype in DTYPES:
            args = card.case(size, "default", dtype, device, seed=0).args
            shape = card.sizes[size]
            flops = card.flops(args)["fwd"]
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
                if dtype == torch.float32:  # args validated by `call` (Level 4) above
                    exact_dots = lambda: kernels.lstm(**args, fp32_dot="ieee")  # noqa: E731
                    time_first_call(exact_dots, device)
                    ieee = time_fn(exact_dots, device)
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


# ---------------------------------------------------------------------------------------
# Level 5: the recurrence ladder of cuda_kernels/lstm.cu
# ---------------------------------------------------------------------------------------

LEVEL5_GOALS = {torch.bfloat16: 5.0, torch.float32: 1.0}  # forward at 'bench', default version


def _train_step(fn, leaves, upstream):
    """One forward + backward: gradients of every leaf for the given output gradients."""
    def go():
        out, (h_n, c_n) = fn(*leaves)
        torch.autograd.grad((out, h_n, c_n), leaves, upstream)
    return go


def _cudnn_train(args, leaves):
    """nn.LSTM (cuDNN) forward + backward on the same values; the weights are its parameters."""
    m = _cudnn_module(args)
    x, h0, c0 = leaves[0], leaves[1], leaves[2]
    params = [x, h0, c0, *m.parameters()]

    def go(upstream):
        out, (h_n, c_n) = m(x, (h0, c0))
        torch.autograd.grad((out, h_n, c_n), params, upstream)
    return go


def _level5(device) -> list[Figure]:
    import levels

    reason = levels.status("cuda", device, "lstm")
    if reason:
        print(f"lstm bench: Level 5 skipped: {reason}", file=sys.stderr)
        return []
    import cuda_kernels.lstm as k5

    from .goals import figure

    card = cards.get("lstm")
    names = ("x", "h0", "c0", "w_ih", "w_hh", "b_ih", "b_hh")
    figures = []
    for size in SIZES:
        for dtype in DTYPES:
            args = card.case(size, "default", dtype, device, seed=0).args
            shape = dict(card.sizes[size])
            flops = card.flops(args)
            tensors = [args[n] for n in names]
            dt = str(dtype)[6:]
            with torch.no_grad():
                try:
                    base = figure("lstm", f"forward {dt} {size}", "native", dtype, shape,
                                  _cudnn_lstm(args), device, flops=flops["fwd"],
                                  notes="nn.LSTM (cuDNN), the Level 5 baseline of this run",
                                  extra={"cudnn_allow_tf32": torch.backends.cudnn.allow_tf32})
                    figures.append(base)
                except RuntimeError as exc:
                    base = None
                    print(f"lstm bench: nn.LSTM unavailable at {dt}: {exc}", file=sys.stderr)
            train = size == "bench"
            if train:
                leaves = [t.detach().requires_grad_(True) for t in tensors]
                B, T, H = shape["B"], shape["T"], shape["H"]
                g = torch.Generator(device="cpu").manual_seed(1)
                upstream = tuple(torch.randn(s, generator=g).to(device=device, dtype=dtype)
                                 for s in ((B, T, H), (1, B, H), (1, B, H)))
                try:
                    cudnn_go = _cudnn_train(args, leaves)
                    base_fb = figure("lstm", f"forward+backward {dt} {size}", "native", dtype, shape,
                                     lambda: cudnn_go(upstream), device,
                                     flops=flops["fwd"] + flops["bwd"], notes="nn.LSTM (cuDNN), autograd")
                    figures.append(base_fb)
                except RuntimeError as exc:
                    base_fb = None
                    print(f"lstm bench: nn.LSTM backward unavailable at {dt}: {exc}", file=sys.stderr)
            for version in sorted(k5.VERSIONS):
                def ours(*t, version=version):  # the kernels' entry, this version
                    return k5.lstm(*t, version=version)
                goal = (LEVEL5_GOALS[dtype] if size == "bench" and version == k5.DEFAULT_VERSION
                        else None)
                runs = [("forward", lambda: ours(*tensors), flops["fwd"], base, goal, False)]
                if train:
                    runs.append(("forward+backward", _train_step(ours, leaves, upstream),
                                 flops["fwd"] + flops["bwd"], base_fb, None, True))
                for what, fn, fl, baseline, g_, grad in runs:
                    name = f"{what} {dt} {size} cuda v{version}"
                    try:
                        with torch.set_grad_enabled(grad):
                            fig = figure("lstm", name, "cuda", dtype, shape, fn, device, flops=fl,
                                         baseline="nn.LSTM (cuDNN)" if baseline else None,
                                         baseline_ms=baseline.ms if baseline else None, goal=g_,
                                         extra={"version": version, "idea": k5.VERSIONS[version]})
                        fig.extra["us_per_step"] = 1e3 * fig.ms / shape["T"]
                        figures.append(fig)
                    except Exception as exc:  # noqa: BLE001 - one failing version must not hide the others
                        print(f"lstm bench: {name} failed: {type(exc).__name__}: {str(exc)[:400]}",
                              file=sys.stderr)
    return figures
