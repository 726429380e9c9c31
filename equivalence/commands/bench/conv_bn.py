"""conv_bn speed goals, eval, bf16 channels_last, N=32, 128 -> 256 channels, 64x64, 3x3 pad 1:
Triton (BN folded, implicit GEMM) >= 0.75x eager Conv2d + BatchNorm2d (cuDNN);
Level 5 CUDA, best version >= 0.6x the same baseline, every version of
cuda_kernels/conv_bn.cu timed side by side in the same run (v1 is skipped where one call
takes more than a second), plus a ResNet-50 1x1 256 -> 512, 28x28, batch 8 figure.
Training mode (forward, and forward+backward) is reported without a goal."""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

import levels
from ... import cards

from .goals import Figure, figure



def run(device) -> list:
    device = torch.device(device)
    card = cards.get("conv_bn")
    shape = card.sizes["bench"]
    dtype = torch.bfloat16
    a = card.module.make_args(shape, dtype, device, torch.Generator().manual_seed(0))
    flops = card.flops(a)
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
    figs += run_cuda(device)
    return figs


# ---------------------------------------------------------------------------------------
# Level 5 (CUDA): every version of the convolution, against cuDNN timed in the same run.
# ---------------------------------------------------------------------------------------

CUDA_GOAL = 0.6  # eval bf16 at the bench shape, best version vs eager cuDNN conv+BN
SLOW_CALL_S = 1.0  # a version slower than this per call is skipped at that shape (v1)

RESNET50_1X1 = dict(N=8, C_in=256, H=28, W=28, C_out=512, k=1, stride=1, padding=0,
                    channels_last=True)


def run_cuda(device) -> list:
    """Level 5 figures; none (and no error) where Level 5 cannot run here."""
    if levels.status("cuda", device, "conv_bn"):
        return []
    from cuda_kernels import conv_bn as kernels

    card = cards.get("conv_bn")
    figs = []
    for label, shape, goal in (("", card.sizes["bench"], CUDA_GOAL),
                               (" resnet50 1x1", RESNET50_1X1, None)):
        figs += _cuda_eval_versions(kernels, card, shape, device, label, goal)
    figs += _cuda_train(kernels, card, device)
    return figs


def _shape_of(shape):
    shp = {k: shape[k] for k in ("N", "C_in", "H", "W", "C_out", "k", "stride", "padding")}
    shp["layout"] = "channels_last"
    return shp


def _cuda_eval_versions(kernels, card, shape, device, label, goal) -> list:
    dtype = torch.bfloat16
    a = card.module.make_args(shape, dtype, device, torch.Generator().manual_seed(0))
    flops = card.flops(a)["fwd"]
    stride, padding = (a["stride"],) * 2, (a["padding"],) * 2
    name = f"forward eval{label}"

    def eager():
        y = F.conv2d(a["x"], a["conv_weight"], a["conv_bias"], stride=stride, padding=padding)
        return F.batch_norm(y, a["running_mean"], a["running_var"], a["bn_weight"], a["bn_bias"],
                            training=False, eps=a["eps"])

    def ours(version):
        def go():
            return kernels.conv_bn(a["x"], a["conv_weight"], a["conv_bias"], a["bn_weight"],
                                   a["bn_bias"], a["running_mean"], a["running_var"], stride,
                                   padding, a["eps"], a["momentum"], False, version=version)
        return go

    figs = []
    with torch.no_grad():
        ours(kernels.DEFAULT_VERSION)()  # builds the library outside any timing
        base = figure("conv_bn", name, "native", dtype, _shape_of(shape), eager, device,
                      flops=flops, notes="eager F.conv2d (cuDNN) + F.batch_norm")
        best = None
        for version, idea in sorted(kernels.VERSIONS.items()):
            torch.cuda.synchronize(device)
            start = time.perf_counter()
            ours(version)()
            torch.cuda.synchronize(device)
            once_s = time.perf_counter() - start
            if once_s > SLOW_CALL_S:
                figs.append(Figure(component="conv_bn", name=name, level="cuda", dtype="bfloat16",
                                   shape=_shape_of(shape) | {"version": version}, ms=once_s * 1e3,
                                   spread_ms=(once_s * 1e3, once_s * 1e3), notes=(
                                       f"v{version} ({idea}) not timed: one call took {once_s:.1f} s "
                                       f"(> {SLOW_CALL_S:g} s); the figure is that single call")))
                continue
            f = figure("conv_bn", name, "cuda", dtype, _shape_of(shape) | {"version": version},
                       ours(version), device, flops=flops,
                       baseline="eager Conv2d+BatchNorm2d (cuDNN)", baseline_ms=base.ms,
                       notes=f"v{version}: {idea}")
            figs.append(f)
            if best is None or f.ms < best.ms:
                best = f
        if best is not None and goal is not None:
            best.goal, best.met = goal, best.ratio >= goal
            best.notes += f" (best version; goal >= {goal:g}x cuDNN)"
        figs.append(base)
    return figs


def _cuda_train(kernels, card, device) -> list:
    """Training mode at the bench shape, every tensor-core version (their backwards differ:
    version 3 runs the v2 tiled CUDA-core dgrad/wgrad, version 4 tensor-core ones) and the
    default: forward, and forward+backward."""
    shape = card.sizes["bench"]
    dtype = torch.bfloat16
    a = card.module.make_args(shape, dtype, device, torch.Generator().manual_seed(0))
    fl = card.flops(a)
    stride, padding = (a["stride"],) * 2, (a["padding"],) * 2
    rm, rv = a["running_mean"].clone(), a["running_var"].clone()
    leaves = {k: a[k].detach().requires_grad_(True)
              for k in ("x", "conv_weight", "conv_bias", "bn_weight", "bn_bias")}
    dy = torch.randn(shape["N"], shape["C_out"], shape["H"], shape["W"], device=device,
                     dtype=dtype).to(memory_format=torch.channels_last)

    def fwd(p, v):
        return kernels.conv_bn(p["x"], p["conv_weight"], p["conv_bias"], p["bn_weight"],
                               p["bn_bias"], rm, rv, stride, padding, a["eps"], a["momentum"], True,
                               version=v)

    def eager(p):
        y = F.conv2d(p["x"], p["conv_weight"], p["conv_bias"], stride=stride, padding=padding)
        return F.batch_norm(y, rm, rv, p["bn_weight"], p["bn_bias"], training=True,
                            momentum=a["momentum"], eps=a["eps"])

    def step(fn):
        def go():
            torch.autograd.grad(fn(leaves), list(leaves.values()), dy)
        return go

    chosen = sorted(set(getattr(kernels, "TENSOR_CORE_VERSIONS", ())) | {kernels.DEFAULT_VERSION})
    with torch.no_grad():
        base = figure("conv_bn", "forward train", "native", dtype, _shape_of(shape),
                      lambda: eager(a), device, flops=fl["fwd"], notes="eager cuDNN conv + BN")
        figs = [figure("conv_bn", "forward train", "cuda", dtype, _shape_of(shape) | {"version": v},
                       lambda v=v: fwd(a, v), device, flops=fl["fwd"],
                       baseline="eager Conv2d+BatchNorm2d (cuDNN)", baseline_ms=base.ms,
                       notes=f"v{v}; fp32 y, two-stage statistics, affine pass") for v in chosen]
        figs.append(base)
    base = figure("conv_bn", "forward+backward train", "native", dtype, _shape_of(shape),
                  step(eager), device, flops=fl["fwd"] + fl["bwd"],
                  notes="eager cuDNN conv + BN, autograd")
    figs += [figure("conv_bn", "forward+backward train", "cuda", dtype,
                    _shape_of(shape) | {"version": v}, step(lambda p, v=v: fwd(p, v)), device,
                    flops=fl["fwd"] + fl["bwd"], baseline="eager Conv2d+BatchNorm2d (cuDNN)",
                    baseline_ms=base.ms, notes=f"v{v}: {kernels.VERSIONS[v]}") for v in chosen]
    figs.append(base)
    return figs
