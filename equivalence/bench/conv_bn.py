"""conv_bn speed goal (issue 4): eval, bf16 channels_last, N=32, 128 -> 256 channels, 64x64,
3x3 pad 1: Triton (BN folded, implicit GEMM) >= 0.75x eager Conv2d + BatchNorm2d (cuDNN).
Training mode (forward, and forward+backward) is reported without a goal."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import levels
from equivalence import specs

from . import Figure
from ..timing import time_first_call, time_fn


def figure(component, name, level, dtype, shape, fn, device, *, flops=None, nbytes=None,
           baseline=None, baseline_ms=None, goal=None, notes="", extra=None) -> Figure:
    """Time `fn` (first call separately, then steady state) and build a Figure."""
    first_ms = time_first_call(fn, device)
    t = time_fn(fn, device)
    ratio = baseline_ms / t.median_ms if baseline_ms else None
    return Figure(component=component, name=name, level=level,
                  dtype=str(dtype).replace("torch.", ""), shape=dict(shape), ms=t.median_ms,
                  spread_ms=(t.p20_ms, t.p80_ms),
                  tflops=flops / (t.median_ms * 1e-3) / 1e12 if flops else None,
                  tbps=nbytes / (t.median_ms * 1e-3) / 1e12 if nbytes else None,
                  baseline=baseline, baseline_ms=baseline_ms, ratio=ratio, goal=goal,
                  met=(ratio >= goal) if (goal is not None and ratio is not None) else None,
                  notes=notes, extra={"first_call_ms": first_ms, "runs": t.runs} | (extra or {}))


def needs_cuda(device) -> str | None:
    if torch.device(device).type != "cuda":
        return "the Level 4 speed goals are H100 figures: needs a CUDA GPU"
    return None


unavailable_reason = needs_cuda


def run(device) -> list:
    device = torch.device(device)
    spec = specs.get("conv_bn")
    shape = spec.sizes["bench"]
    dtype = torch.bfloat16
    a = spec.module.make_args(shape, dtype, device, torch.Generator().manual_seed(0))
    flops = spec.flops(a)
    shp = {k: shape[k] for k in ("N", "C_in", "H", "W", "C_out", "k", "stride", "padding")}
    shp["layout"] = "channels_last"
    tri = levels.get("triton")

    def eager(training):
        rm, rv = a["running_mean"].clone(), a["running_var"].clone()

        def go(x=a["x"], w=a["conv_weight"], b=a["conv_bias"], g=a["bn_weight"], be=a["bn_bias"]):
            y = F.conv2d(x, w, b, stride=a["stride"], padding=a["padding"])
            return F.batch_norm(y, rm, rv, g, be, training=training, momentum=a["momentum"],
                                eps=a["eps"])
        return go

    def ours(training):
        rm, rv = a["running_mean"].clone(), a["running_var"].clone()

        def go(x=a["x"], w=a["conv_weight"], b=a["conv_bias"], g=a["bn_weight"], be=a["bn_bias"]):
            return tri.conv_bn(x, w, b, g, be, rm, rv, a["stride"], a["padding"], a["eps"],
                               a["momentum"], training)
        return go

    figs = []
    with torch.no_grad():
        for training, goal in ((False, 0.75), (True, None)):
            mode = "train" if training else "eval"
            base = figure("conv_bn", f"forward {mode}", "native", dtype, shp, eager(training), device,
                          flops=flops["fwd"], notes="eager F.conv2d (cuDNN) + F.batch_norm")
            figs.append(figure("conv_bn", f"forward {mode}", "triton", dtype, shp, ours(training),
                               device, flops=flops["fwd"],
                               baseline="eager Conv2d+BatchNorm2d (cuDNN)", baseline_ms=base.ms,
                               goal=goal))
            figs.append(base)
    leaves = {k: a[k].detach().requires_grad_(True)
              for k in ("x", "conv_weight", "conv_bias", "bn_weight", "bn_bias")}
    dy = torch.randn(a["x"].shape[0], shape["C_out"], shape["H"], shape["W"], device=device,
                     dtype=dtype).to(memory_format=torch.channels_last)

    def step(make):
        fn = make(True)

        def go():
            out = fn(**{"x": leaves["x"], "w": leaves["conv_weight"], "b": leaves["conv_bias"],
                        "g": leaves["bn_weight"], "be": leaves["bn_bias"]})
            torch.autograd.grad(out, list(leaves.values()), dy)
        return go

    base = figure("conv_bn", "forward+backward train", "native", dtype, shp, step(eager), device,
                  flops=flops["fwd"] + flops["bwd"], notes="eager cuDNN conv + BN, autograd")
    figs.append(figure("conv_bn", "forward+backward train", "triton", dtype, shp, step(ours),
                       device, flops=flops["fwd"] + flops["bwd"],
                       baseline="eager Conv2d+BatchNorm2d (cuDNN)", baseline_ms=base.ms))
    figs.append(base)
    return figs
