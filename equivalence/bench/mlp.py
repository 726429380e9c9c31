"""mlp speed goal (issue 4): bf16, M=8192, 4096 -> 16384 -> 4096, Triton >= 1.0x eager
PyTorch (cuBLAS GEMMs with the bias, GELU as its own kernel). Forward is the goal; forward
+ backward is reported against the same baseline.

The forward is also swept over GEMM tile configs pinned with gemm.CONFIG_OVERRIDE —
figures named "forward sweep", no goal — so the choice of autotune candidates rests on
measurements (SPLIT_N=2: the epilogue works on half a tile at a time, fewer registers)."""

from __future__ import annotations

import sys

import torch

import levels
from equivalence import specs

from . import figure

SWEEP = (  # (BLOCK_M, BLOCK_N, num_stages, SPLIT_N); BLOCK_K=64, 8 warps, GROUP_M=8
    (128, 128, 3, 1), (128, 128, 4, 1), (128, 256, 3, 1), (128, 256, 3, 2), (256, 128, 3, 2),
    (128, 256, 4, 2))


def _sweep(ours, flops, dtype, shp, device, eager_ms) -> list:
    import triton_kernels.gemm as gemm

    reference = ours()
    figs = []
    for bm, bn, stages, split in SWEEP:
        gemm.CONFIG_OVERRIDE = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=64, GROUP_M=8, SPLIT_N=split,
                                    num_warps=8, num_stages=stages)
        try:
            err = float((ours().float() - reference.float()).norm() / reference.float().norm())
            figs.append(figure("mlp", f"forward sweep {bm}x{bn}x64 stages={stages} split={split}",
                               "triton", dtype, shp, ours, device, flops=flops,
                               baseline="eager PyTorch (cuBLAS + GELU)", baseline_ms=eager_ms,
                               extra={"rel_diff_vs_autotuned": err}))
        except Exception as exc:  # e.g. out of shared memory: a measured "does not fit"
            print(f"mlp sweep {bm}x{bn} stages={stages} split={split} failed: "
                  f"{type(exc).__name__}: {str(exc)[:300]}", file=sys.stderr)
        finally:
            gemm.CONFIG_OVERRIDE = None
    return figs



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
        figs += _sweep(lambda: triton_level.mlp(*tensors), flops["fwd"], dtype, shp, device,
                       eager.ms)
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
