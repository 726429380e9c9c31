"""conv_bn speed goal (issue 4): eval, bf16 channels_last, N=32, 128 -> 256 channels, 64x64,
3x3 pad 1: Triton (BN folded, implicit GEMM) >= 0.75x eager Conv2d + BatchNorm2d (cuDNN).
Training mode (forward, and forward+backward) is reported without a goal."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import levels
from equivalence import specs

from . import figure



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
