"""mlp speed goal (issue 4): bf16, M=8192, 4096 -> 16384 -> 4096, Triton >= 1.0x eager
PyTorch (cuBLAS GEMMs with the bias, GELU as its own kernel). Forward is the goal; forward
+ backward is reported against the same baseline."""

from __future__ import annotations

import torch

import levels
from equivalence import specs

from . import figure



def run(device) -> list:
    device = torch.device(device)
    spec = specs.get("mlp")
    shape = spec.sizes["bench"]
    dtype = torch.bfloat16
    args = spec.module.make_args(shape, dtype, device, torch.Generator().manual_seed(0))
    flops = spec.flops(args)
    names = ("x", "w1", "b1", "w2", "b2")
    shp = {"M": args["x"].shape[0], "K": shape["K"], "hidden": shape["hidden"], "N": shape["N"]}
    triton_level, native = levels.get("triton"), levels.get("native")
    figs = []
    tensors = [args[n] for n in names]
    with torch.no_grad():
        eager = figure("mlp", "forward", "native", dtype, shp, lambda: native.mlp(*tensors), device,
                       flops=flops["fwd"], notes="eager: cuBLAS addmm + GELU kernel + addmm")
        figs.append(figure("mlp", "forward", "triton", dtype, shp,
                           lambda: triton_level.mlp(*tensors), device, flops=flops["fwd"],
                           baseline="eager PyTorch (cuBLAS + GELU)", baseline_ms=eager.ms, goal=1.0))
        figs.append(eager)
    leaves = [t.detach().requires_grad_(True) for t in tensors]
    dy = torch.randn((shp["M"], shp["N"]), device=device, dtype=dtype)

    def step(fn):
        def go():
            out = fn(*leaves)
            torch.autograd.grad(out, leaves, dy)
        return go

    eager_fb = figure("mlp", "forward+backward", "native", dtype, shp, step(native.mlp), device,
                      flops=flops["fwd"] + flops["bwd"], notes="eager: cuBLAS + GELU, autograd")
    figs.append(figure("mlp", "forward+backward", "triton", dtype, shp, step(triton_level.mlp),
                       device, flops=flops["fwd"] + flops["bwd"],
                       baseline="eager PyTorch (cuBLAS + GELU)", baseline_ms=eager_fb.ms, goal=1.0))
    figs.append(eager_fb)
    return figs
